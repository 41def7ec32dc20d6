"""The columnar step log: rows back in order across packed blocks, the table's types, and
equality that treats NaN (balancedness not modelled) as equal to itself."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rackSim.metrics.records import STEP_COLUMNS, StepLog, step_row
from rackSim.metrics.summary import steps_frame
from rackSim.perf.step import StepBreakdown


def _rows(n: int) -> list[tuple]:
    names = ["prefill-0", "decode", "prefill-1"]
    return [step_row(names[i % 3], i, 0.5 * i, StepBreakdown(moe=1.0 + i, cpu=0.25), i % 2,
                     64 * i, 3, 3.25 * i, 1e6 + i, i % 4, math.nan if i % 2 else 0.9)
            for i in range(n)]


def test_rows_come_back_in_order_across_blocks():
    log = StepLog(chunk=3)
    rows = _rows(8)
    for r in rows:
        log.append(r)
    assert len(log) == 8 and len(log._blocks) == 2  # two packed blocks + two rows pending
    back = list(log)
    assert [b[0] for b in back] == [r[0] for r in rows]
    for b, r in zip(back, rows, strict=True):
        assert np.allclose(b[1:], r[1:], equal_nan=True)
    log.append(rows[0])  # appending after reading goes on
    assert len(log) == 9 and list(log)[-1][0] == "prefill-0"


def test_frame_is_the_step_table():
    log = StepLog(chunk=5)
    for r in _rows(7):
        log.append(r)
    df = steps_frame(log)
    assert list(df.columns) == list(STEP_COLUMNS)
    ref = pd.DataFrame.from_records(_rows(7), columns=list(STEP_COLUMNS))
    pd.testing.assert_frame_equal(df, ref, check_dtype=False)
    assert df["step"].dtype == np.int64 and df["instance"].tolist()[:3] == [
        "prefill-0", "decode", "prefill-1"]
    assert steps_frame(StepLog()).empty


def test_equal_logs_with_nan_are_equal():
    a, b, c = StepLog(chunk=2), StepLog(chunk=4), StepLog()
    for r in _rows(5):
        a.append(r)
        b.append(r)
        c.append(r)
    assert a == b == c
    c.append(_rows(6)[-1])
    assert a != c
