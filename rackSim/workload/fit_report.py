"""What `racksim-workload fit` writes: the fitted workload YAML and the goodness-of-fit report.

Goodness of fit compares the pool with sessions generated from the fit (as many as the pool,
at least `MIN_GENERATED`), through the same reading of each quantity (`generator_fit.observe`):
per quantity the two-sample KS distance and a QQ plot, and the prefix-reuse curve (reuse per
LRU capacity, the generated sessions in groups of the pool's size) and context-growth curve
(main-agent prompt tokens by turn) of both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from rackSim.report.plots import plain_log_axis  # noqa: E402
from rackSim.workload.agentx import AgentXSpec, generate_agentx  # noqa: E402
from rackSim.workload.generator_fit import GeneratorFit, observe  # noqa: E402
from rackSim.workload.graph import SessionGraph  # noqa: E402
from rackSim.workload.stats import context_growth_curve, reuse_curve  # noqa: E402

MIN_GENERATED = 200
REUSE_CAPACITIES: tuple[float | None, ...] = (
    *(float(2 ** k) for k in range(14, 25, 2)), None)


def write_workload_yaml(fit: GeneratorFit, pool: str, replay: dict[str, Any], path: Path,
                        confidence: float) -> None:
    """A workload scenario (source agentx) with every generator value marked FITTED to
    `pool` (estimate, CI, sample size) or ASSUMED (kept from the base, and why)."""
    by_q: dict[str, list] = {}
    for p in fit.params:
        by_q.setdefault(p.quantity, []).append(p)
    level = f"{confidence:.0%} CI"
    lines = [f"# AgentX-style workload FITTED to {pool} by maximum likelihood "
             "(racksim-workload fit;",
             f"# docs/agent_logs.md): {fit.sessions} sessions. FITTED lines give the {level} "
             "and the sample",
             "# size; ASSUMED lines keep the base spec's value.",
             f"name: {path.stem}", "source: agentx",
             f"num_sessions: {fit.sessions}  # FITTED to {pool}: its session count", "agentx:"]
    for key, value in fit.spec.model_dump().items():
        if key == "num_sessions":
            continue
        if isinstance(value, dict):
            body = ", ".join(f"{k}: {_num(v)}" for k, v in value.items() if v is not None)
            text = f"{{{body}}}"
        else:
            text = _num(value)
        if key in by_q:
            cis = ", ".join(f"{p.parameter} {_num(p.estimate)} [{_num(p.ci_low)}, "
                            f"{_num(p.ci_high)}]" for p in by_q[key])
            note = f"FITTED to {pool} (n={by_q[key][0].n}): {level} {cis}"
        elif key in fit.held:
            note = f"ASSUMED: base value, too few to fit ({fit.held[key]})"
        else:
            note = "ASSUMED: base value (not a fitted quantity)"
        lines.append(f"  {key}: {text}  # {note}")
    lines.append("replay:  # ASSUMED: the base scenario's replay policy")
    lines += [f"  {k}: {_num(v)}" for k, v in replay.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _num(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v).lower() if isinstance(v, bool) else str(v)
    return (".inf" if v > 0 else "-.inf") if math.isinf(v) else f"{v:.6g}"


def generated_pool(fit: GeneratorFit, seed: int) -> list[SessionGraph]:
    """Sessions generated from the fitted spec for the comparison."""
    return generate_agentx(fit.spec, seed, max(fit.sessions, MIN_GENERATED))


def goodness_of_fit(fit: GeneratorFit, generated: list[SessionGraph],
                    base: AgentXSpec) -> pd.DataFrame:
    """Per quantity: samples in the pool and generated, KS distance and its p-value."""
    gen = observe(generated, base)
    rows = []
    pairs = {**{q: (fit.observations.samples[q], gen.samples[q])
                for q in fit.observations.samples},
             "fanout": (fit.observations.fanouts, gen.fanouts)}
    for q, (a, b) in pairs.items():
        if len(a) and len(b):
            ks = stats.ks_2samp(a, b)
            rows.append((q, len(a), len(b), float(ks.statistic), float(ks.pvalue)))
        else:
            rows.append((q, len(a), len(b), math.nan, math.nan))
    return pd.DataFrame(rows, columns=["quantity", "n_pool", "n_generated", "ks_distance",
                                       "ks_p_value"])


def curves(pool: list[SessionGraph], generated: list[SessionGraph]
           ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(reuse per LRU capacity, main-agent prompt by turn) of the pool and the generated
    sessions, tidy with a `source` column.

    Reuse at a finite capacity depends on how many sessions share the cache (their
    nominal timelines all start at 0): the generated sessions are taken in groups of the
    pool's size and their reuse averaged. Read as one set of 200, a 60-session pool's own
    generator reused 0.17-0.22 at 1M tokens against the pool's 0.65."""
    n = len(pool)
    groups = [generated[i:i + n] for i in range(0, len(generated) - n + 1, n)] or [generated]
    generated_reuse = (pd.concat([reuse_curve(g, REUSE_CAPACITIES) for g in groups])
                       .groupby("capacity_tokens", sort=False, as_index=False)["reuse"].mean())
    reuse = pd.concat([reuse_curve(pool, REUSE_CAPACITIES).assign(source="pool"),
                       generated_reuse.assign(source="generated")])
    growth = pd.concat([context_growth_curve(g).assign(source=name)
                        for name, g in (("pool", pool), ("generated", generated))])
    return reuse.reset_index(drop=True), growth.reset_index(drop=True)


