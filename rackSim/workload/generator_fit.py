"""Fit the AgentX-style generator to a session-graph pool by maximum likelihood
(`racksim-workload fit`; docs/agent_logs.md).

Each generator quantity is read off the graphs the way `agentx._Session` builds them:

* `turns` / `subagent_turns`: requests of the main / each subagent chain, less its compaction
  requests; `output_tokens`: every request but compactions, whose outputs are
  `summary_tokens`. A compaction is a request whose same-agent child sends less than its
  prompt as prefix, waits on it alone and has no delay (imported logs do not log it: their
  resets are turns).
* `new_tokens`: a turn's prompt less its parent's prompt and re-sent output
  (`resent_output_share`, held), after a compaction its new tokens less the summary; joins
  (which also read subagent answers) and log resets are left out.
* `tool_delay_s`: every delay before a turn or a subagent's first request.
* `system_tokens`: per session, the prefix of its first subagent or post-compaction request;
  `task_tokens`: the first prompt less that; `subagent_task_tokens`: a subagent's first new
  tokens.
* `subagent_prob`: forks per fork opportunity (turns after the first of every chain allowed
  to fork); `fanout`: subagents per fork.

Lognormals are fitted with the generator's clipping and rounding in the likelihood: a count k
is the interval [k - 1/2, k + 1/2] of the latent lognormal (delays: 1 ms), an observation at a
clip bound `min` / `max` is censored below / above it. Confidence intervals: Wald intervals on
(log median, log sigma) from the observed information; exact binomial for `subagent_prob`;
for `fanout` (uniform integers) the range whose largest spread the sample reaches with the
confidence. Quantities with fewer than `MIN_SAMPLES` observations keep the base spec's value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats
from scipy.special import log_ndtr

from rackSim.workload.agentx import AgentXSpec, Dist
from rackSim.workload.graph import SessionGraph

MIN_SAMPLES = 10
LOGNORMAL_QUANTITIES = ("system_tokens", "task_tokens", "turns", "new_tokens", "output_tokens",
                        "tool_delay_s", "subagent_task_tokens", "subagent_turns",
                        "summary_tokens")
RESOLUTION = {"tool_delay_s": 1e-3}  # others are counts (resolution 1)


@dataclass
class Observations:
    """Samples of each generator quantity (units as in AgentXSpec), fork counts."""

    samples: dict[str, list[float]] = field(
        default_factory=lambda: {q: [] for q in LOGNORMAL_QUANTITIES})
    fork_opportunities: int = 0
    fanouts: list[int] = field(default_factory=list)


def observe(graphs: Sequence[SessionGraph], base: AgentXSpec) -> Observations:
    """Read every generator quantity off `graphs` (module docstring)."""
    obs = Observations()
    for g in graphs:
        _observe_session(g, base, obs)
    return obs


def _observe_session(g: SessionGraph, base: AgentXSpec, obs: Observations) -> None:
    reqs = g.requests
    s = obs.samples
    children: dict[int, list[int]] = {}
    for r in reqs:
        if r.parent is not None and reqs[r.parent].agent == r.agent:
            children.setdefault(r.parent, []).append(r.rid)
    compaction = {r.parent for r in reqs if r.parent is not None
                  and reqs[r.parent].agent == r.agent
                  and r.prefix_tokens < reqs[r.parent].prompt_tokens
                  and r.after == (r.parent,) and r.delay_s == 0}
    depth = {0: 0}
    per_agent: dict[int, int] = {}
    heads: dict[int, int] = {}
    system = None
    for r in reqs:
        per_agent[r.agent] = per_agent.get(r.agent, 0) + (r.rid not in compaction)
        if r.rid in compaction:
            s["summary_tokens"].append(r.output_tokens)
        else:
            s["output_tokens"].append(r.output_tokens)
        p = reqs[r.parent] if r.parent is not None else None
        if p is None:
            continue
        if p.agent != r.agent:  # a subagent's first request
            depth[r.agent] = depth.get(p.agent, 0) + 1
            heads[r.parent] = heads.get(r.parent, 0) + 1
            s["subagent_task_tokens"].append(r.new_tokens)
            s["tool_delay_s"].append(r.delay_s)
            if base.subagent_prefix == "system" and system is None:
                system = r.prefix_tokens
        elif p.rid in compaction:  # continues from the system prompt + the summary
            s["new_tokens"].append(r.new_tokens - p.output_tokens)
            system = r.prefix_tokens if system is None else system
        else:  # a turn, or a compaction request (both wait the tool delay)
            s["tool_delay_s"].append(r.delay_s)
            if r.rid not in compaction and len(r.after) == 1 \
                    and r.prefix_tokens >= p.prompt_tokens:
                resent = round(base.resent_output_share * p.output_tokens)
                s["new_tokens"].append(r.prompt_tokens - p.prompt_tokens - resent)
    for agent, n in per_agent.items():
        s["turns" if agent == 0 else "subagent_turns"].append(n)
        if depth.get(agent, 0) < base.subagent_max_depth:
            obs.fork_opportunities += n - 1
    obs.fanouts += heads.values()
    if system is not None:
        s["system_tokens"].append(system)
        s["task_tokens"].append(reqs[0].prompt_tokens - system)


@dataclass(frozen=True)
class ParamFit:
    """One fitted parameter: estimate, confidence interval, sample size."""

    quantity: str
    parameter: str
    estimate: float
    ci_low: float
    ci_high: float
    n: int


def _log_interval(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log(Phi(b) - Phi(a)) for a < b, accurate in both tails."""
    flip = a > 0
    lo, hi = np.where(flip, -b, a), np.where(flip, -a, b)
    la, lb = log_ndtr(lo), log_ndtr(hi)
    return lb + np.log1p(-np.exp(la - lb))


