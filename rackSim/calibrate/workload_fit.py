"""Fit the AgentX workload, the concurrency and the layout to the headline (H1-H3).

The AgentX per-session statistics, the concurrency and the number of prefill instances are not
published; H1 (tokens/s/GPU), H2 (P90 tokens/s per user) and H3 (revenue per GPU-hour) are.
This module finds the values of the free parameters under which the *simulated* run lands on
all three at once, with the simulator in the loop:

* the objective is a maximum a-posteriori least-squares problem in log space: for each target
  `log(simulated / published) / sigma_target`, and for each free parameter
  `(log value - log prior) / prior_width`. The priors are the generator's documented
  assumptions (shared/reference/agentx.md: contexts growing from ~15-30K to 100K+ over tens of
  turns, a few hundred output tokens, tool delays of seconds); their widths say how far the
  data may move them. Three targets cannot pin the free parameters alone; the priors make the
  problem well posed and the leave-one-out check meaningful.
* a trust-region surrogate search minimises it: around the best point so far, a linear model
  of log(simulated / published) in the log parameters is regressed on every simulated point
  (weighted by closeness), the MAP problem is solved on that model inside the trust region and
  the bounds (scipy `least_squares`), and the simulator runs the proposal and one exploratory
  point next to it (in parallel, joblib); the region grows after a better point and shrinks
  otherwise. Regression over many points averages out the simulator's event-level noise,
  which defeats finite-difference gradients. Every simulation uses the same seed (common
  random numbers).
* the layout (prefill instances, decode width) is discrete: each candidate layout allowed by
  H4 gets its own fit, and the one with the smallest objective becomes the reference; the
  others are reported as alternatives (identifiability), with what each predicts for a what-if
  (the other decode width at the same prefill instances).

Each evaluation simulates a short window (`window_s`, default 15 s) after a warm-up of
`warmup_requests_per_lane` requests per lane (3), and lets the requests in flight at its end
finish (`drain_s`, 60 s at most), so that their output counts in the window as it would in
an hour: after one warm-up request per lane the queues are still settling (the throughput of
the first 15 s is ~7 % under the hour's), and without a drain the output of the requests
still decoding at the window's end is lost (~10 % of a 15-s window's). `racksim-calibrate
workload --check-window 60 3600` records how far such a window is from the fitted
reference's one-hour run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from rackSim.calibrate.headline import Headline, Layout

#: Summary keys of the simulated figures each headline row is compared with.
TARGET_KEYS = {"H1": "throughput_tok_s_gpu", "H2": "interactivity_tok_s",
               "H3": "revenue_usd_gpu_h"}


@dataclass(frozen=True)
class FreeParameter:
    """One fitted quantity: where it lives in the scenario, its prior and its plausible range.

    `path` is a dotted scenario key; for a Dist of the AgentX generator it names the Dist and
    `dist_field` the field fitted (the median), the Dist's other fields stay as assumed."""

    name: str
    path: str
    prior: float
    prior_width: float      # sd of the log prior
    low: float              # plausible range (bounds of the fit)
    high: float
    unit: str
    why: str                # the plausibility statement (agentx.md)
    dist_field: str | None = None
    integer: bool = False   # a count: written rounded to a whole number


