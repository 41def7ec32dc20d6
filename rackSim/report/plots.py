"""PNG figures of one run (headless matplotlib)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from rackSim.metrics.summary import (  # noqa: E402
    TTFT_STAGES,
    Result,
    ttft_stages_ms,
    window_steps,
)
from rackSim.perf.step import COMPONENTS  # noqa: E402
from rackSim.report.files import FIGURE_FILES  # noqa: E402

PERCENTILE_STYLES = ((50, "-"), (90, "--"), (99, ":"))


def save_figure(fig: plt.Figure, path: Path) -> Path:
    """Lay out, write as PNG and close `fig`."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class _PlainLogLabels(matplotlib.ticker.Formatter):
    """Plain numbers (10000, not 1e4); on the minor ticks only where the axis gives each
    decade room for three labels (at least `INCHES_PER_DECADE`)."""

    INCHES_PER_DECADE = 1.6

    def __init__(self, minor: bool):
        self.minor = minor

    def __call__(self, x: float, pos: int | None = None) -> str:
        if self.minor:
            lo, hi = self.axis.get_view_interval()
            box = self.axis.axes.bbox
            inches = (box.width if self.axis.axis_name == "x" else box.height) / \
                self.axis.figure.dpi
            if lo <= 0 or math.log10(hi / lo) * self.INCHES_PER_DECADE > inches:
                return ""
        return f"{x:g}"


def plain_log_axis(axis: matplotlib.axis.Axis) -> None:
    """Labels of a log axis as plain numbers at 1 (and, where there is room, 2 and 5) of each
    decade: matplotlib's own label the minor ticks of a narrow range in scientific notation
    that runs together."""
    axis.set_major_formatter(_PlainLogLabels(minor=False))
    axis.set_minor_locator(matplotlib.ticker.LogLocator(subs=(2.0, 5.0)))
    axis.set_minor_formatter(_PlainLogLabels(minor=True))


def mark_percentiles(ax: plt.Axes, percentile) -> None:  # noqa: ANN001 - q -> value
    """Vertical lines at P50 / P90 / P99, `percentile(q)` giving each value."""
    for q, style in PERCENTILE_STYLES:
        ax.axvline(percentile(q), color="k", ls=style, label=f"P{q}")
    ax.legend()


