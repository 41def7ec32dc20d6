"""Cost of a fleet against one rack, at the reference per-GPU load.

Rows: the one-rack reference as it is (P8xDEP2+DEP32, 48 GPUs, 400 agent clients), then the
given layout (default `fleet_full_rack`: P12xDEP2+3xDEP16, all 72 GPUs of a GB300 NVL72 rack)
on each rack count (default 1 and 14: 1,008 GPUs). Every fleet gets the reference's agent
clients per GPU, and runs in its own process so that its peak memory is its own.

Prints, per row: set-up wall seconds (session pool, instances), simulated seconds, wall and
CPU seconds of the event loop, CPU seconds per simulated hour (warm-up included: it is
simulated too), events, requests and steps, CPU microseconds per event and per request, peak
resident memory (CPU time, not wall time, is compared: wall time on a shared machine counts
the other processes too); then the largest fleet against one rack of its layout and against
the reference. A fleet should cost at most N times one rack per simulated hour, and the same
per event.

Run: `python benchmarks/bench_fleet.py [--racks 1 14] [--layout fleet_full_rack]
[--window-s 60] [--warmup-requests 1] [hydra overrides...]`.

`--curve UNTIL_S` instead runs each fleet to UNTIL_S simulated seconds and prints its CPU per
event per `--chunk-s` chunk of simulated time, and, for the chunk starting at `--calls-at`,
the Python calls per event (that chunk runs under cProfile, its CPU is not compared): whether
a growth in CPU per event is more work per event or the same work getting slower. After the
fleets, the functions whose own time per event in that chunk grew most from the first fleet
to the last (`--top`, default 12), with their calls per event: where the growth lands.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from rackSim.config import compose_scenario
from rackSim.engine.simulation import Simulation
from rackSim.run import layout_name
from rackSim.workload.sources import load_sessions

COLS = ("layout", "racks", "gpus", "concurrency", "setup_s", "sim_s", "wall_s", "cpu_s",
        "cpu_s_per_sim_h", "events", "requests", "steps", "us_per_event", "us_per_request",
        "peak_rss_mb")


def fleet_overrides(layout: str | None, racks: int, overrides: list[str]) -> list[str]:
    """Overrides for `racks` racks of `layout` (None: the reference) at the reference's
    clients per GPU."""
    ref = compose_scenario(overrides)
    per_gpu = ref.workload.replay.concurrency / ref.deployment.num_gpus
    dep = [*overrides, *([f"deployment={layout}"] if layout else []), f"deployment.racks={racks}"]
    gpus = compose_scenario(dep).deployment.num_gpus
    return [*dep, f"workload.replay.concurrency={round(per_gpu * gpus)}"]


def fleet_config(layout: str | None, racks: int, window_s: float, warmup: int,
                 overrides: list[str]):
    """`racks` racks of `layout` (None: the reference) at the reference's clients per GPU."""
    return compose_scenario([*fleet_overrides(layout, racks, overrides),
                             f"workload.replay.window_s={window_s}",
                             f"workload.replay.warmup_requests_per_lane={warmup}",
                             "progress=false"])


def started_fleet(layout: str, racks: int, until_s: float, warmup: int,
                  overrides: list[str]) -> Simulation:
    """`racks` racks of `layout` (`fleet_config`, window `until_s`) with their clients
    started and the cyclic collector off, as `Simulation.run` has them, for a caller that
    drives `sim.env` itself in pieces."""
    import gc

    cfg = fleet_config(layout, racks, until_s, warmup, overrides)
    sim = Simulation(cfg, load_sessions(cfg.workload, cfg.seed))
    gc.disable()
    sim.clients.start()
    return sim


