"""An imported agent-log pool replays on a real vLLM server: the driver sends every call of
the pool's sessions with its prompt length and output, and the server's prefix cache sees the
reuse the logs imply. (The simulator side is tests/workload/test_agent_logs_replay.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from rackSim.config.specs import WorkloadSpec
from rackSim.validate.driver import DriverSettings, run_driver
from rackSim.validate.recording import read_record_rows
from rackSim.validate.server import ServerSettings, start_server
from rackSim.workload.command import main as workload_main
from rackSim.workload.sources import load_sessions

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).parents[1] / "workload" / "fixtures" / "agent_logs" / "claude_code"


@pytest.fixture(scope="module")
def long_context_server(tmp_path_factory):
    """A server of its own with 32K positions: coding-agent prompts are 14-22K tokens, and the
    shared test server keeps the shape the other tests measure."""
    server = start_server(tmp_path_factory.mktemp("vllm-long"),
                          ServerSettings(max_model_len=32768))
    try:
        yield server
    finally:
        server.stop()


def test_imported_pool_replays_on_a_real_server(long_context_server, tmp_path):
    vllm_server = long_context_server
    pool = tmp_path / "pool.jsonl"
    assert workload_main(["import", str(FIXTURES), "--out", str(pool)]) == 0
    spec = WorkloadSpec.model_validate({
        "name": "imported", "source": "jsonl", "path": str(pool),
        "replay": {"concurrency": 2, "primer": True, "warmup_requests_per_lane": 1,
                   "window_s": 15.0, "drain_s": 0}})
    sessions = load_sessions(spec, 0)
    out = run_driver(sessions, DriverSettings(endpoints=[vllm_server.url], replay=spec.replay,
                                              max_duration_s=120.0), tmp_path / "run")
    rows = read_record_rows(out.records_path)
    assert out.failed == 0 and len(rows) >= 8
    graphs = {g.session_id: g for g in sessions}
    for r in rows:
        want = graphs[r["session_id"]].requests[r["rid"]]
        assert r["prompt_tokens"] == want.prompt_tokens
        assert r["output_tokens"] == (1 if r["phase"] == "primer" else want.output_tokens)
    # coding-agent prompts: long, and mostly served from the server's prefix cache
    assert max(r["prompt_tokens"] for r in rows) > 10_000
    later = [r for r in rows if r["phase"] != "primer" and r["rid"] > 0]
    assert sum(r["cached_tokens"] for r in later) > 0.3 * sum(r["prompt_tokens"] for r in later)