def plot_throughput(result: Result, path: Path) -> Path:
    ts = result.timeseries
    fig, ax = plt.subplots(figsize=(9.5, 4))
    if not ts.empty:
        # bucket starts, then the window's end: a post step draws each bucket over its own
        # time (without the end, the last bucket had no width and the last minute was missing)
        t = np.append(ts["t_s"].to_numpy(float), result.summary["window_s"]) / 60
        last = ts.iloc[[-1]]
        ax.stackplot(t, *(np.append(ts[k], last[k]) for k in ("cached", "uncached", "output")),
                     labels=["cached input", "uncached input", "output"], step="post")
        # beside the axes: inside, it covered the stack it names (filled from 0 up)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    else:  # a run interrupted before its window began
        ax.text(0.5, 0.5, "no measurement window simulated", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("time in window (min)")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title("Throughput over the measurement window")
    return save_figure(fig, path)


def stacked_barh(ax: plt.Axes, bars: pd.DataFrame, labels: list[str]) -> tuple[np.ndarray,
                                                                                   np.ndarray]:
    """One horizontal bar per row of `bars`, the first at the top, its columns stacked left to
    right under `labels` (NaN as 0); returns the bars' positions and totals."""
    y = np.arange(len(bars))
    left = np.zeros(len(bars))
    for col, label in zip(bars.columns, labels, strict=True):
        v = pd.to_numeric(bars[col], errors="coerce").fillna(0).to_numpy(float)
        ax.barh(y, v, left=left, label=label)
        left += v
    ax.invert_yaxis()
    return y, left


def ttft_stage_bars(requests: pd.DataFrame) -> pd.DataFrame:
    """Mean time (ms) of each TTFT stage (`TTFT_STAGES`) over `requests` (rows "all") and
    over the slowest tenth of them (TTFT at or above its P90: what the tail is made of);
    empty when the records have no stage times (a measured run)."""
    names = [stage for stage, _, _, _ in TTFT_STAGES]
    cols = {c for _, a, b, _ in TTFT_STAGES for c in (a, b)}
    if not cols <= set(requests.columns):
        return pd.DataFrame(columns=names)
    parts = ttft_stages_ms(requests).dropna()
    if parts.empty:
        return pd.DataFrame(columns=names)
    ttft = parts.sum(axis=1)
    slow = parts[ttft >= np.percentile(ttft, 90)]
    return pd.DataFrame([parts.mean(), slow.mean()], index=["all", "slowest 10 %"])


def _plot_ttft_stages(ax: plt.Axes, requests: pd.DataFrame) -> None:
    bars = ttft_stage_bars(requests)
    if bars.empty:
        ax.text(0.5, 0.5, "no stage times (a measured run)", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return
    y, totals = stacked_barh(ax, bars, [label for *_, label in TTFT_STAGES])
    for yi, total in zip(y, totals, strict=True):
        ax.text(total, yi, f" {total:,.0f} ms", va="center", fontsize=8)
    ax.set_yticks(y, [f"{name} (mean)" for name in bars.index])
    ax.set_xlim(0, 1.12 * totals.max() if totals.max() > 0 else 1.0)  # room for the totals
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_xlabel("time from send to first token (ms)")
    ax.set_title("TTFT by stage")


def plot_latency(result: Result, path: Path) -> Path:
    """TTFT, inter-token latency and per-request TPOT distributions over the window's
    requests, and beneath them the TTFT split by stage (the mean, and the slowest tenth's)."""
    df = result.requests
    win = df[(df["phase"] == "window") & df["error"].isna()]
    fig = plt.figure(figsize=(13, 6.4))
    grid = fig.add_gridspec(2, 3, height_ratios=(3, 1.4))
    axes = [fig.add_subplot(grid[0, i]) for i in range(3)]
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
        plain_log_axis(ax.xaxis)  # a spread of 1.5-2 ms with a tail to 20 showed only '10'
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_ylabel("tokens")
    ax.set_title("Inter-token latency (token-weighted)")
    _plot_ttft_stages(fig.add_subplot(grid[1, :]), win)
    return save_figure(fig, path)


#: instances drawn one bar each; past this many, the mean and the slowest and fastest
BREAKDOWN_BARS = 12


def decode_breakdown_bars(steps: pd.DataFrame, t0: float, t1: float
                          ) -> tuple[str, pd.DataFrame]:
    """The bars of the decode breakdown figure: (title, mean ms by component per bar).

    Over the window's steps (started in [t0, t1), s) of the decode instances, or of the
    colocated ones when there are none (their steps mix prefill chunks in). One bar per
    instance; a fleet of more than BREAKDOWN_BARS instances gets three: the mean over all
    their steps, the instance with the longest mean step and the one with the shortest."""
    title = "Decode step breakdown over the window"
    rows = window_steps(steps, t0, t1, "decode")
    if rows.empty:
        rows = window_steps(steps, t0, t1, "colocated")
        title = "Step breakdown over the window (colocated: prefill chunks mixed in)"
    cols = [f"{c}_ms" for c in COMPONENTS]
    per = rows.groupby("instance", sort=False)[cols].mean()
    per = per.loc[sorted(per.index, key=lambda n: (len(n), n))]  # decode-2 before decode-10
    per.columns = list(COMPONENTS)
    if len(per) > BREAKDOWN_BARS:
        total = per.sum(axis=1)
        slow, fast = total.idxmax(), total.idxmin()
        per = pd.DataFrame([rows[cols].mean().to_numpy(), per.loc[slow].to_numpy(),
                            per.loc[fast].to_numpy()],
                           index=[f"all {len(per)}", f"slowest {slow}", f"fastest {fast}"],
                           columns=list(COMPONENTS))
    return title, per


def plot_decode_breakdown(result: Result, path: Path) -> Path:
    """Mean decode step time by component over the window, one bar per decode instance."""
    t0, t1 = (result.summary.get(k) for k in ("window_start_s", "window_end_s"))
    title, bars = decode_breakdown_bars(result.steps, -math.inf if t0 is None else t0,
                                        math.inf if t1 is None else t1)  # none: every step
    fig, ax = plt.subplots(figsize=(8.5, max(3.2, 2.2 + 0.35 * len(bars))))
    if not bars.empty:
        y, totals = stacked_barh(ax, bars[list(COMPONENTS)], list(COMPONENTS))
        ax.set_yticks(y, bars.index)
        ax.set_xlim(0, 1.03 * totals.max() if totals.max() > 0 else 1.0)
        # beside the bars, where it cannot cover the axis label
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_xlabel("mean step time (ms)")
    ax.set_title(title)
    return save_figure(fig, path)


def plot_run(result: Result, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [plot_throughput(result, out / FIGURE_FILES["throughput"]),
            plot_latency(result, out / FIGURE_FILES["latency"]),
            plot_decode_breakdown(result, out / FIGURE_FILES["decode_breakdown"])]