def one(layout: str | None, racks: int, window_s: float, warmup: int,
        overrides: list[str]) -> dict:
    """Simulate `racks` racks of `layout` (None: the reference) in this process at the
    reference's clients per GPU, and measure it."""
    cfg = fleet_config(layout, racks, window_s, warmup, overrides)
    t0 = time.perf_counter()
    sim = Simulation(cfg, load_sessions(cfg.workload, cfg.seed))
    setup = time.perf_counter() - t0
    c0 = time.process_time()
    out = sim.run(progress=False)
    cpu = time.process_time() - c0
    return {"layout": layout_name(cfg.deployment), "racks": racks, "gpus": cfg.deployment.num_gpus,
            "concurrency": cfg.workload.replay.concurrency, "setup_s": setup,
            "sim_s": out.sim_s, "wall_s": out.wall_s, "cpu_s": cpu,
            "cpu_s_per_sim_h": cpu / out.sim_s * 3600, "events": out.events,
            "requests": len(out.requests), "steps": len(out.steps),
            "us_per_event": cpu / out.events * 1e6,
            "us_per_request": cpu / max(len(out.requests), 1) * 1e6,
            # Linux reports the peak resident set in KiB
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def per_event(stats: dict, events: int) -> dict[str, tuple[float, float]]:
    """`function: (calls, own microseconds)` per event of a cProfile `stats` table."""
    return {f"{Path(file).name}:{line}:{name}": (calls / events, own / events * 1e6)
            for (file, line, name), (_, calls, own, _, _) in stats.items()}


def growth(first: dict, last: dict, top: int) -> list[str]:
    """Lines for the `top` functions whose own time per event grew most from `first` to
    `last` (`per_event` tables)."""
    rows = sorted(((last.get(f, (0, 0))[1] - first.get(f, (0, 0))[1], f)
                   for f in first.keys() | last.keys()), reverse=True)[:top]
    return [f"{d:+7.2f} us/event  own {first.get(f, (0, 0))[1]:6.2f} -> "
            f"{last.get(f, (0, 0))[1]:6.2f}  calls/event {first.get(f, (0, 0))[0]:6.3f} -> "
            f"{last.get(f, (0, 0))[0]:6.3f}  {f}" for d, f in rows]


def curve(layout: str, racks: int, until_s: float, chunk_s: float, calls_at: float | None,
          warmup: int, overrides: list[str]) -> None:
    """Print, per chunk of simulated time, the CPU per event of `racks` racks of `layout` at
    the reference's clients per GPU (JSON lines); one chunk under cProfile counts calls, and
    its per-function table (`per_event`) is the last line."""
    import cProfile
    import pstats

    env = started_fleet(layout, racks, until_s, warmup, overrides).env
    table = None
    while env.now < until_s:
        c0, e0, t0 = time.process_time(), env.events_scheduled, env.now
        profiled = calls_at is not None and t0 <= calls_at < t0 + chunk_s
        prof = cProfile.Profile() if profiled else None
        if prof:
            if env.now < calls_at:
                env.run(until=calls_at)
            c0, e0, t0 = time.process_time(), env.events_scheduled, env.now
            prof.enable()
        env.run(until=min(t0 + chunk_s, until_s))
        row = {"racks": racks, "t_s": round(env.now), "events": env.events_scheduled - e0}
        if prof:
            prof.disable()
            table = per_event(pstats.Stats(prof).stats, max(row["events"], 1))
            row["calls_per_event"] = round(sum(c for c, _ in table.values()), 2)
        else:
            row["cpu_us_per_event"] = round((time.process_time() - c0)
                                            / max(row["events"], 1) * 1e6, 2)
        row["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(json.dumps(row), flush=True)
    if table is not None:
        print(json.dumps({"functions": table}), flush=True)


def fleet_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser with the fleets to compare: `--racks` (rack counts), `--layout`."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--racks", type=int, nargs="+", default=[1, 14])
    ap.add_argument("--layout", default="fleet_full_rack", help="scenarios/deployment option")
    return ap


def main() -> None:
    ap = fleet_parser(__doc__)
    ap.add_argument("--window-s", type=float, default=30.0, help="measurement window (sim s)")
    ap.add_argument("--warmup-requests", type=int, default=1, help="warm-up requests per lane")
    ap.add_argument("--curve", type=float, metavar="UNTIL_S",
                    help="print CPU per event per chunk of simulated time up to UNTIL_S")
    ap.add_argument("--chunk-s", type=float, default=60.0, help="chunk of --curve (sim s)")
    ap.add_argument("--calls-at", type=float, help="--curve: count Python calls per event "
                    "in the chunk starting at this simulated second")
    ap.add_argument("--top", type=int, default=12, help="--calls-at: functions listed whose "
                    "own time per event grew most")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # child: LAYOUT RACKS
    ap.add_argument("--curve-one", help=argparse.SUPPRESS)  # child of --curve (JSON args)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the reference scenario")
    args = ap.parse_args()
    if args.curve_one is not None:
        curve(*json.loads(args.curve_one))
        return
    if args.one is not None:
        layout = None if args.one[0] == "-" else args.one[0]
        print(json.dumps(one(layout, int(args.one[1]), args.window_s, args.warmup_requests,
                             args.overrides)))
        return
    if args.curve is not None:
        tables = []
        for racks in args.racks:  # one process at a time, so that neither slows the other
            child = subprocess.Popen([sys.executable, __file__, "--curve-one", json.dumps(
                [args.layout, racks, args.curve, args.chunk_s, args.calls_at,
                 args.warmup_requests, args.overrides])], stdout=subprocess.PIPE, text=True)
            for line in child.stdout:
                if line.startswith('{"functions"'):
                    tables.append(json.loads(line)["functions"])
                else:
                    print(line, end="", flush=True)
            if child.wait():
                sys.exit(f"bench_fleet: the {racks}-rack curve failed")
        if len(tables) > 1:
            print(f"own time per event, {args.racks[-1]} racks against {args.racks[0]}, in the "
                  f"chunk from t = {args.calls_at:g} s (under cProfile):")
            print("\n".join(growth(tables[0], tables[-1], args.top)))
        return
    print(" ".join(f"{c:>16}" for c in COLS), flush=True)
    rows = []
    for layout, racks in [("-", 1), *((args.layout, n) for n in args.racks)]:
        child = subprocess.run(
            [sys.executable, __file__, "--one", layout, str(racks),
             "--window-s", str(args.window_s),
             "--warmup-requests", str(args.warmup_requests), *args.overrides],
            capture_output=True, text=True)
        if child.returncode:
            sys.exit(f"bench_fleet: the {racks}-rack run failed:\n{child.stderr}")
        r = json.loads(child.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(" ".join(f"{r[c]:>16,.2f}" if isinstance(r[c], float) else f"{r[c]:>16,}"
                       if isinstance(r[c], int) else f"{r[c][:16]:>16}" for c in COLS), flush=True)
    big = rows[-1]
    for a in (rows[1], rows[0]):
        if a is big:
            continue
        print(f"{big['racks']} x {big['layout']} vs {a['racks']} x {a['layout']}: "
              f"{big['gpus'] / a['gpus']:.1f}x the GPUs; CPU per simulated hour "
              f"{big['cpu_s_per_sim_h'] / a['cpu_s_per_sim_h']:.2f}x, per event "
              f"{big['us_per_event'] / a['us_per_event']:.2f}x, per request "
              f"{big['us_per_request'] / a['us_per_request']:.2f}x, events per request "
              f"{(big['events'] / big['requests']) / (a['events'] / a['requests']):.2f}x, peak "
              f"memory {big['peak_rss_mb'] / a['peak_rss_mb']:.2f}x")


if __name__ == "__main__":
    main()
