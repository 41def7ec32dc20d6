"""Helpers of the sweep tests: run `racksim -m` on a small real sweep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CMD = [sys.executable, "-c", "from rackSim.cli import run; run()"]
BASE = ["experiment=smoke", "workload.replay.window_s=10", "progress=false"]
# 3 widths x 2 concurrencies; width 5 does not divide 384 experts, so 2 scenarios fail.
AXES = ["deployment.decode.gpus=4,8,5", "workload.replay.concurrency=32,64"]


def run_sweep(sweep_dir: Path, *args: str, timeout: float = 240,
              exit_code: int = 0) -> subprocess.CompletedProcess:
    """`racksim -m` into `sweep_dir`; fails the test on another exit code than `exit_code`."""
    p = subprocess.run([*CMD, "-m", f"hydra.sweep.dir={sweep_dir}", *BASE, *args],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == exit_code, p.stdout[-2000:] + p.stderr[-4000:]
    return p


JOBLIB = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
