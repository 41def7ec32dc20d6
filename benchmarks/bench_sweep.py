"""Benchmark: a 100-scenario sweep through Hydra's joblib launcher on this machine.

Each scenario is `experiment=smoke`-sized (2 x DEP2 prefill + a DEP4 or DEP8 decode instance,
8-12 GPUs, 16-96 agentic clients) with a 10-minute measurement window; the sweep varies DEP
width, concurrency, KV transfer mode and the per-step KV-load cap (2 x 5 x 2 x 5 = 100):

    .venv/bin/python benchmarks/bench_sweep.py               # n_jobs=2, the full 100
    .venv/bin/python benchmarks/bench_sweep.py --window-s 60 # a quicker look

Reports wall time, scenarios per minute, the summed simulation time of the jobs (how well the
two workers were kept busy) and the time of a resumed pass that skips every finished scenario.
Not a test: nothing here passes or fails on time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

AXES = [
    "deployment.decode.gpus=4,8",
    "workload.replay.concurrency=16,32,48,64,96",
    "deployment.kv_transfer.mode=push,pull",
    "deployment.decode.kv_load_cap_per_step=1,2,4,8,16",
]
CMD = [sys.executable, "-c", "from rackSim.cli import run; run()", "-m"]


def sweep(sweep_dir: Path, n_jobs: int, window_s: float) -> float:
    """Run the sweep into `sweep_dir`; returns its wall time (s)."""
    args = [*CMD, f"hydra.sweep.dir={sweep_dir}", "hydra/launcher=joblib",
            f"hydra.launcher.n_jobs={n_jobs}", "experiment=smoke", "progress=false",
            f"workload.replay.window_s={window_s:g}", *AXES]
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"bench_sweep: sweep failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-jobs", type=int, default=2)
    p.add_argument("--window-s", type=float, default=600.0)
    p.add_argument("--dir", type=Path, default=None, help="sweep directory (default: a temp dir)")
    args = p.parse_args(argv)
    sweep_dir = args.dir or Path(tempfile.mkdtemp(prefix="racksim-bench-sweep-"))
    wall = sweep(sweep_dir, args.n_jobs, args.window_s)
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    ok = table[table["status"] == "ok"]
    resumed = sweep(sweep_dir, args.n_jobs, args.window_s)
    n = len(table)
    print(f"sweep dir            {sweep_dir}")
    print(f"scenarios            {n} ({len(ok)} ok, {n - len(ok)} failed), "
          f"{args.window_s:g} s simulated window each, joblib n_jobs={args.n_jobs}")
    print(f"wall time            {wall:,.1f} s")
    print(f"scenarios per minute {n / wall * 60:,.2f}")
    print(f"simulation time      {ok['wall_s'].sum():,.1f} s summed over jobs "
          f"({ok['wall_s'].sum() / wall:.2f} busy workers on average)")
    print(f"simulated per job    {ok['sim_s'].mean():,.0f} s (warm-up + window), "
          f"{ok['events'].mean():,.0f} events")
    print(f"resumed pass         {resumed:,.1f} s (every scenario skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
