"""A speed change against the code before it, measured in one run: same machine, same moment.

Checks out `--base` (a git revision) into a temporary worktree and runs each case in both
trees, alternating which goes first, `--repeat` times. Each run is a child process with only
that tree's rackSim on its path (and the project directory as its working directory, so that
paths such as the traces' resolve the same way; `python -P`, or `-c` would put the working
directory, and with it this tree's rackSim, ahead of the base's); before it runs, each tree is
checked to import its own rackSim. Each tree reads its own scenarios and, in the timed cases,
its own copy of the scenario's calibration profile (a change that refits a profile is
compared with the code and profile before it); a `process` case reads the project's profile.
Per tree it reports the median and range over the repeats of: CPU seconds of the event loop
(`Simulation.run`), events, peak resident memory and, for the `process` cases, the wall time
of the whole `racksim` command (start to exit, outputs written). Then the ratio base / this
tree (the median of the per-repeat ratios, with their range), and whether both trees produced
the same request and step tables (a hash of both frames): a speed change must not change
results.

Cases: `reference` (the reference scenario, `--window-s` of window), `fleet` (14 full racks of
`fleet_full_rack` at the reference per-GPU load), `headline` (the scenario fitted to the
published headline, `workload=agentx_fitted deployment=agentx_fitted`, `--window-s` of window:
~10K agents whose sessions branch every turn), `mooncake` (the Mooncake conversation trace,
one hour open loop), `mooncake-process` (the same as a whole `racksim` run).

`--python PYTHON` runs this tree's cases with another interpreter (an environment with
rackSim's dependencies installed, e.g. `PY=/usr/bin/python3 make venv VENV=/tmp/v`): with
`--base HEAD`, the same code under two interpreters (whether results stay bit-identical,
and which runs it faster).

`--instructions` counts the event loop's instructions under valgrind's callgrind instead of
timing it: one run per tree, the same count on a busy machine (this machine's CPU time moves
by 15-40 % over a day, more than most changes), 50-100x slower; it leaves out what the
hardware adds (cache misses, branch mispredictions), which the timed runs keep.

Run: `python benchmarks/bench_versus.py --base HEAD~1 [--cases reference mooncake]
[--repeat 3] [--window-s 300] [--instructions] [--python PYTHON]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_fleet import fleet_overrides  # benchmarks/ is on the path when run as a script

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ["workload=mooncake_conversation", "workload.replay.window_s=3600",
            "workload.replay.warmup_s=0", "workload.replay.drain_s=600"]

CHILD = r"""
import hashlib, json, os, resource, subprocess, sys, time
import pandas as pd
from rackSim.config import compose_scenario
from rackSim.engine.simulation import Simulation
from rackSim.metrics.summary import requests_frame
from rackSim.workload.sources import load_sessions

from pathlib import Path
import rackSim
args = json.loads(sys.argv[1]) + ["progress=false"]
cfg = compose_scenario(args)
# A relative profile path resolves against the working directory (the project) first: a base
# tree prices with its own copy of that profile, as it did when it was the project
tree = Path(rackSim.__file__).resolve().parents[1]
used = Path(cfg.perf.profile).resolve() if cfg.perf.profile else None
if used is not None and used.is_relative_to(Path.cwd().resolve()):
    own = tree / used.relative_to(Path.cwd().resolve())
    if own.is_file() and own != used:
        cfg = compose_scenario(args + [f"perf.profile={own}"])
sim = Simulation(cfg, load_sessions(cfg.workload, cfg.seed))
counted = os.environ.get("BENCH_CALLGRIND")  # under callgrind: count the event loop only
if counted:
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True,
                   capture_output=True)
c0 = time.process_time()
out = sim.run(progress=False)
cpu = time.process_time() - c0
if counted:
    subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=True,
                   capture_output=True)
req = requests_frame(out.requests)
times = hashlib.sha1(repr(req.pop("token_times_s").tolist()).encode()).hexdigest()
digest = hashlib.sha1()
for df in (req, out.steps.frame()):
    digest.update(pd.util.hash_pandas_object(df, index=False).values.tobytes())
