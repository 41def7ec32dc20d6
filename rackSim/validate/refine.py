"""Refine a profile's two overheads by simulating the run it was fitted on.

The regression (`fit`) prices the engine step well but sees the time around it only
indirectly: `api_overhead_ms` (request handling before the scheduler, once per request) and
`overhead_ms` (scheduling and output handling between steps). Here each is set so that the
colocated model, replaying the *fitting* run's own workload, reproduces that run's measured
TTFT P50 (api_overhead_ms) and ITL P50 (overhead_ms): where a line through the simulated
value at `LINE_POINTS` settings (0 to twice the current one) meets it (`solve_by_line`), two
rounds. Only the fitting run is used; the other concurrency stays a prediction.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np

from rackSim.config.specs import ReplaySpec
from rackSim.perf.measured import Profile
from rackSim.validate.colocated import simulate_colocated
from rackSim.validate.compare import summarize_run
from rackSim.workload.graph import SessionGraph

LINE_POINTS = 6  # simulations of the fitting run per parameter and round


def solve_by_line(f: Callable[[float], float], target: float, xs: np.ndarray
                  ) -> tuple[float | None, dict]:
    """x where the least-squares line through f at `xs` meets `target` (at least xs[0]), and
    the line for the provenance (points, slope, intercept, residual). None when f does not
    grow along the line. A line rather than a bisection: a simulated run answers a shifted
    parameter with a reshuffled batch mix, so f is a trend plus noise of a few ms, and one
    crossing lands anywhere in that band."""
    ys = np.array([f(float(x)) for x in xs])
    ok = ~np.isnan(ys)
    slope, icpt = np.polyfit(xs[ok], ys[ok], 1) if ok.sum() >= 2 else (0.0, 0.0)
    line = {"x": [float(x) for x in xs], "y": ys.tolist(), "slope": float(slope),
            "intercept": float(icpt),
            "residual": float(np.std(ys[ok] - (icpt + slope * xs[ok]))) if slope > 0
            else math.nan}
    if slope <= 0:
        return None, line
    return max(float(xs[0]), float((target - icpt) / slope)), line


def refine_overheads(profile: Profile, sessions: list[SessionGraph], replay: ReplaySpec,
                     seed: int, measured: dict, rounds: int = 2, reuse_outputs: bool = False
                     ) -> Profile:
    """A copy of `profile` with api_overhead_ms and overhead_ms refined (module docstring).
    `measured` is the fitting run's summary (`compare.summarize_run(...).summary`);
    reuse_outputs as the run re-sent outputs (`simulate_colocated`)."""
    out = copy.deepcopy(profile)
    ttft, itl = measured.get("ttft_p50_ms", math.nan), measured.get("itl_p50_ms", math.nan)
    if math.isnan(ttft) or math.isnan(itl):
        return out

    def sim(p: Profile) -> dict:
        o = simulate_colocated(sessions, replay, p, seed=seed, reuse_outputs=reuse_outputs)
        return summarize_run(o.records, o.window_start_s, o.window_end_s, "refine").summary

    def with_(field: str, value: float) -> Profile:
        p = copy.deepcopy(out)
        setattr(p, field, value)
        return p

    lines = {}
    for _ in range(rounds):
        for field, metric, target, floor in (("overhead_ms", "itl_p50_ms", itl, 1.0),
                                             ("api_overhead_ms", "ttft_p50_ms", ttft, 5.0)):
            span = 2.0 * max(getattr(out, field), floor)
            x, lines[field] = solve_by_line(lambda v, f=field, m=metric: sim(with_(f, v))[m],
                                            target, np.linspace(0.0, span, LINE_POINTS))
            if x is not None:
                setattr(out, field, x)
    got = sim(out)
    out.provenance = dict(out.provenance)
    out.provenance["refined"] = {
        "method": "least-squares lines through the colocated model replaying the fitting run",
        "targets": {"ttft_p50_ms": ttft, "itl_p50_ms": itl},
        "reached": {"ttft_p50_ms": got["ttft_p50_ms"], "itl_p50_ms": got["itl_p50_ms"]},
        "lines": lines,
        "before": {"overhead_ms": profile.overhead_ms,
                   "api_overhead_ms": profile.api_overhead_ms}}
    return out
