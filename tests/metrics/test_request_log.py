"""The request log: records closed in any order come back in send order, by column and as
records, with the same table (values and types) as the list of records it replaces, before
and after packing."""

from __future__ import annotations

import math

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from rackSim.metrics.records import RequestLog, RequestRecord
from rackSim.metrics.summary import requests_frame


def _record(i: int) -> RequestRecord:
    rec = RequestRecord(session_id=f"s{i % 3}", rid=i, lane=i % 5, session_key=(i % 5) << 40,
                        agent=0, send_s=0.5 * i, prompt_tokens=1000 + i)
    if i % 4:  # finished: stage times, tokens, sometimes traced token times
        rec.cached_tokens, rec.output_tokens = 64 * i, 3
        rec.first_token_s, rec.finish_s = 0.5 * i + 0.2, 0.5 * i + 0.4
        rec.route = "single_rack" if i % 2 else "affinity+decode_remote"
        rec.token_times_s = [rec.first_token_s, rec.finish_s] if i % 3 == 0 else []
    if i % 7 == 0:
        rec.error = "cut"
    return rec


def _log(n: int, close_order: list[int], chunk: int) -> tuple[RequestLog, list[RequestRecord]]:
    log, recs = RequestLog(chunk=chunk), [_record(i) for i in range(n)]
    for r in recs:
        log.append(r)
    for i in close_order:
        log.close(recs[i])
    return log, recs


@given(st.integers(0, 40).flatmap(lambda n: st.tuples(
    st.just(n), st.permutations(range(n)), st.integers(0, n), st.integers(1, 7))))
def test_any_close_order_gives_the_list_table(drawn: tuple) -> None:
    n, order, closed, chunk = drawn
    log, recs = _log(n, order[:closed], chunk)
    assert len(log) == n
    pd.testing.assert_frame_equal(requests_frame(log), requests_frame(recs))
    assert [r.as_row() for r in log] == [r.as_row() for r in recs]  # NaN is the shared NAN


def test_packed_records_are_freed_and_rebuilt():
    log, recs = _log(10, [9, 2, 5, 0], chunk=2)
    assert sum(r is None for r in log._recs) == 4  # two packs of two
    assert log[5].as_row() == recs[5].as_row() and log[5] is not recs[5]
    assert log[1] is recs[1]  # open: the live record
    assert math.isnan(log[0].first_token_s) and log[0].first_token_s is recs[0].first_token_s
    assert log[9].token_times_s == recs[9].token_times_s == [4.7, 4.9]


def test_empty_log_is_an_empty_table():
    df = requests_frame(RequestLog())
    assert len(df) == 0 and list(df.columns[:3]) == ["session_id", "rid", "lane"]
