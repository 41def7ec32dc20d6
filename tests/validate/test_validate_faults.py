"""Faults between the driver and a REAL vLLM server, injected by a proxy (fault_proxy).

Each failure must be recorded against its request (kind prefix + the tokens received before
it), the run must continue or stop by the stated policy, nothing recorded may be lost, and a
stopped run must resume by re-sending exactly the requests that lack a successful record.
"""

from __future__ import annotations

from collections import Counter

import pytest
from fault_proxy import Fault, FaultProxy

from rackSim.validate.driver import DriverSettings, run_driver
from rackSim.validate.faults import ErrorPolicy, error_kind
from rackSim.validate.recording import read_record_rows
from rackSim.validate.workloads import cpu_tiny_workload
from rackSim.workload.sources import load_sessions

pytestmark = pytest.mark.slow


def _drive(url: str, out, window_s: float = 6.0, endpoints: list[str] | None = None, **kw):
    wl = cpu_tiny_workload(2, window_s=window_s, warmup=1, num_sessions=8)
    sessions = load_sessions(wl, 11)
    # no drift probe: faults are injected by request number and counted against records
    return run_driver(sessions, DriverSettings(endpoints=endpoints or [url], replay=wl.replay,
                                               seed=11, probe=False, **kw), out)


@pytest.fixture
def proxy(vllm_server, request):
    p = FaultProxy(vllm_server.url, request.param)
    yield p
    p.close()


@pytest.mark.parametrize("proxy", [lambda n: Fault("reset", after_bytes=6000)
                                   if n % 3 == 0 else None], indirect=True)
def test_reset_mid_stream_is_recorded_and_run_continues(proxy, tmp_path):
    out = _drive(proxy.url, tmp_path, policy=ErrorPolicy(max_errors=1000))
    rows = read_record_rows(out.records_path)
    assert out.stop_reason == "window"
    assert len(rows) == out.sent  # every request sent has its line
    failed = [r for r in rows if r["error"] is not None]
    assert len(failed) == len(proxy.injected) == out.failed > 0
    for r in failed:
        assert error_kind(r["error"]) in ("reset", "truncated"), r["error"]
        # the stream was cut after some tokens had arrived: they are kept
        assert r["output_tokens"] == len(r["token_times_s"])
    assert any(r["output_tokens"] > 0 for r in failed)
    assert sum(r["error"] is None for r in rows) >= 2 * len(failed) - 2


@pytest.mark.parametrize("proxy", [lambda n: Fault("http_500") if n % 4 == 0 else
                                   Fault("http_429") if n % 4 == 1 else None], indirect=True)
def test_http_errors_are_recorded(proxy, tmp_path):
    out = _drive(proxy.url, tmp_path, policy=ErrorPolicy(max_errors=1000))
    rows = read_record_rows(out.records_path)
    kinds = Counter(r["error"].split()[1] for r in rows if r["error"])
    assert set(kinds) == {"500", "429"}
    assert sum(kinds.values()) == len(proxy.injected)
    assert all(r["output_tokens"] == 0 for r in rows if r["error"])


@pytest.mark.parametrize("proxy", [lambda n: Fault("stall", after_bytes=6000, stall_s=4.0)
                                   if n == 3 else None], indirect=True)
def test_stalled_stream_times_out(proxy, tmp_path):
    out = _drive(proxy.url, tmp_path, policy=ErrorPolicy(max_errors=5, read_timeout_s=1.0))
    rows = read_record_rows(out.records_path)
    failed = [r for r in rows if r["error"]]
    assert len(failed) == 1 and error_kind(failed[0]["error"]) == "timeout"
    r = failed[0]
    assert r["finish_s"] - r["send_s"] >= 1.0  # it waited out the read timeout
    assert out.stop_reason == "window"


@pytest.mark.parametrize("proxy", [lambda n: Fault("http_500") if n >= 4 else None],
                         indirect=True)
def test_max_errors_stops_then_resume_completes(proxy, vllm_server, tmp_path):
    out = _drive(proxy.url, tmp_path, policy=ErrorPolicy(max_errors=2))
    assert out.stop_reason == "max_errors"
    first = read_record_rows(out.records_path)
    assert len(first) == out.sent and out.failed >= 3
    ok_keys = {r["key"] for r in first if r["error"] is None}
    failed_keys = {r["key"] for r in first if r["error"] is not None}
    # resume against the server directly: the failed requests are sent again, done ones not
    out2 = _drive(vllm_server.url, tmp_path, resume=True, policy=ErrorPolicy(max_errors=0))
    rows = read_record_rows(out2.records_path)
    assert rows[: len(first)] == first  # nothing recorded before was lost or rewritten
    new = rows[len(first):]
    assert out2.skipped == len(ok_keys)
    assert not ({r["key"] for r in new} & ok_keys)
    assert failed_keys <= {r["key"] for r in new if r["error"] is None}
    assert all(r["send_s"] > max(x["finish_s"] for x in first) for r in new)
    done = Counter(r["key"] for r in rows if r["error"] is None)
    assert max(done.values()) == 1  # no request succeeded twice
    assert out2.stop_reason == "window"


@pytest.mark.parametrize("proxy", [lambda n: None], indirect=True)
def test_two_endpoints_split_lanes(proxy, vllm_server, tmp_path):
    """Lane i goes to endpoint i mod 2 (here the server directly and through the proxy)."""
    out = _drive(vllm_server.url, tmp_path, endpoints=[vllm_server.url, proxy.url])
    rows = read_record_rows(out.records_path)
    by_lane = {(r["lane"], r["endpoint"]) for r in rows}
    assert by_lane == {(0, vllm_server.url), (1, proxy.url)}
    assert out.failed == 0 and proxy.completions == sum(r["lane"] == 1 for r in rows)