digest.update(times.encode())
print(json.dumps({"cpu_s": cpu, "events": out.events, "requests": len(out.requests),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "hash": digest.hexdigest()[:16]}))
"""


def overrides(case: str, window_s: float) -> list[str]:
    if case == "reference":
        return [f"workload.replay.window_s={window_s}"]
    if case == "headline":
        return ["workload=agentx_fitted", "deployment=agentx_fitted",
                f"workload.replay.window_s={window_s}"]
    if case == "fleet":
        return [*fleet_overrides("fleet_full_rack", 14, []),
                f"workload.replay.window_s={window_s}"]
    if case.startswith("mooncake"):
        return MOONCAKE
    raise SystemExit(f"bench_versus: unknown case {case!r}")


def check_imports_own(tree: Path, python: str) -> None:
    """Stop unless a child run on `tree` imports rackSim from `tree`."""
    got = subprocess.run([python, "-P", "-c", "import rackSim; print(rackSim.__file__)"],
                         env={**os.environ, "PYTHONPATH": str(tree)}, cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    if not Path(got).resolve().is_relative_to(tree.resolve()):
        sys.exit(f"bench_versus: a run on {tree} imports rackSim from {got}")


def run_in(tree: Path, python: str, case: str, window_s: float, scratch: Path,
           instructions: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if instructions:
        return counted_in(tree, python, case, window_s, scratch)
    if case.endswith("-process"):
        out_dir = scratch / f"run-{time.monotonic_ns()}"
        t0 = time.perf_counter()
        subprocess.run([python, "-P", "-c", "from rackSim.cli import run; run()",
                        *overrides(case, window_s), f"hydra.run.dir={out_dir}",
                        "progress=false"], env=env, cwd=ROOT, check=True,
                       capture_output=True)
        wall = time.perf_counter() - t0
        shutil.rmtree(out_dir, ignore_errors=True)
        return {"wall_s": wall}
    child = subprocess.run([python, "-P", "-c", CHILD, json.dumps(overrides(case, window_s))],
                           env=env, cwd=ROOT, capture_output=True, text=True)
    if child.returncode:
        sys.exit(f"bench_versus: {case} failed in {tree}:\n{child.stderr}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def counted_in(tree: Path, python: str, case: str, window_s: float, scratch: Path) -> dict:
    """Instructions of the event loop of `case` in `tree`, counted by valgrind's callgrind
    (the same on a busy machine: one run per tree is the measurement)."""
    out = scratch / f"callgrind-{time.monotonic_ns()}.out"
    child = subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         python, "-P", "-c", CHILD, json.dumps(overrides(case, window_s))],
        env={**os.environ, "PYTHONPATH": str(tree), "BENCH_CALLGRIND": "1"}, cwd=ROOT,
        capture_output=True, text=True)
    if child.returncode:
        sys.exit(f"bench_versus: {case} failed under callgrind in {tree}:\n"
                 f"{child.stderr[-2000:]}")
    rec = json.loads(child.stdout.strip().splitlines()[-1])
    totals = next(x for x in out.read_text().splitlines() if x.startswith("totals:"))
    return {**rec, "instructions": int(totals.split()[1])}


def spread(values: list[float], digits: int = 2) -> str:
    """Median [min-max]; a single value alone (a count, measured once)."""
    if len(values) == 1:
        return f"{values[0]:,.{digits}f}"
    return (f"{statistics.median(values):,.{digits}f} "
            f"[{min(values):,.{digits}f}-{max(values):,.{digits}f}]" if values else "-")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--cases", nargs="+", default=["reference", "mooncake"],
                    choices=["reference", "fleet", "headline", "mooncake", "mooncake-process"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--window-s", type=float, default=300.0,
                    help="measurement window of the reference, fleet and headline cases (sim s)")
    ap.add_argument("--instructions", action="store_true",
                    help="count the event loop's instructions under valgrind instead of "
                    "timing it (deterministic: one run per tree; 50-100x slower)")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter of this tree's runs (default: this one)")
    args = ap.parse_args()
    if args.instructions:
        args.repeat = 1
        if any(c.endswith("-process") for c in args.cases):
            sys.exit("bench_versus: --instructions counts the event loop, not a process case")
    scratch = Path(tempfile.mkdtemp(prefix="bench_versus-"))
    base = scratch / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base),
                    args.base], check=True)
    try:
        check_imports_own(base, sys.executable)
        check_imports_own(ROOT, args.python)
        python = {"base": sys.executable, "this": args.python}
        for case in args.cases:
            runs: dict[str, list[dict]] = {"base": [], "this": []}
            for i in range(args.repeat):
                order = [("base", base), ("this", ROOT)]
                for name, tree in order if i % 2 == 0 else order[::-1]:
                    runs[name].append(run_in(tree, python[name], case, args.window_s,
                                             scratch, args.instructions))
                    print(f"{case} {name} #{i + 1}: {runs[name][-1]}", flush=True)
            key = ("instructions" if args.instructions
                   else "wall_s" if case.endswith("-process") else "cpu_s")
            for name in ("base", "this"):
                r = runs[name]
                line = (f"{case:>17} {name:>4}: {key} "
                        f"{spread([x[key] for x in r], 0 if args.instructions else 2)}")
                if key == "cpu_s":
                    line += (f", events {r[0]['events']:,}, us/event "
                             f"{spread([x['cpu_s'] / x['events'] * 1e6 for x in r])}, "
                             f"peak MB {spread([x['peak_mb'] for x in r])}")
                elif key == "instructions":
                    line += (f", events {r[0]['events']:,}, per event "
                             f"{r[0]['instructions'] / r[0]['events']:,.0f}")
                print(line)
            ratios = [b[key] / t[key] for b, t in zip(runs["base"], runs["this"], strict=True)]
            print(f"{case:>17} base / this: {spread(ratios, 3 if args.instructions else 2)}x")
            if key != "wall_s":
                same = {x["hash"] for x in runs["base"] + runs["this"]}
                print(f"{case:>17} same records and steps: {'yes' if len(same) == 1 else 'NO'}")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                       check=False)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
