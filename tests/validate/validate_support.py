"""Helpers for the slow validate tests: the measured runs against the shared real server.

Each run is isolated in the server log by byte offsets so its iteration lines can be ingested
on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rackSim.validate.driver import DriverOutcome, DriverSettings, run_driver
from rackSim.validate.server import VllmServer, driver_on
from rackSim.validate.workloads import cpu_tiny_workload
from rackSim.workload.graph import SessionGraph
from rackSim.workload.sources import load_sessions

LOW, HIGH = 2, 6          # concurrency levels (lanes): fit on LOW, predict HIGH
WINDOW_S = 20.0           # measurement window per run (s)
SEED = 3


@dataclass
class MeasuredRun:
    """A driver run against the shared server and its slice of the server log (bytes)."""

    concurrency: int
    outcome: DriverOutcome
    sessions: list[SessionGraph]
    log_path: Path
    log_start: int
    log_end: int
    seed: int
    local_server: bool  # started by the tests (at --server-nice), not RACKSIM_VLLM_URL's


def measure(server: VllmServer, concurrency: int, out: Path, window_s: float = WINDOW_S,
            seed: int = SEED, **settings) -> MeasuredRun:
    """Replay the CPU workload at `concurrency` against `server` into `out` (the driver on the
    CPUs the server's host processes are pinned to)."""
    wl = cpu_tiny_workload(concurrency, window_s=window_s)
    sessions = load_sessions(wl, seed)
    with driver_on(server.host_cpus):
        outcome = run_driver(sessions, DriverSettings(endpoints=[server.url], replay=wl.replay,
                                                      seed=seed, server_log=server.log_path,
                                                      **settings), out)
    log = outcome.meta["server_log"][-1]  # this run's bytes, the drift probes excluded
    return MeasuredRun(concurrency, outcome, sessions, server.log_path, log["start_byte"],
                       log["end_byte"], seed, server.proc is not None)


def simulated_run_dir(d: Path, concurrency: int, seed: int, window_s: float = 15.0,
                      truth=None, iteration_log: bool = False) -> Path:
    """A run directory laid out exactly as `racksim-validate run` writes it, whose records
    come from the colocated model priced by `truth` (a Profile; default TRUE_PROFILE).
    `iteration_log`: also a server log whose iteration lines are the simulated steps (elapsed
    time without the between-steps overhead, as vLLM logs it), kept as the run's log range."""
    import json

    from rackSim.metrics.records import STEP_COLUMNS
    from rackSim.perf.measured import Profile, ServerShape
    from rackSim.validate.colocated import simulate_colocated
    from rackSim.validate.recording import RecordWriter

    truth = truth or Profile(coeffs=dict(TRUE_COEFFS), overhead_ms=1.0, api_overhead_ms=10.0,
                             server=ServerShape())
    wl = cpu_tiny_workload(concurrency, window_s=window_s)
    sim = simulate_colocated(load_sessions(wl, seed), wl.replay, truth, seed=seed)
    w = RecordWriter(d / "records.jsonl", fsync=False)
    for r in sim.records:
        w.write(r, f"{r.session_key}:{r.rid}:r", "sim")
    w.close()
    shape = truth.server
    log = []
    if iteration_log:
        # the log times the model step: the step's CPU part less the constant is the time
        # between steps and any intake stall (these truths have no jitter)
        assert not truth.step_jitter
        cpu, const = STEP_COLUMNS.index("cpu_ms"), truth.coeffs["const_ms"]
        path = d / "server.log"
        path.write_text("".join(
            f"INFO Engine 000: Iteration({row[1]}): {row[4]} context requests, {row[5]} context "
            f"tokens, {row[6]} generation requests, {int(row[7])} generation tokens, iteration "
            f"elapsed time: {row[3] - (row[cpu] - const):.3f} ms, CPU KV cache usage: 0.0%\n"
            for row in sim.steps))
        log = [{"path": str(path), "start_byte": 0, "end_byte": path.stat().st_size}]
    (d / "run.json").write_text(json.dumps({
        "server_log": log,
        "window_start_s": sim.window_start_s, "window_end_s": sim.window_end_s,
        "endpoints": [{"url": "http://x", "model": "tiny", "max_model_len": 4096,
                       "shape": {"block_tokens": shape.block_tokens,
                                 "kv_capacity_tokens": shape.kv_capacity_tokens,
                                 "prefix_caching": True, "process_start_s": 1.0}}],
        "scheduler": {"max_num_seqs": shape.max_num_seqs,
                      "max_num_batched_tokens": shape.max_num_batched_tokens,
                      "vllm_version": "0.32.0"}}))
    (d / "workload.json").write_text(json.dumps({"workload": json.loads(wl.model_dump_json()),
                                                 "seed": seed}))
    return d


TRUE_COEFFS = {"const_ms": 2.0, "per_prefill_token_ms": 0.02, "per_prefill_request_ms": 3.0,
               "per_decode_request_ms": 0.4, "per_context_token_ms": 0.0}