#: The free parameters of the AgentX workload and the replay. Priors are the generator's
#: assumed defaults (rackSim.workload.agentx); ranges are what agentx.md calls plausible for
#: coding agents. Concurrency has no public figure: a wide prior.
FREE_PARAMETERS: tuple[FreeParameter, ...] = (
    FreeParameter("new_tokens_median", "workload.agentx.new_tokens", 900.0, 1.0, 50.0, 8000.0,
                  "tokens per turn", "tool results appended per turn: file reads, command "
                  "output (hundreds to thousands of tokens)", "median"),
    FreeParameter("output_tokens_median", "workload.agentx.output_tokens", 220.0, 0.7, 50.0,
                  1200.0, "tokens per request", "'a few hundred output tokens per turn'",
                  "median"),
    FreeParameter("system_tokens_median", "workload.agentx.system_tokens", 14000.0, 0.3,
                  4000.0, 30000.0, "tokens", "system prompt + tool schemas + project "
                  "instructions: 'first prompts ~15-30K'", "median"),
    FreeParameter("turns_median", "workload.agentx.turns", 25.0, 0.7, 8.0, 120.0,
                  "turns per session", "'contexts growing ... over tens of turns'", "median"),
    FreeParameter("tool_delay_s_median", "workload.agentx.tool_delay_s", 1.5, 1.0, 0.1, 30.0,
                  "s", "'tool delays of seconds'", "median"),
    FreeParameter("resent_output_share", "workload.agentx.resent_output_share", 1.0, 0.7, 0.1,
                  1.0, "of each response", "reasoning is dropped between turns by reasoning-"
                  "model APIs (DeepSeek: earlier reasoning_content is not concatenated into the "
                  "context) and coding agents (earlier thinking blocks are stripped); 1 = the "
                  "whole response re-sent"),
    FreeParameter("concurrency", "workload.replay.concurrency", 2000.0, 2.0, 50.0, 40000.0,
                  "agent clients", "not public; live agent clients of the benchmark run",
                  integer=True),
)


@dataclass(frozen=True)
class FitSettings:
    """How the fit simulates and weighs: targets' log-sd, window, warm-up, drain, seed,
    parallelism."""

    target_sigma: float = 0.03
    window_s: float = 15.0
    warmup_requests_per_lane: int = 3
    drain_s: float = 60.0       # the window's requests in flight finish (stops when none is)
    seed: int = 0
    jobs: int = 2
    design_step: float = 0.15   # step of the initial design around the start (in log x)
    max_evaluations: int = 12   # surrogate rounds (each simulates 2 points)
    refit_evaluations: int = 3  # rounds for alternatives and leave-one-out (start at the fit)
    tolerance: float = 0.10     # converged: every target within this relative error


def scenario_changes(params: dict[str, float], layout: Layout, base: dict[str, Any],
                     settings: FitSettings, free: Sequence[FreeParameter] = FREE_PARAMETERS
                     ) -> dict[str, Any]:
    """Nested `with_changes` sections that put `params` and `layout` into the base scenario
    (`base` = the base RunConfig's model_dump)."""
    changes: dict[str, Any] = {
        "seed": settings.seed, "progress": False,
        "deployment": {"name": layout_label(layout),
                       "prefill": {"instances": layout.prefill_instances,
                                   "gpus_per_instance": layout.prefill_gpus_per_instance},
                       "decode": {"gpus": layout.decode_gpus}},
        "workload": {"replay": {"window_s": settings.window_s, "drain_s": settings.drain_s,
                                "warmup_requests_per_lane": settings.warmup_requests_per_lane}},
    }
    for p in free:
        if p.name not in params:
            continue
        value = params[p.name]
        keys = p.path.split(".")
        node = changes
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if p.dist_field is None:
            node[keys[-1]] = int(round(value)) if p.integer else value
        else:
            dist = dict(_lookup(base, keys) or {})
            dist[p.dist_field] = value
            node[keys[-1]] = dist
    return changes


def _lookup(tree: dict[str, Any], keys: Sequence[str]) -> Any:
    for k in keys:
        tree = tree.get(k) if isinstance(tree, dict) else None
        if tree is None:
            return None
    return tree


def layout_label(layout: Layout) -> str:
    return (f"P{layout.prefill_instances}xDEP{layout.prefill_gpus_per_instance}"
            f"+DEP{layout.decode_gpus}")