def fit_lognormal(quantity: str, values: Sequence[float], bounds: Dist,
                  resolution: float = 1.0, confidence: float = 0.95
                  ) -> tuple[Dist, list[ParamFit]]:
    """MLE (median, sigma) of a lognormal clipped to `bounds`' [min, max] and rounded to
    `resolution`; the fitted Dist keeps those bounds."""
    x = np.asarray(values, dtype=float)
    half = resolution / 2
    below, above = x - half <= bounds.min, x + half >= bounds.max
    lo = np.where(below, 0.0, np.minimum(x, bounds.max) - half)
    hi = np.where(above, np.inf, np.maximum(x, bounds.min) + half)
    with np.errstate(divide="ignore"):
        llo, lhi = np.log(lo), np.log(hi)

    def nll(theta: np.ndarray) -> float:
        mu, log_s = theta
        s = math.exp(log_s)
        return -float(_log_interval((llo - mu) / s, (lhi - mu) / s).sum())

    mid = np.log(np.clip(x, max(bounds.min, half), None))
    start = np.array([mid.mean(), math.log(max(mid.std(), 1e-3))])
    res = optimize.minimize(nll, start, method="Nelder-Mead",
                            options={"xatol": 1e-7, "fatol": 1e-9, "maxiter": 4000})
    if not res.success:
        raise ValueError(f"lognormal fit did not converge ({res.message})")
    cov = np.linalg.inv(_hessian(nll, res.x))
    z = stats.norm.ppf(0.5 + confidence / 2)
    (mu, log_s), se = res.x, np.sqrt(np.diag(cov))
    n = len(x)
    rows = [ParamFit(quantity, "median", math.exp(mu), math.exp(mu - z * se[0]),
                     math.exp(mu + z * se[0]), n),
            ParamFit(quantity, "sigma", math.exp(log_s), math.exp(log_s - z * se[1]),
                     math.exp(log_s + z * se[1]), n)]
    dist = Dist(kind="lognormal", median=float(f"{math.exp(mu):.6g}"),
                sigma=float(f"{math.exp(log_s):.6g}"), min=bounds.min, max=bounds.max)
    return dist, rows


def _hessian(f, x: np.ndarray, step: float = 1e-4) -> np.ndarray:
    """Central-difference Hessian of a scalar function of a short vector."""
    n = len(x)
    h = np.zeros((n, n))
    for i in range(n):
        for j in range(i, n):
            e_i, e_j = np.eye(n)[i] * step, np.eye(n)[j] * step
            h[i, j] = h[j, i] = (f(x + e_i + e_j) - f(x + e_i - e_j) - f(x - e_i + e_j)
                                 + f(x - e_i - e_j)) / (4 * step * step)
    return h


def fit_fanout(fanouts: Sequence[int], confidence: float = 0.95) -> tuple[Dist, list[ParamFit]]:
    """Uniform integers: MLE low / high = the sample's min / max; each interval holds the
    bounds whose range the sample's spread reaches with probability >= 1 - confidence."""
    f = np.asarray(fanouts)
    low, high, n = int(f.min()), int(f.max()), len(f)
    spread = high - low + 1
    widest = math.floor(spread * (1 - confidence) ** (-1 / n))
    extra = widest - spread
    return (Dist(kind="randint", low=low, high=high),
            [ParamFit("fanout", "low", low, max(1, low - extra), low, n),
             ParamFit("fanout", "high", high, high, high + extra, n)])


@dataclass
class GeneratorFit:
    """The fitted spec, one row per fitted parameter, the quantities held at the base."""

    spec: AgentXSpec
    params: list[ParamFit]
    held: dict[str, str]            # quantity -> why it kept the base value
    observations: Observations
    sessions: int


def fit_generator(graphs: Sequence[SessionGraph], base: AgentXSpec | None = None,
                  confidence: float = 0.95) -> GeneratorFit:
    """Maximum-likelihood AgentX parameters of `graphs` (module docstring); quantities with
    too few samples keep the values of `base` (None: the generator defaults)."""
    base = base or AgentXSpec()
    if not graphs:
        raise ValueError("empty pool: nothing to fit")
    obs = observe(graphs, base)
    update: dict[str, object] = {"num_sessions": len(graphs)}
    params: list[ParamFit] = []
    held: dict[str, str] = {}
    for q in LOGNORMAL_QUANTITIES:
        values = obs.samples[q]
        if len(values) < MIN_SAMPLES:
            held[q] = f"{len(values)} samples (< {MIN_SAMPLES})"
            continue
        update[q], rows = fit_lognormal(q, values, getattr(base, q), RESOLUTION.get(q, 1.0),
                                        confidence)
        params += rows
    if obs.fork_opportunities >= MIN_SAMPLES:
        k, n = len(obs.fanouts), obs.fork_opportunities
        ci = stats.binomtest(k, n).proportion_ci(confidence, method="exact")
        update["subagent_prob"] = k / n
        params.append(ParamFit("subagent_prob", "value", k / n, ci.low, ci.high, n))
    else:
        held["subagent_prob"] = f"{obs.fork_opportunities} fork opportunities"
    if len(obs.fanouts) >= MIN_SAMPLES:
        update["fanout"], rows = fit_fanout(obs.fanouts, confidence)
        params += rows
    else:
        held["fanout"] = f"{len(obs.fanouts)} forks (< {MIN_SAMPLES})"
    spec = AgentXSpec.model_validate({**base.model_dump(), **{
        k: v.model_dump() if isinstance(v, Dist) else v for k, v in update.items()}})
    return GeneratorFit(spec, params, held, obs, len(graphs))
