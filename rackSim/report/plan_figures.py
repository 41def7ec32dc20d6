"""The plan's pictures (matplotlib, Agg): the Pareto view of every screened candidate and the
screen against the simulation for the confirmed ones. Each returns PNG bytes, so the HTML
page can embed them and the caller can also write them as files."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.text import OffsetFrom  # noqa: E402

from rackSim.report.sweep_plots import pareto_front  # noqa: E402

#: plans within this share of the screened ranges of the highest plan are labelled together
NEAR = 0.1


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def pareto_png(screened: pd.DataFrame, plans: pd.DataFrame, slo_interactivity: float) -> bytes:
    """Tokens/s/GPU against P90 tokens/s/user for every screened candidate (meets the SLOs or
    not), the frontier, the SLO line, the plans (stars) and, where simulated, the DES point
    joined to its screen point."""
    fig, ax = plt.subplots(figsize=(8, 5.2))
    ok = screened["feasible"].to_numpy()
    x = screened["interactivity_tok_s"].to_numpy()
    y = screened["throughput_tok_s_gpu"].to_numpy() / 1e3
    ax.scatter(x[~ok], y[~ok], s=6, c="0.75", label="misses an SLO or the budget")
    ax.scatter(x[ok], y[ok], s=6, c="tab:blue", label="meets the SLOs")
    f = np.flatnonzero(pareto_front(x, y))
    f = f[np.argsort(x[f])]
    if len(f):
        ax.plot(x[f], y[f], c="tab:red", lw=1, label="Pareto frontier")
    ax.axvline(slo_interactivity, c="k", ls="--", lw=1,
               label=f"SLO: {slo_interactivity:g} tok/s/user")
    # Plans often screen within a few percent of each other, and labels offset from each star
    # overlapped: the plans near the highest one are labelled in one column above it, 12
    # points apart in plan order; a plan far from it (a colocated fleet confirmed to compare)
    # beside its own star.
    px_all = plans["interactivity_tok_s"].to_numpy(float)
    py_all = plans["throughput_tok_s_gpu"].to_numpy(float) / 1e3
    if len(plans):
        top = py_all.argmax()
        column = OffsetFrom(ax.transData, (px_all[top], py_all[top]))
        near = ((np.abs(px_all - px_all[top]) <= NEAR * np.ptp(x))
                & (np.abs(py_all - py_all[top]) <= NEAR * np.ptp(y)))
        row = np.cumsum(near[::-1])[::-1] - 1  # 0 for the last near plan, the lowest line
    for i, (_, p) in enumerate(plans.iterrows()):
        px, py = px_all[i], py_all[i]
        ax.scatter([px], [py], marker="*", s=180, c="gold", edgecolors="k", zorder=5,
                   label="plans (screen)" if i == 0 else None)
        where = ({"textcoords": column, "xytext": (12, 12 + 12 * row[i])} if near[i] else
                 {"textcoords": "offset points", "xytext": (10, 8)})
        ax.annotate(f"{p['racks']} x {p['layout']}", (px, py), fontsize=8, **where,
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.4"})
        dx, dy = p.get("des_interactivity_tok_s"), p.get("des_throughput_tok_s_gpu")
        if dx is not None and dy is not None and np.isfinite(dx) and np.isfinite(dy):
            ax.scatter([dx], [dy / 1e3], marker="o", s=60, facecolors="none",
                       edgecolors="k", zorder=5, label="simulated (DES)" if i == 0 else None)
            ax.plot([px, dx], [py, dy / 1e3], c="k", lw=0.8, ls=":")
    ax.set_xlabel("P90 interactivity (tokens/s per user)")
    ax.set_ylabel("throughput (K tokens/s per GPU)")
    ax.set_title("Candidate fleets: throughput against interactivity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def screen_error_png(confirmed: pd.DataFrame) -> bytes:
    """The screen's relative error against the simulation, per confirmed candidate and
    metric (screen / DES - 1)."""
    metrics = [("err_throughput_tok_s_gpu", "tok/s/GPU"),
               ("err_interactivity_tok_s", "P90 tok/s/user"),
               ("err_ttft_p90_ms", "TTFT P90")]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    labels = [f"{r['racks']} x {r['layout']}\n{r['hardware']}" for _, r in confirmed.iterrows()]
    pos = np.arange(len(labels))
    width = 0.8 / len(metrics)
    for j, (col, name) in enumerate(metrics):
        vals = confirmed[col].to_numpy(dtype=float) * 100 if col in confirmed else \
            np.full(len(labels), np.nan)
        ax.bar(pos + (j - 1) * width, np.nan_to_num(vals), width, label=name)
    ax.axhline(0, c="k", lw=0.8)
    ax.set_xticks(pos, labels, fontsize=8)
    ax.set_ylabel("screen / DES - 1 (%)")
    ax.set_title("How far the screen was from the simulation")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)