def simulate_point(base_overrides: Sequence[str], params: dict[str, float], layout: Layout,
                   settings: FitSettings) -> dict[str, float]:
    """Simulate one parameter point (in this process) and return its summary figures."""
    from rackSim.config import compose_scenario
    from rackSim.config.scenarios import with_changes
    from rackSim.run import simulate

    base = compose_scenario(list(base_overrides))
    dump = base.model_dump(mode="json")
    if dump["workload"].get("agentx") is None:
        from rackSim.workload.agentx import AgentXSpec

        dump["workload"]["agentx"] = AgentXSpec().model_dump(mode="json")
        base = with_changes(base, workload={"agentx": dump["workload"]["agentx"]})
    cfg = with_changes(base, **scenario_changes(params, layout, dump, settings))
    s = simulate(cfg, progress=False).summary
    keys = list(TARGET_KEYS.values()) + [
        "cached_input_tok_s_gpu", "uncached_input_tok_s_gpu", "output_tok_s_gpu",
        "cache_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "itl_p90_ms", "decode_step_ms",
        "requests_sent", "num_gpus"]
    return {k: float(s[k]) for k in keys}


class Evaluator:
    """Simulates parameter points, in parallel where it can, remembering every result on
    disk (`cache_path`, JSON lines) so an interrupted or repeated fit does not simulate a
    point twice."""

    def __init__(self, base_overrides: Sequence[str], settings: FitSettings,
                 cache_path: Path | None = None,
                 simulate: Callable[..., dict[str, float]] = simulate_point):
        self.base_overrides = list(base_overrides)
        self.settings = settings
        self.cache_path = cache_path
        self._simulate = simulate
        self.cache: dict[str, dict[str, float]] = {}
        self.simulations = 0
        if cache_path is not None and cache_path.is_file():
            for line in cache_path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    self.cache[rec["key"]] = rec["out"]

    def key(self, params: dict[str, float], layout: Layout) -> str:
        blob = json.dumps([self.base_overrides, sorted((k, round(v, 6)) for k, v in
                                                       params.items()),
                           [layout.prefill_instances, layout.prefill_gpus_per_instance,
                            layout.decode_gpus],
                           self.settings.window_s, self.settings.warmup_requests_per_lane,
                           self.settings.drain_s, self.settings.seed])
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    def __call__(self, points: Sequence[tuple[dict[str, float], Layout]]
                 ) -> list[dict[str, float]]:
        keys = [self.key(p, lay) for p, lay in points]
        todo = [(k, p, lay) for k, (p, lay) in zip(keys, points, strict=True)
                if k not in self.cache]
        todo = list({k: (k, p, lay) for k, p, lay in todo}.values())
        if todo:
            outs = self._run([(p, lay) for _, p, lay in todo])
            for (k, _, _), out in zip(todo, outs, strict=True):
                self.cache[k] = out
                if self.cache_path is not None:
                    with open(self.cache_path, "a") as f:
                        f.write(json.dumps({"key": k, "out": out}) + "\n")
            self.simulations += len(todo)
        return [self.cache[k] for k in keys]

    def _run(self, points: list[tuple[dict[str, float], Layout]]) -> list[dict[str, float]]:
        if self.settings.jobs <= 1 or len(points) == 1:
            return [self._simulate(self.base_overrides, p, lay, self.settings)
                    for p, lay in points]
        from joblib import Parallel, delayed

        return Parallel(n_jobs=self.settings.jobs)(
            delayed(self._simulate)(self.base_overrides, p, lay, self.settings)
            for p, lay in points)


@dataclass
class LayoutFit:
    """The fit of one layout: fitted values, simulated figures there, and how well."""

    layout: Layout
    params: dict[str, float]
    figures: dict[str, float]
    errors: dict[str, float]          # relative error per target
    cost: float                       # the MAP objective (half the sum of squares)
    converged: bool
    posterior_sd: dict[str, float]    # sd of log value from the final Jacobian
    fitted_names: tuple[str, ...]
    targets: tuple[str, ...]
    whatif: dict[str, float] = field(default_factory=dict)


