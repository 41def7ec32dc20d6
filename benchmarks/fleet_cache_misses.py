"""Instructions and cache misses per event of a fleet against one rack, counted by valgrind.

CPU time per event is what `bench_fleet.py` compares, and on a shared machine it moves by
±15 % from one run to the next; what grows with the fleet (docs/fleets.md, "Scale") is
better counted. Each fleet (`--layout`, default `fleet_full_rack`, at the reference's
clients per GPU) runs under valgrind's callgrind with its cache simulator, collecting only
while the simulation runs from `--from-s` for about `--events` events (set-up and the first
simulated minute left out): the counts are the same on a busy machine. Printed per fleet:
instructions, L1 data misses and last-level misses per event, and the largest fleet against
the first.

`--ll-mb` sets the simulated last-level cache (default 32 MB, as on the machines where 14
racks cost 1.24-1.40x one rack's CPU per event); L1 is 48 KB data, 32 KB instructions.
valgrind runs a fleet some 50-100x slower than Python alone: 14 racks take ~10 minutes.

Run: `python benchmarks/fleet_cache_misses.py [--racks 1 14] [--from-s 60] [--events 40000]
[--ll-mb 32]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_fleet import fleet_parser, started_fleet  # benchmarks/ is on the path as a script

EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
#: simulated seconds per event of one full rack at the reference load (to size the region)
SIM_S_PER_EVENT_ONE_RACK = 1 / 710


def child(layout: str, racks: int, from_s: float, until_s: float) -> None:
    """Simulate to `from_s`, then switch callgrind's collection on until `until_s`."""
    env = started_fleet(layout, racks, until_s, 1, []).env
    env.run(until=from_s)
    first = env.events_scheduled
    toggle = ["callgrind_control", "-i"]
    subprocess.run([*toggle, "on", str(os.getpid())], check=True, capture_output=True)
    env.run(until=until_s)
    subprocess.run([*toggle, "off", str(os.getpid())], check=True, capture_output=True)
    print(json.dumps({"events": env.events_scheduled - first}))


def counted(layout: str, racks: int, from_s: float, events: int, ll_mb: int,
            scratch: Path) -> dict[str, float]:
    """Per-event counts of `racks` racks over about `events` events from `from_s`."""
    until_s = from_s + events * SIM_S_PER_EVENT_ONE_RACK / racks
    out = scratch / f"callgrind.{racks}.out"
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--cache-sim=yes",
         f"--LL={ll_mb << 20},16,64", "--D1=49152,12,64", "--I1=32768,8,64",
         f"--callgrind-out-file={out}", sys.executable, __file__, "--child", layout,
         str(racks), str(from_s), str(until_s)],
        capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"fleet_cache_misses: {racks} racks failed:\n{run.stderr[-2000:]}")
    n = json.loads(run.stdout.strip().splitlines()[-1])["events"]
    totals = next(line for line in out.read_text().splitlines() if line.startswith("totals:"))
    counts = dict(zip(EVENTS, map(int, totals.split()[1:]), strict=True))
    return {"racks": racks, "events": n, "instructions": counts["Ir"] / n,
            "l1_data_misses": (counts["D1mr"] + counts["D1mw"]) / n,
            "last_level_misses": (counts["DLmr"] + counts["DLmw"] + counts["ILmr"]) / n}


def main() -> None:
    ap = fleet_parser(__doc__)
    ap.add_argument("--from-s", type=float, default=60.0, help="first simulated second counted")
    ap.add_argument("--events", type=int, default=40_000, help="events to count (about)")
    ap.add_argument("--ll-mb", type=int, default=32, help="simulated last-level cache (MB)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)  # LAYOUT RACKS FROM UNTIL
    args = ap.parse_args()
    if args.child:
        layout, racks, from_s, until_s = args.child
        child(layout, int(racks), float(from_s), float(until_s))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="fleet_cache_misses-") as tmp:
        for racks in args.racks:
            rows.append(counted(args.layout, racks, args.from_s, args.events, args.ll_mb,
                                Path(tmp)))
            print(json.dumps({k: round(v, 1) for k, v in rows[-1].items()}), flush=True)
    first, last = rows[0], rows[-1]
    print(f"{last['racks']} racks / {first['racks']}: " + ", ".join(
        f"{k} {last[k] / first[k]:.2f}x"
        for k in ("instructions", "l1_data_misses", "last_level_misses")))


if __name__ == "__main__":
    main()
