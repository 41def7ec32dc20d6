"""PNG figures of a sweep (headless matplotlib), from its table and its job directories.

- `pareto.png`: tokens/s/GPU against interactivity, every scenario labelled by its layout, the
  non-dominated frontier drawn through.
- `economics.png`: revenue and margin per GPU-hour against interactivity.
- `decode_breakdown.png`: mean decode step time by component, stacked, per DEP width (per
  scenario when the sweep varies more than the width).
- `latency.png`: TTFT (per request) and inter-token latency (token-weighted) distributions.
- `ttft_stages.png`: the mean TTFT split by stage (prefill wait, prefill, KV, decode wait,
  first step), one bar per scenario.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from rackSim.metrics.summary import TTFT_STAGES  # noqa: E402
from rackSim.perf.step import COMPONENTS  # noqa: E402
from rackSim.report.plots import plain_log_axis, save_figure, stacked_barh  # noqa: E402
from rackSim.report.sweep_table import STATUS_COLUMNS  # noqa: E402

X, Y = "interactivity_tok_s", "throughput_tok_s_gpu"
LAYOUT_KEYS = ("deployment.decode.gpus", "deployment.prefill.instances",
               "deployment.prefill.gpus_per_instance", "deployment.decode.parallelism",
               "deployment.prefill.parallelism", "deployment")
MAX_LABELLED = 40
MAX_CURVES = 12
SHORT = {"concurrency": "c", "kv_load_cap_per_step": "cap", "mode": "kv",
         "accepted_tokens_per_step": "acc", "max_num_seqs_per_rank": "seqs/rank"}


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mask of the points no other point beats on both x and y (higher is better on both)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = ~(np.isnan(x) | np.isnan(y))
    front = np.zeros(len(x), bool)
    for i in np.flatnonzero(ok):
        ge = (x[ok] >= x[i]) & (y[ok] >= y[i])
        gt = (x[ok] > x[i]) | (y[ok] > y[i])
        front[i] = not (ge & gt).any()
    return front


def varied_keys(table: pd.DataFrame) -> list[str]:
    """Overridden keys whose value differs between scenarios."""
    first_metric = table.columns.get_loc(STATUS_COLUMNS[0])
    keys = table.columns[:first_metric]
    return [k for k in keys if table[k].astype(str).nunique() > 1]


def point_labels(table: pd.DataFrame) -> list[str]:
    """Each scenario's layout, plus the other varied keys (short names) when they vary."""
    extra = [k for k in varied_keys(table) if k not in LAYOUT_KEYS]
    labels = []
    for _, row in table.iterrows():
        parts = [str(row.get("layout") or "?")]
        parts += [f"{_short(k)}={row[k]}" for k in extra]
        labels.append(" ".join(parts))
    return labels


def _short(key: str) -> str:
    last = key.rsplit(".", 1)[-1]
    return SHORT.get(last, last)


def _ok(table: pd.DataFrame) -> pd.DataFrame:
    if X not in table.columns:  # no scenario of the sweep finished
        return table.iloc[:0]
    return table[(table["status"] == "ok") & table[X].notna()].reset_index(drop=True)


def _annotate(ax: plt.Axes, x: np.ndarray, y: np.ndarray, labels: list[str],
              mask: np.ndarray) -> None:
    """Label the masked points (to the left of points in the right third, so labels stay in
    the axes); a label that would sit on top of one already placed (points within 3% of the
    x and y ranges) is left out."""
    x_min = float(np.min(x)) if len(x) else 0.0
    span_x = max(np.ptp(x), 1e-9) if len(x) else 1.0
    span_y = max(np.ptp(y), 1e-9) if len(y) else 1.0
    placed: list[tuple[float, float]] = []
    for xi, yi, text, m in zip(x, y, labels, mask, strict=True):
        if not m or any(abs(xi - px) < 0.03 * span_x and abs(yi - py) < 0.03 * span_y
                        for px, py in placed):
            continue
        placed.append((xi, yi))
        left = (xi - x_min) / span_x > 0.67
        a = ax.annotate(text, (xi, yi), xytext=(-4 if left else 4, 4), fontsize=7,
                        textcoords="offset points", ha="right" if left else "left")
        a.set_in_layout(False)