class WorkloadFit:
    """The MAP fit of the free parameters for given layouts (see the module docstring)."""

    def __init__(self, headline: Headline, evaluate: Evaluator,
                 free: Sequence[FreeParameter] = FREE_PARAMETERS,
                 fixed: dict[str, float] | None = None):
        self.h, self.evaluate = headline, evaluate
        self.settings = evaluate.settings
        self.fixed = dict(fixed or {})
        self.free = [p for p in free if p.name not in self.fixed]
        self.all = list(free)

    def published(self, fid: str) -> float:
        return {"H1": self.h.throughput_tok_s_gpu, "H2": self.h.interactivity_tok_s_user,
                "H3": self.h.revenue_usd_gpu_h}[fid]

    def _params(self, x: np.ndarray) -> dict[str, float]:
        """Scenario values of log-space point `x`, inside their ranges (the surrogate step's
        bounds carry a 1e-12 margin, which would put a parameter at its limit just past it:
        `resent_output_share` 1.000000000001 fails the scenario's validation)."""
        out = {p.name: min(max(float(math.exp(v)), p.low), p.high)
               for p, v in zip(self.free, x, strict=True)}
        out.update(self.fixed)
        return out

    def _log_ratios(self, out: dict[str, float]) -> np.ndarray:
        """log(simulated / published) of H1, H2, H3."""
        return np.array([math.log(max(out[TARGET_KEYS[t]], 1e-9) / self.published(t))
                         for t in ("H1", "H2", "H3")])

    def residuals(self, log_ratios: np.ndarray, x: np.ndarray, targets: Sequence[str]
                  ) -> np.ndarray:
        """MAP residuals of a point: each target's log ratio over its sd, then each free
        parameter's log distance from its prior over the prior's width."""
        idx = [("H1", "H2", "H3").index(t) for t in targets]
        prior = np.log([p.prior for p in self.free])
        width = np.array([p.prior_width for p in self.free])
        return np.concatenate([log_ratios[idx] / self.settings.target_sigma,
                               (x - prior) / width])

    def best_start(self, layout: Layout, starts: Sequence[dict[str, float]],
                   targets: Sequence[str] = ("H1", "H2", "H3")) -> dict[str, float]:
        """The start with the smallest objective (the starts are simulated in parallel)."""
        outs = self.evaluate([(dict(st, **self.fixed), layout) for st in starts])
        costs = [float(np.sum(self.residuals(self._log_ratios(o),
                                             np.log([st[p.name] for p in self.free]),
                                             targets) ** 2))
                 for o, st in zip(outs, starts, strict=True)]
        return starts[int(np.argmin(costs))]

    def fit(self, layout: Layout, start: dict[str, float],
            targets: Sequence[str] = ("H1", "H2", "H3"),
            log: Callable[[str], None] = lambda s: None,
            max_evaluations: int | None = None) -> LayoutFit:
        """Trust-region surrogate search (module docstring): each round regresses a linear
        model of log(simulated / published) on the log parameters of the simulated points
        near the incumbent, solves the MAP problem on that model inside the trust region
        (scipy least_squares), and simulates the proposal and one exploratory point."""
        lo = np.log([p.low for p in self.free])
        hi = np.log([p.high for p in self.free])
        k = len(self.free)
        idx = [("H1", "H2", "H3").index(t) for t in targets]
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        outs: list[dict[str, float]] = []

        def simulate(points: list[np.ndarray]) -> None:
            res = self.evaluate([(self._params(x), layout) for x in points])
            for x, out in zip(points, res, strict=True):
                xs.append(x)
                ys.append(self._log_ratios(out))
                outs.append(out)
                log(f"  {layout_label(layout)} " + " ".join(
                    f"{p.name}={math.exp(v):.4g}" for p, v in zip(self.free, x, strict=True))
                    + " -> " + " ".join(f"{t} {math.exp(y) - 1:+.1%}"
                                        for t, y in zip(("H1", "H2", "H3"), ys[-1],
                                                        strict=True)))

        def cost(x: np.ndarray, y: np.ndarray) -> float:
            return float(np.sum(self.residuals(y, x, targets) ** 2))

        x0 = np.clip(np.log([start.get(p.name, p.prior) for p in self.free]), lo, hi)
        step = self.settings.design_step
        simulate([x0] + [np.clip(x0 + step * np.eye(k)[i] * (1 if x0[i] + step <= hi[i]
                                                             else -1), lo, hi)
                         for i in range(k)])
        radius = 0.5
        best = int(np.argmin([cost(x, y) for x, y in zip(xs, ys, strict=True)]))
        rng = np.random.default_rng(self.settings.seed)
        slope = np.zeros((3, k))
        for _ in range(max_evaluations or self.settings.max_evaluations):
            xb = xs[best]
            X, Y = np.array(xs), np.array(ys)
            w = np.exp(-np.sum((X - xb) ** 2, axis=1) / (2 * max(radius, 0.1) ** 2))
            A = np.hstack([np.ones((len(X), 1)), X - xb]) * np.sqrt(w)[:, None]
            coef, *_ = np.linalg.lstsq(A, Y * np.sqrt(w)[:, None], rcond=None)
            intercept, slope = coef[0], coef[1:].T

            def surrogate(x: np.ndarray, c: np.ndarray = intercept, m: np.ndarray = slope,
                          xb: np.ndarray = xb) -> np.ndarray:
                return self.residuals(c + m @ (x - xb), x, targets)

            box_lo, box_hi = np.maximum(lo, xb - radius), np.minimum(hi, xb + radius)
            prop = least_squares(surrogate, np.clip(xb, box_lo, box_hi),
                                 bounds=(box_lo, box_hi + 1e-12)).x
            explore = np.clip(prop + rng.normal(0, radius / 3, k), lo, hi)
            n = len(xs)
            simulate([prop, explore])
            costs = [cost(x, y) for x, y in zip(xs, ys, strict=True)]
            new_best = int(np.argmin(costs))
            radius = min(radius * 1.5, 2.0) if new_best >= n else max(radius / 2, 0.05)
            best = new_best
            if all(abs(math.exp(ys[best][i]) - 1) <= self.settings.tolerance / 2 for i in idx):
                break
        params, out = self._params(xs[best]), outs[best]
        errors = {t: out[TARGET_KEYS[t]] / self.published(t) - 1.0 for t in ("H1", "H2", "H3")}
        converged = all(abs(errors[t]) <= self.settings.tolerance for t in targets)
        width = np.array([p.prior_width for p in self.free])
        J = np.vstack([slope[idx] / self.settings.target_sigma, np.diag(1 / width)])
        cov = np.linalg.pinv(J.T @ J)
        sd = {p.name: float(math.sqrt(max(cov[i, i], 0.0))) for i, p in enumerate(self.free)}
        return LayoutFit(layout, params, out, errors, 0.5 * cost(xs[best], ys[best]),
                         converged, sd, tuple(p.name for p in self.free), tuple(targets))


