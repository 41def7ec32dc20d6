"""An imported pool replays closed loop in the simulator and through the validated-mode driver."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from rackSim.config import compose_scenario
from rackSim.config.specs import WorkloadSpec
from rackSim.run import simulate
from rackSim.validate.driver import DriverSettings, run_driver
from rackSim.validate.recording import read_record_rows
from rackSim.workload.command import main
from rackSim.workload.sources import load_sessions

FIXTURES = Path(__file__).parent / "fixtures" / "agent_logs"


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pool") / "pool.jsonl"
    assert main(["import", str(FIXTURES / "claude_code"), "--out", str(out)]) == 0
    return out


def test_simulator_replays_the_imported_pool(pool):
    cfg = compose_scenario(["experiment=smoke", "workload=imported_logs",
                            f"workload.path={pool}", "workload.replay.concurrency=8",
                            "workload.replay.window_s=20", "progress=false"])
    graphs = {g.session_id: g for g in load_sessions(cfg.workload, cfg.seed)}
    result = simulate(cfg)
    req = result.requests
    done = req[req["phase"] == "window"]
    assert len(done) > 20 and result.summary["throughput_tok_s_gpu"] > 0
    assert set(req["session_id"]) == set(graphs)            # s00000 and s00001, nothing else
    replayed = req[req["phase"] != "primer"]
    want = [graphs[s].requests[r].prompt_tokens for s, r in zip(replayed["session_id"],
                                                                 replayed["rid"], strict=True)]
    assert replayed["prompt_tokens"].tolist() == want


def test_imported_logs_scenario_needs_a_path():
    with pytest.raises(ValueError, match=r"path: source 'jsonl' reads a session-graph pool "
                                         r"\(JSONL; `racksim-workload import` makes one from "
                                         r"agent logs\); give it with workload.path=FILE"):
        compose_scenario(["workload=imported_logs"])


class _FakeVllm(http.server.BaseHTTPRequestHandler):
    """Just enough of vLLM's HTTP API for the driver: a model card, a metrics page, and
    streamed completions that emit `max_tokens` token ids."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "fake", "max_model_len": 65_536}]}).encode()
        elif self.path == "/metrics":
            body = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(req["max_tokens"]):
            self.wfile.write(b'data: {"choices": [{"token_ids": [7], "text": "x"}]}\n\n')
        usage = {"prompt_tokens": len(req["prompt"]), "completion_tokens": req["max_tokens"]}
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


def test_validated_mode_driver_replays_the_imported_pool(pool, tmp_path):
    spec = WorkloadSpec.model_validate({
        "name": "imported", "source": "jsonl", "path": str(pool),
        # both lanes from their session's first turn: the 6 s see turns before the pool's
        # 32 s compaction delay, where a lane started mid-session may sit through it
        "replay": {"concurrency": 2, "start": "fresh", "primer": True,
                   "warmup_requests_per_lane": 1, "window_s": 3.0, "drain_s": 0}})
    sessions = load_sessions(spec, 0)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeVllm)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        out = run_driver(sessions, DriverSettings(
            endpoints=[f"http://127.0.0.1:{srv.server_port}"], replay=spec.replay,
            max_duration_s=6.0), tmp_path / "run")   # the pool's 32 s compaction delay
    finally:
        srv.shutdown()
        srv.server_close()
    assert out.stop_reason in ("window", "max_duration")
    rows = read_record_rows(tmp_path / "run" / "records.jsonl")
    assert rows and all(r["error"] is None for r in rows)
    graphs = {g.session_id: g for g in sessions}
    assert sum(r["phase"] != "primer" for r in rows) >= 6
    for r in rows:
        spec_r = graphs[r["session_id"]].requests[r["rid"]]
        if r["phase"] != "primer":
            assert (r["prompt_tokens"], r["output_tokens"]) == \
                (spec_r.prompt_tokens, spec_r.output_tokens)