def plot_qq(fit: GeneratorFit, generated: list[SessionGraph], base: AgentXSpec,
            gof: pd.DataFrame, path: Path) -> None:
    """One QQ panel per quantity: pool quantiles against generated quantiles."""
    gen = observe(generated, base)
    pairs = [(q, fit.observations.samples[q], gen.samples[q])
             for q in fit.observations.samples] + [("fanout", fit.observations.fanouts,
                                                     gen.fanouts)]
    pairs = [p for p in pairs if len(p[1]) and len(p[2])]
    cols = 4
    fig, axes = plt.subplots(math.ceil(len(pairs) / cols), cols, figsize=(14, 3.3 * math.ceil(
        len(pairs) / cols)), squeeze=False)
    ks = dict(zip(gof["quantity"], gof["ks_distance"], strict=True))
    probs = np.linspace(0.01, 0.99, 99)
    for ax, (q, a, b) in zip(axes.flat, pairs, strict=False):
        qa, qb = np.quantile(a, probs), np.quantile(b, probs)
        ax.plot(qb, qa, ".", ms=3)
        lo, hi = min(qa.min(), qb.min()), max(qa.max(), qb.max())
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.7)
        if lo > 0 and hi > 10 * lo:  # a decade or more; within one, plain linear axes
            ax.set(xscale="log", yscale="log")
            plain_log_axis(ax.xaxis)
            plain_log_axis(ax.yaxis)
        ax.set(title=f"{q}  KS {ks[q]:.3f}", xlabel="generated", ylabel="pool")
    for ax in list(axes.flat)[len(pairs):]:
        ax.axis("off")
    fig.suptitle("QQ: pool vs sessions generated from the fit (1st-99th percentiles)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_curves(reuse: pd.DataFrame, growth: pd.DataFrame, path: Path) -> None:
    """Prefix reuse per cache capacity and context growth by turn, pool vs generated."""
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, df in reuse.groupby("source"):
        finite = df[np.isfinite(df["capacity_tokens"])]
        line, = ax[0].plot(finite["capacity_tokens"], finite["reuse"], "o-", label=name)
        ax[0].axhline(df["reuse"].iloc[-1], color=line.get_color(), ls=":", lw=0.8)
    ax[0].set(xscale="log", ylim=(0, 1), xlabel="LRU capacity (tokens; dotted: infinite)",
              ylabel="cached / prompt tokens", title="prefix reuse")
    ax[0].legend()
    for name, df in growth.groupby("source"):
        df = df[df["sessions"] >= 5]
        ax[1].plot(df["turn"], df["prompt_p50"], label=f"{name} (median)")
    ax[1].set(xlabel="main-agent turn", ylabel="prompt tokens",
              title="context growth (turns with >= 5 sessions)")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

