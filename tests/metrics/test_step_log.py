"""The columnar step log: rows back in order across packed blocks, the table's types, and
equality that treats NaN (balancedness not modelled) as equal to itself."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rackSim.metrics.records import STEP_COLUMNS, StepLog
from rackSim.metrics.summary import steps_frame
from rackSim.perf.step import StepBreakdown

NAMES = ["prefill-0", "decode", "prefill-1"]


class _Model:
    """A step model that tracks expert-load balance (its value changes with every step)."""

    last_balancedness = math.nan


def _write(log: StepLog, n: int, first: int = 0) -> list[tuple]:
    """Write steps first..n-1 round-robin through one writer per instance of NAMES (each
    instance's model reports balancedness, NaN on odd steps); returns the rows expected."""
    model = _Model()
    writers = getattr(log, "_test_writers", None)
    if writers is None:
        writers = log._test_writers = [log.writer(name, model) for name in NAMES]
    rows = []
    for i in range(first, n):
        model.last_balancedness = math.nan if i % 2 else 0.9
        cost = StepBreakdown(moe=1.0 + i, cpu=0.25)
        writers[i % 3](i, 0.5 * i, cost, cost.total_ms, i % 2, 64 * i, 3, 3.25 * i, 1e6 + i,
                       i % 4)
        rows.append((NAMES[i % 3], i, 0.5 * i, cost.total_ms, i % 2, 64 * i, 3, 3.25 * i,
                     1e6 + i, i % 4, model.last_balancedness, cost.moe, cost.attention,
                     cost.indexer, cost.dense, cost.comm, cost.draft, cost.cpu, cost.sync,
                     cost.straggler, cost.kv_stall))
    return rows


def test_rows_come_back_in_order_across_blocks():
    log = StepLog(chunk=3)
    rows = _write(log, 8)
    assert len(log) == 8 and len(log._blocks) == 2  # two packed blocks + two rows pending
    back = list(log)
    assert [b[0] for b in back] == [r[0] for r in rows]
    for b, r in zip(back, rows, strict=True):
        assert np.allclose(b[1:], r[1:], equal_nan=True)
    _write(log, 9, first=8)  # writing after reading goes on
    assert len(log) == 9 and list(log)[-1][0] == "prefill-1"


def test_frame_is_the_step_table():
    log = StepLog(chunk=5)
    rows = _write(log, 7)
    df = steps_frame(log)
    assert list(df.columns) == list(STEP_COLUMNS)
    ref = pd.DataFrame.from_records(rows, columns=list(STEP_COLUMNS))
    pd.testing.assert_frame_equal(df, ref, check_dtype=False)
    assert df["step"].dtype == np.int64 and df["instance"].tolist()[:3] == NAMES
    assert steps_frame(StepLog()).empty


def test_a_model_without_balancedness_writes_nan():
    log = StepLog()
    log.writer("prefill-0", object())(1, 0.0, StepBreakdown(moe=2.0), 2.0, 1, 64, 0, 0.0, 64.0,
                                      0)
    assert math.isnan(log.frame()["balancedness"].iloc[0])


def test_equal_logs_with_nan_are_equal():
    a, b, c = StepLog(chunk=2), StepLog(chunk=4), StepLog()
    for log in (a, b, c):
        _write(log, 5)
    assert a == b == c
    _write(c, 6, first=5)
    assert a != c