def plot_pareto(table: pd.DataFrame, path: Path) -> Path:
    ok = _ok(table)
    fig, ax = plt.subplots(figsize=(9, 6))
    if not ok.empty:
        x, y = ok[X].to_numpy(float), ok[Y].to_numpy(float)
        front = pareto_front(x, y)
        if not front.all():  # no legend entry for points that are not there
            ax.scatter(x[~front], y[~front], color="tab:gray", label="dominated")
        order = np.argsort(x[front])
        ax.plot(x[front][order], y[front][order], "o-", color="tab:red", label="Pareto frontier")
        labelled = np.ones(len(ok), bool) if len(ok) <= MAX_LABELLED else front
        _annotate(ax, x, y, point_labels(ok), labelled)
        ax.legend()
    ax.margins(x=0.08, y=0.08)
    failed = int((table["status"] != "ok").sum())
    ax.set_xlabel("interactivity, 1 / P90 inter-token latency (tokens/s per user)")
    ax.set_ylabel("throughput (tokens/s per GPU)")
    ax.set_title(f"Throughput vs interactivity: {len(ok)} scenarios"
                 + (f" ({failed} failed, not shown)" if failed else ""))
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_economics(table: pd.DataFrame, path: Path) -> Path:
    ok = _ok(table)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharex=True)
    labels = point_labels(ok)
    for ax, col, title in ((axes[0], "revenue_usd_gpu_h", "Revenue"),
                           (axes[1], "margin_usd_gpu_h", "Margin (revenue - GPU cost)")):
        if not ok.empty:
            x, y = ok[X].to_numpy(float), ok[col].to_numpy(float)
            ax.scatter(x, y, color="tab:blue" if col.startswith("rev") else "tab:green")
            _annotate(ax, x, y, labels, np.full(len(ok), len(ok) <= MAX_LABELLED))
            ax.margins(x=0.08, y=0.08)
        if col.startswith("rev") and not ok.empty:
            for cost in sorted(ok["cost_usd_gpu_h"].dropna().unique()):
                ax.axhline(cost, color="tab:red", ls="--", lw=1, label=f"GPU cost ${cost:.2f}/h")
            ax.legend()
        else:
            ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel("interactivity (tokens/s per user)")
        ax.set_ylabel("$ per GPU-hour")
        ax.set_title(f"{title} per GPU-hour")
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_breakdown_by_width(table: pd.DataFrame, path: Path) -> Path:
    """Stacked mean decode step components, one bar per DEP width (mean over the scenarios
    at that width) or one per scenario when the sweep varies more than the width."""
    ok = _ok(table)
    cols = [f"decode_{c}_ms" for c in COMPONENTS if f"decode_{c}_ms" in ok.columns]
    fig, ax = plt.subplots(figsize=(10, 5.5))
    if ok.empty or not cols or "decode_gpus" not in ok.columns:
        ax.text(0.5, 0.5, "no decode breakdown in this table", ha="center", transform=ax.transAxes)
        return save_figure(fig, path)
    ok = ok.sort_values("decode_gpus", kind="stable")
    per_width = ok["decode_gpus"].nunique() == len(ok) or len(ok) > MAX_LABELLED
    if per_width:
        bars = ok.groupby("decode_gpus")[cols].mean()
        names = [f"DEP{int(w)}" for w in bars.index]
    else:
        bars = ok[cols].reset_index(drop=True)
        names = point_labels(ok)
    bottom = np.zeros(len(bars))
    colours = plt.get_cmap("tab10").colors
    for i, c in enumerate(cols):
        v = bars[c].fillna(0).to_numpy(float)
        if v.any():
            ax.bar(range(len(bars)), v, bottom=bottom, color=colours[i % 10],
                   label=c.removeprefix("decode_").removesuffix("_ms"))
        bottom += v
    # room above the tallest bar (a stack's bottoms are sticky edges: autoscaling left none)
    ax.set_ylim(0, 1.05 * bottom.max() if bottom.max() > 0 else 1.0)
    ax.set_xticks(range(len(bars)), names, rotation=0 if per_width else 30,
                  ha="center" if per_width else "right", fontsize=8)
    ax.set_ylabel("mean decode step time (ms)")
    ax.set_title("Decode step breakdown by "
                 + ("DEP width" if per_width else "scenario")
                 + (" (mean over scenarios at each width)" if per_width and
                    ok["decode_gpus"].nunique() < len(ok) else ""))
    ax.legend(ncol=1, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def _ttft_ms(job: Path) -> np.ndarray:
    try:
        req = pd.read_parquet(job / "requests.parquet",
                              columns=["phase", "error", "ttft_ms"])
    except (OSError, ValueError):
        return np.empty(0)
    win = req[(req["phase"] == "window") & req["error"].isna()]
    return np.sort(win["ttft_ms"].dropna().to_numpy(float))


def _itl_cdf(job: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        h = pd.read_csv(job / "itl_histogram.csv")
    except (OSError, ValueError):
        return np.empty(0), np.empty(0)
    w = h["tokens"].to_numpy(float)
    return h["hi_ms"].to_numpy(float), np.cumsum(w) / w.sum() if w.sum() else w


def latency_scenarios(table: pd.DataFrame, n: int = MAX_CURVES) -> pd.DataFrame:
    """At most `n` finished scenarios to draw: all if they fit, else Pareto-frontier scenarios
    spread along the frontier, then the others in table order."""
    ok = _ok(table)
    if len(ok) <= n:
        return ok
    front = ok[pareto_front(ok[X], ok[Y])].sort_values(X)
    if len(front) >= n:
        return front.iloc[np.linspace(0, len(front) - 1, n).round().astype(int)]
    return pd.concat([front, ok.drop(front.index).head(n - len(front))])


def plot_latency_distributions(table: pd.DataFrame, sweep_dir: Path, path: Path) -> Path:
    """CDFs of TTFT and ITL per scenario (at most MAX_CURVES, see `latency_scenarios`)."""
    ok = latency_scenarios(table)
    labels = point_labels(ok)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    colours = plt.get_cmap("tab10" if len(ok) <= 10 else "tab20").colors
    for i, (_, row) in enumerate(ok.iterrows()):
        job = sweep_dir / str(row["job_dir"])
        c = colours[i % len(colours)]
        ttft = _ttft_ms(job)
        if ttft.size:
            axes[0].plot(ttft, np.arange(1, ttft.size + 1) / ttft.size, color=c, label=labels[i])
        x, cdf = _itl_cdf(job)
        if x.size:
            axes[1].step(x, cdf, where="post", color=c, label=labels[i])
    for ax, name, unit in ((axes[0], "TTFT", "requests"),
                           (axes[1], "inter-token latency", "tokens")):
        ax.set_xscale("log")
        plain_log_axis(ax.xaxis)
        ax.set_xlabel(f"{name} (ms, log scale)")
        ax.set_ylabel(f"fraction of {unit}")
        ax.axhline(0.9, color="k", ls=":", lw=0.8)
        ax.set_title(f"{name} distribution (CDF; dotted line = P90)")
        ax.grid(alpha=0.3, which="both")
    if len(ok):
        axes[1].legend(fontsize=7, loc="lower right")
    shown = len(ok)
    total = int((table["status"] == "ok").sum())
    if total > shown:
        fig.suptitle(f"{shown} of {total} scenarios: Pareto-frontier ones first", fontsize=9)
    return save_figure(fig, path)


def plot_ttft_stages(table: pd.DataFrame, path: Path) -> Path:
    """The mean TTFT of each scenario split by stage (`ttft_<stage>_ms` of its summary),
    stacked, one bar per scenario (at most MAX_CURVES, as `latency_scenarios` picks them):
    where a sweep's TTFT grows, which stage grows it."""
    ok = latency_scenarios(table)
    cols = [f"ttft_{stage}_ms" for stage, *_ in TTFT_STAGES]
    fig, ax = plt.subplots(figsize=(10, max(3.2, 2.2 + 0.4 * len(ok))))
    if ok.empty or not set(cols) <= set(ok.columns) or ok[cols].isna().all().all():
        ax.text(0.5, 0.5, "no TTFT stages in this table", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return save_figure(fig, path)
    y, totals = stacked_barh(ax, ok[cols], [label for *_, label in TTFT_STAGES])
    ax.set_yticks(y, point_labels(ok), fontsize=8)
    ax.set_xlim(0, 1.05 * totals.max() if totals.max() > 0 else 1.0)
    ax.set_xlabel("mean time from send to first token (ms)")
    shown, total = len(ok), int((table["status"] == "ok").sum())
    ax.set_title("TTFT by stage" + (f" ({shown} of {total} scenarios: Pareto-frontier ones "
                                    "first)" if total > shown else ""))
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path)


def check_plottable(table: pd.DataFrame, sweep_dir: Path) -> None:
    """A sweep none of whose scenarios finished has nothing to plot: ValueError naming how
    many failed and the first one's error."""
    if _ok(table).empty:
        failed = table[table["status"] != "ok"]
        first = (f"; job {failed['job_dir'].iloc[0]}: {failed['error'].iloc[0]}"
                 if len(failed) else "")
        raise ValueError(f"{sweep_dir}: no finished scenario to plot ({len(table)} in its "
                         f"table, {len(failed)} failed{first}); nothing written")


def plot_sweep(table: pd.DataFrame, sweep_dir: Path, out: Path) -> list[Path]:
    """Every sweep figure into `out`; returns their paths (`check_plottable` first)."""
    out.mkdir(parents=True, exist_ok=True)
    return [plot_pareto(table, out / "pareto.png"),
            plot_economics(table, out / "economics.png"),
            plot_breakdown_by_width(table, out / "decode_breakdown.png"),
            plot_latency_distributions(table, sweep_dir, out / "latency.png"),
            plot_ttft_stages(table, out / "ttft_stages.png")]