def starting_points(h: Headline, layout: Layout, requests_per_rank: float,
                    free: Sequence[FreeParameter] = FREE_PARAMETERS) -> list[dict[str, float]]:
    """Candidate starts for the local fit (not results): a coarse grid over the quantities that
    set the token mix (new tokens per turn at the prior and at a tenth of it, output per turn
    at the prior and twice it, sessions at the prior length and four times it, the whole
    response re-sent or a third of it), each with the
    clients Little's law gives for the layout's calibrated decode depth: decode slots x
    (decode + tool + queue time) / decode time."""
    prior = {p.name: p.prior for p in free}
    ranges = {p.name: (p.low, p.high) for p in free}
    starts = []
    for nt, out, turns, share in itertools.product(
            (prior["new_tokens_median"], prior["new_tokens_median"] / 10),
            (prior["output_tokens_median"], 2 * prior["output_tokens_median"]),
            (prior["turns_median"], 4 * prior["turns_median"]),
            (prior["resent_output_share"], prior["resent_output_share"] / 3)):
        decode_s = 1.5 * out / h.accepted_tokens_per_step * h.p90_step_ms / 1e3
        cycle_s = decode_s + 2.0 * prior["tool_delay_s_median"] + 0.5
        pt = dict(prior, new_tokens_median=nt, output_tokens_median=out, turns_median=turns,
                  resent_output_share=share,
                  concurrency=requests_per_rank * layout.decode_gpus * cycle_s / decode_s)
        starts.append({k: min(max(v, ranges[k][0]), ranges[k][1]) for k, v in pt.items()})
    return starts
