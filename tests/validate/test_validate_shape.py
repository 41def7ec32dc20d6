"""The server's shape is read, not assumed: KV cache shape from /metrics, scheduler limits and
the vLLM version from the server log; changes and unknown log formats are named."""

from __future__ import annotations

import pytest

from rackSim.validate.ingest import read_iteration_log, server_args_from_log
from rackSim.validate.scrape import cache_shape, parse_metrics, shape_change

METRICS = """\
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",engine="0",\
num_gpu_blocks="8192",kv_cache_size_tokens="1048576"} 1.0
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7961e+09
"""

LOG = """\
(APIServer pid=1) INFO 12-01 09:25:29 [api_utils.py:286] non-default args: {'model': '/m', \
'max_model_len': 4096, 'served_model_name': ['tiny'], 'max_num_batched_tokens': 2048, \
'max_num_seqs': 64}
(EngineCore pid=2) INFO 12-01 09:25:57 [core.py:133] Initializing a V1 LLM engine (v0.32.0) \
with config: model='/m'
(EngineCore pid=2) INFO 12-01 09:27:00 [loggers.py:1] Engine 000: Iteration(5): 1 context \
requests, 100 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed \
time: 12.50 ms, CPU KV cache usage: 0.1%
"""


def test_cache_shape_from_metrics():
    shape = cache_shape(parse_metrics(METRICS))
    assert shape == {"block_tokens": 128, "kv_capacity_tokens": 128 * 8192,
                     "prefix_caching": True, "process_start_s": 1.7961e9}
    restarted = dict(shape, process_start_s=1.7962e9)
    assert shape_change(shape, shape) is None
    assert "process_start_s" in shape_change(shape, restarted)


def test_scheduler_limits_and_version_from_the_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG)
    assert server_args_from_log(log) == {"max_num_seqs": 64, "max_num_batched_tokens": 2048,
                                         "max_model_len": 4096, "vllm_version": "0.32.0"}
    assert server_args_from_log(log, end_byte=10) == {}  # before the server started
    assert len(read_iteration_log(log)) == 1


def test_an_iteration_log_of_another_format_is_named(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG.replace("Iteration(5): 1 context requests", "Iteration(5): prefill=1")
                   .replace("v0.32.0", "v0.40.1"))
    with pytest.raises(ValueError, match=r"vLLM 0\.40\.1.*follows vLLM 0\.32\.0.*--source"):
        read_iteration_log(log)


def _driver(tmp_path):
    from rackSim.validate.driver import DriverSettings, ReplayDriver
    from rackSim.validate.workloads import cpu_tiny_workload
    from rackSim.workload.sources import load_sessions

    wl = cpu_tiny_workload(2)
    return ReplayDriver(load_sessions(wl, 0), DriverSettings(endpoints=["http://x"],
                                                            replay=wl.replay), tmp_path)


def test_drift_is_the_probe_medians_change_beyond_the_limit(tmp_path):
    from rackSim.validate.driver import DRIFT_LIMIT

    d = _driver(tmp_path)
    d.probes = {"http://x": {"before": {"ttft_ms": 50.0, "tpot_ms": 4.0, "ok": 5},
                             "after": {"ttft_ms": 90.0, "tpot_ms": 4.2, "ok": 5}},
                "http://y": {"before": {"ttft_ms": 50.0, "tpot_ms": 4.0, "ok": 5},
                             "after": {"error": "connect: refused"}}}
    out = d.drift()
    assert out["http://x"]["change"] == pytest.approx({"ttft_ms": 0.8, "tpot_ms": 0.05})
    assert out["http://x"]["drifting"] and 0.8 > DRIFT_LIMIT > 0.05
    assert out["http://y"]["change"] == {} and not out["http://y"]["drifting"]


def test_run_needs_exactly_one_server_source(tmp_path, capsys):
    from rackSim.validate.command import EXIT_BAD_INPUT, main

    assert main(["run", "--out", str(tmp_path / "r")]) == EXIT_BAD_INPUT
    assert main(["run", "--out", str(tmp_path / "r"), "--endpoint", "http://x",
                 "--fresh-server"]) == EXIT_BAD_INPUT
    assert "--endpoint URL (a running server) or --fresh-server" in capsys.readouterr().err


def test_failures_are_counted_by_kind(tmp_path):
    from rackSim.metrics.records import RequestRecord
    from rackSim.validate.command import failure_kinds
    from rackSim.validate.recording import RecordWriter

    w = RecordWriter(tmp_path / "records.jsonl", fsync=False)
    for i, err in enumerate([None, "reset: peer closed", "timeout: 60 s", "reset: eof", None]):
        r = RequestRecord(session_id=0, rid=i, lane=0, session_key=0, agent="main",
                          send_s=0.0, prompt_tokens=10)
        r.error = err
        w.write(r, f"0:{i}:r", "http://x")
    w.close()
    assert failure_kinds(tmp_path / "records.jsonl") == "reset 2, timeout 1"


def test_serve_stops_its_server_on_sigterm(monkeypatch, capsys):
    """SIGTERM unwinds like Ctrl-C: the server `serve` started is stopped, not orphaned; it
    says where to run the driver (the CPUs its host processes were pinned to)."""
    import os
    import signal
    import threading

    import rackSim.validate.server as server_mod
    from rackSim.validate.command import main

    stopped = []

    class FakeProc:
        returncode = None

        def poll(self):
            return None

    class FakeServer:
        url, log_path, proc, host_cpus = "http://127.0.0.1:1", "server.log", FakeProc(), {1}

        def stop(self):
            stopped.append(True)

    def start(*_a, **_k):  # SIGTERM once the server is up (not while parsing the flags)
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return FakeServer()

    monkeypatch.setattr(server_mod, "start_server", start)
    previous = signal.getsignal(signal.SIGTERM)
    assert main(["serve", "--work-dir", "/tmp/unused"]) == 0
    assert stopped == [True]
    assert signal.getsignal(signal.SIGTERM) is previous  # the caller's handler is back
    assert "taskset -c 1 racksim-validate run" in capsys.readouterr().out
