"""Speed of the reference scenario: 1, 4 and 16 simulated minutes of measurement window.

Prints simulated seconds per wall second, requests per wall second and events per second
(warm-up included: it is simulated too), and the marginal wall time of one simulated hour of
window (between the shortest and the longest window). Run: `make bench` or
`python benchmarks/bench_reference.py --minutes 1 4 16 [--repeat 3] [hydra overrides...]`.
This machine's speed drifts by up to ~25% between runs; `--repeat N` keeps the fastest of N
runs per window, the usual estimate of what the code costs on a quiet machine.
"""

from __future__ import annotations

import argparse
import time

from rackSim.config import compose_scenario
from rackSim.engine.simulation import Simulation
from rackSim.workload.sources import load_sessions


def bench(minutes: float, overrides: list[str]) -> dict:
    cfg = compose_scenario([*overrides, f"workload.replay.window_s={minutes * 60}",
                            "progress=false"])
    t0 = time.perf_counter()
    sessions = load_sessions(cfg.workload, cfg.seed)
    sim = Simulation(cfg, sessions)
    out = sim.run(progress=False)
    wall = time.perf_counter() - t0
    steps = len(out.steps)
    return {"window_min": minutes, "sim_s": out.sim_s, "wall_s": wall,
            "sim_s_per_wall_s": out.sim_s / wall, "requests": len(out.requests),
            "requests_per_wall_s": len(out.requests) / wall, "events": out.events,
            "events_per_s": out.events / wall, "steps": steps,
            "events_per_step": out.events / max(steps, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeat", type=int, default=1, help="runs per window; the fastest counts")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the reference scenario")
    args = ap.parse_args()
    cols = ("window_min", "sim_s", "wall_s", "sim_s_per_wall_s", "requests",
            "requests_per_wall_s", "events", "events_per_s", "events_per_step")
    print(" ".join(f"{c:>18}" for c in cols))
    rows = []
    for m in args.minutes:
        r = min((bench(m, args.overrides) for _ in range(max(1, args.repeat))),
                key=lambda x: x["wall_s"])
        rows.append(r)
        print(" ".join(f"{r[c]:>18,.2f}" if isinstance(r[c], float) else f"{r[c]:>18,}"
                       for c in cols), flush=True)
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(f"scaling: {b['window_min'] / a['window_min']:.0f}x window -> "
              f"{b['wall_s'] / a['wall_s']:.2f}x wall time")
        per_hour = (b["wall_s"] - a["wall_s"]) / ((b["window_min"] - a["window_min"]) / 60)
        print(f"marginal cost of one simulated hour of window: {per_hour:,.0f} s wall")
    last = rows[-1]
    print(f"pace of the {last['window_min']:g}-minute run (warm-up included): one simulated hour "
          f"per {3600 / last['sim_s_per_wall_s']:,.0f} s wall")


if __name__ == "__main__":
    main()
