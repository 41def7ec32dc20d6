"""Helpers for the slow validate tests: the measured runs against the shared real server.

Each run is isolated in the server log by byte offsets so its iteration lines can be ingested
on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rackSim.validate.driver import DriverOutcome, DriverSettings, run_driver
from rackSim.validate.server import VllmServer
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


def measure(server: VllmServer, concurrency: int, out: Path, window_s: float = WINDOW_S,
            seed: int = SEED, **settings) -> MeasuredRun:
    """Replay the CPU workload at `concurrency` against `server` into `out`."""
    wl = cpu_tiny_workload(concurrency, window_s=window_s)
    sessions = load_sessions(wl, seed)
    outcome = run_driver(sessions, DriverSettings(endpoints=[server.url], replay=wl.replay,
                                                  seed=seed, server_log=server.log_path,
                                                  **settings), out)
    log = outcome.meta["server_log"][-1]  # this run's bytes, the drift probes excluded
    return MeasuredRun(concurrency, outcome, sessions, server.log_path, log["start_byte"],
                       log["end_byte"], seed)
