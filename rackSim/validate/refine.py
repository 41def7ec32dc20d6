"""Refine a profile's two overheads by simulating the run it was fitted on.

The regression (`fit`) prices the engine step well but sees the time around it only
indirectly: `api_overhead_ms` (request handling before the scheduler, once per request) and
`overhead_ms` (scheduling and output handling between steps). Here each is set by bisection
so that the colocated model, replaying the *fitting* run's own workload, reproduces that run's
measured TTFT P50 (api_overhead_ms) and ITL P50 (overhead_ms). Both are monotone in their
parameter. Only the fitting run is used; the other concurrency stays a prediction.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

from rackSim.config.specs import ReplaySpec
from rackSim.perf.measured import Profile
from rackSim.validate.colocated import simulate_colocated
from rackSim.validate.compare import summarize_run
from rackSim.workload.graph import SessionGraph


def bisect_increasing(f: Callable[[float], float], target: float, lo: float, hi: float,
            iters: int = 10) -> float:
    """x in [lo, hi] with f(x) ~ target for an increasing f (clamped to the ends)."""
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def refine_overheads(profile: Profile, sessions: list[SessionGraph], replay: ReplaySpec,
                     seed: int, measured: dict, rounds: int = 2) -> Profile:
    """A copy of `profile` with api_overhead_ms and overhead_ms refined (module docstring).
    `measured` is the fitting run's summary (`compare.summarize_run(...).summary`)."""
    out = copy.deepcopy(profile)
    ttft, itl = measured.get("ttft_p50_ms", math.nan), measured.get("itl_p50_ms", math.nan)
    if math.isnan(ttft) or math.isnan(itl):
        return out

    def sim(p: Profile) -> dict:
        o = simulate_colocated(sessions, replay, p, seed=seed)
        return summarize_run(o.records, o.window_start_s, o.window_end_s, "refine").summary

    def with_(field: str, value: float) -> Profile:
        p = copy.deepcopy(out)
        setattr(p, field, value)
        return p

    for _ in range(rounds):
        out.overhead_ms = bisect_increasing(
            lambda v: sim(with_("overhead_ms", v))["itl_p50_ms"], itl, 0.0, max(itl, 1.0))
        out.api_overhead_ms = bisect_increasing(
            lambda v: sim(with_("api_overhead_ms", v))["ttft_p50_ms"], ttft, 0.0,
            max(ttft, 1.0))
    got = sim(out)
    out.provenance = dict(out.provenance)
    out.provenance["refined"] = {
        "method": "bisection on the colocated model replaying the fitting run",
        "targets": {"ttft_p50_ms": ttft, "itl_p50_ms": itl},
        "reached": {"ttft_p50_ms": got["ttft_p50_ms"], "itl_p50_ms": got["itl_p50_ms"]},
        "before": {"overhead_ms": profile.overhead_ms,
                   "api_overhead_ms": profile.api_overhead_ms}}
    return out
