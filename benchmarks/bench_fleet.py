"""Cost of a fleet against one rack: the reference layout on 1 and 14 GB300 NVL72 racks.

Each fleet runs the reference scenario with `deployment.racks=N` at the reference per-GPU load
(`N x` the reference concurrency), in its own process so that its peak memory is its own.
Prints, per fleet: set-up wall seconds (session pool, instances), simulated seconds, wall
seconds of the event loop, wall seconds per simulated hour (warm-up
included: it is simulated too), events, requests and steps, wall microseconds per event and
per request, and peak resident memory; then the 14-rack / 1-rack ratios. A fleet should cost
at most N times one rack per simulated hour, and the same per event.

Run: `python benchmarks/bench_fleet.py [--racks 1 14] [--window-s 30]
[--warmup-requests 1] [hydra overrides...]`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from rackSim.config import compose_scenario
from rackSim.engine.simulation import Simulation
from rackSim.workload.sources import load_sessions

COLS = ("racks", "gpus", "concurrency", "setup_s", "sim_s", "wall_s", "wall_s_per_sim_h", "events",
        "requests", "steps", "us_per_event", "us_per_request", "peak_rss_mb")


def one(racks: int, window_s: float, warmup: int, overrides: list[str]) -> dict:
    """Simulate `racks` racks of the reference in this process and measure it."""
    ref = compose_scenario(overrides)
    per_rack = ref.workload.replay.concurrency
    cfg = compose_scenario([*overrides, f"deployment.racks={racks}",
                            f"workload.replay.concurrency={per_rack * racks}",
                            f"workload.replay.window_s={window_s}",
                            f"workload.replay.warmup_requests_per_lane={warmup}",
                            "progress=false"])
    t0 = time.perf_counter()
    sim = Simulation(cfg, load_sessions(cfg.workload, cfg.seed))
    setup = time.perf_counter() - t0
    out = sim.run(progress=False)
    wall = out.wall_s
    return {"racks": racks, "gpus": cfg.deployment.num_gpus,
            "concurrency": cfg.workload.replay.concurrency, "setup_s": setup,
            "sim_s": out.sim_s, "wall_s": wall,
            "wall_s_per_sim_h": wall / out.sim_s * 3600, "events": out.events,
            "requests": len(out.requests), "steps": len(out.steps),
            "us_per_event": wall / out.events * 1e6,
            "us_per_request": wall / max(len(out.requests), 1) * 1e6,
            # Linux reports the peak resident set in KiB
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--racks", type=int, nargs="+", default=[1, 14])
    ap.add_argument("--window-s", type=float, default=30.0, help="measurement window (sim s)")
    ap.add_argument("--warmup-requests", type=int, default=1, help="warm-up requests per lane")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: one fleet
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the reference scenario")
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.window_s, args.warmup_requests, args.overrides)))
        return
    print(" ".join(f"{c:>16}" for c in COLS), flush=True)
    rows = []
    for racks in args.racks:
        child = subprocess.run(
            [sys.executable, __file__, "--one", str(racks), "--window-s", str(args.window_s),
             "--warmup-requests", str(args.warmup_requests), *args.overrides],
            capture_output=True, text=True)
        if child.returncode:
            sys.exit(f"bench_fleet: the {racks}-rack run failed:\n{child.stderr}")
        r = json.loads(child.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(" ".join(f"{r[c]:>16,.2f}" if isinstance(r[c], float) else f"{r[c]:>16,}"
                       for c in COLS), flush=True)
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        n = b["racks"] / a["racks"]
        print(f"{b['racks']} racks vs {a['racks']}: wall per simulated hour "
              f"{b['wall_s_per_sim_h'] / a['wall_s_per_sim_h']:.2f}x (bound {n:.0f}x), per event "
              f"{b['us_per_event'] / a['us_per_event']:.2f}x, per request "
              f"{b['us_per_request'] / a['us_per_request']:.2f}x, events per request "
              f"{(b['events'] / b['requests']) / (a['events'] / a['requests']):.2f}x, peak "
              f"memory {b['peak_rss_mb'] / a['peak_rss_mb']:.2f}x")


if __name__ == "__main__":
    main()
