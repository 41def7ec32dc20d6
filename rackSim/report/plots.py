"""PNG figures of one run (headless matplotlib)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rackSim.metrics.summary import Result  # noqa: E402
from rackSim.perf.step import COMPONENTS  # noqa: E402

PERCENTILE_STYLES = ((50, "-"), (90, "--"), (99, ":"))


def save_figure(fig: plt.Figure, path: Path) -> Path:
    """Lay out, write as PNG and close `fig`."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def mark_percentiles(ax: plt.Axes, percentile) -> None:  # noqa: ANN001 - q -> value
    """Vertical lines at P50 / P90 / P99, `percentile(q)` giving each value."""
    for q, style in PERCENTILE_STYLES:
        ax.axvline(percentile(q), color="k", ls=style, label=f"P{q}")
    ax.legend()


def plot_throughput(result: Result, path: Path) -> Path:
    ts = result.timeseries
    fig, ax = plt.subplots(figsize=(8, 4))
    if not ts.empty:
        t = ts["t_s"] / 60
        ax.stackplot(t, ts["cached"], ts["uncached"], ts["output"],
                     labels=["cached input", "uncached input", "output"], step="post")
    ax.set_xlabel("time in window (min)")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title("Throughput over the measurement window")
    ax.legend(loc="lower right")
    return save_figure(fig, path)


def plot_latency(result: Result, path: Path) -> Path:
    df = result.requests
    win = df[(df["phase"] == "window") & df["error"].isna()]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, col, title in ((axes[0], "ttft_ms", "TTFT"), (axes[2], "tpot_ms", "per-request TPOT")):
        vals = win[col].dropna().to_numpy()
        if vals.size:
            ax.hist(vals, bins=60, color="tab:blue")
            mark_percentiles(ax, lambda q, v=vals: np.percentile(v, q))
        ax.set_xlabel(f"{title} (ms)")
        ax.set_ylabel("requests")
        ax.set_title(title)
    h = result.itl
    e = h.edges()
    nz = np.nonzero(h.weights)[0]
    ax = axes[1]
    if nz.size:
        lo, hi = nz[0], nz[-1] + 1
        k = max(1, (hi - lo) // 60)  # display ~60 bins: 1%-wide bins look like a comb
        hi = lo + -(-(hi - lo) // k) * k
        w = np.pad(h.weights[lo:hi], (0, max(0, hi - lo - h.weights[lo:hi].size)))
        ax.stairs(w.reshape(-1, k).sum(axis=1), e[lo:hi + 1:k], fill=True, color="tab:orange")
        mark_percentiles(ax, h.percentile)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_ylabel("tokens")
    ax.set_title("Inter-token latency (token-weighted)")
    return save_figure(fig, path)


def plot_decode_breakdown(result: Result, path: Path) -> Path:
    """Mean decode step time by component over the window."""
    s = result.steps
    dec = s[s["instance"] == "decode"]
    fig, ax = plt.subplots(figsize=(7, 4))
    if not dec.empty:
        means = [dec[f"{c}_ms"].mean() for c in COMPONENTS]
        left = 0.0
        for c, v in zip(COMPONENTS, means, strict=True):
            ax.barh([0], [v], left=left, label=c)
            left += v
        ax.set_yticks([])
        ax.legend(ncol=5, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    ax.set_xlabel("mean decode step time (ms)")
    ax.set_title("Decode step breakdown")
    return save_figure(fig, path)


def plot_run(result: Result, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [plot_throughput(result, out / "throughput.png"),
            plot_latency(result, out / "latency.png"),
            plot_decode_breakdown(result, out / "decode_breakdown.png")]
