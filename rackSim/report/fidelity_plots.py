"""The fidelity figure: predicted / published per figure, leave-one-out, and effect ratios."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter  # noqa: E402

from rackSim.report.plots import save_figure  # noqa: E402

STATUS_STYLE = {"fitted": {"marker": "o", "color": "tab:blue"},
                "predicted": {"marker": "s", "color": "tab:orange", "facecolors": "none"}}
AGREE_COLOR = {"yes": "tab:green", "no": "tab:red", "within noise": "tab:olive",
               "": "tab:gray"}


def _log_x(ax: plt.Axes, subs: tuple[float, ...] = (1.0, 2.0, 5.0)) -> None:
    """Log x axis labelled at `subs` x 10^k."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=subs))
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _ratio_panel(ax: plt.Axes, table: pd.DataFrame) -> None:
    rows = table[table["published"].notna() & table["predicted"].notna()
                 & table["status"].isin(list(STATUS_STYLE))].reset_index(drop=True)
    y = np.arange(len(rows))[::-1]
    ratio = rows["predicted"] / rows["published"]
    loo = rows["loo_predicted"] / rows["published"]
    ax.axvspan(0.95, 1.05, color="0.9", label="within 5 %")
    ax.axvline(1.0, color="k", lw=0.8)
    for status, style in STATUS_STYLE.items():
        sel = (rows["status"] == status).to_numpy()
        if sel.any():
            ax.scatter(ratio[sel], y[sel], label=status, zorder=3,
                       **{"edgecolors": style["color"], **style})
    seeded = rows["seed_error_min"].notna().to_numpy()
    if seeded.any():  # the headline's ratio over seeds, behind its point
        ax.hlines(y[seeded], 1 + rows.loc[seeded, "seed_error_min"],
                  1 + rows.loc[seeded, "seed_error_max"], color="0.45", lw=5, alpha=0.5,
                  zorder=2, label="over seeds")
    has = loo.notna().to_numpy()
    if has.any():
        ax.hlines(y[has], ratio[has], loo[has], color="tab:red", lw=0.8)
        ax.scatter(loo[has], y[has], marker="x", color="tab:red", zorder=4,
                   label="leave-one-out")
    exact = rows["exactly_determined"].eq(True).to_numpy()
    labels = [k + (" *" if e else "") for k, e in zip(rows["key"], exact, strict=True)]
    ax.set_yticks(y, labels, fontsize=8)
    _log_x(ax)
    ax.set_xlabel("predicted / published")
    ax.set_title("Published figures (* exactly determined)")
    ax.legend(fontsize=8, loc="lower right")


def _effects_panel(ax: plt.Axes, effects: pd.DataFrame | None) -> None:
    ax.set_title("Effects: variant / baseline")
    if effects is None or effects.empty:
        ax.text(0.5, 0.5, "effects not run", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    y = np.arange(len(effects))[::-1]
    ax.axvline(1.0, color="k", lw=0.8)
    colors = [AGREE_COLOR[a] for a in effects["agrees"].fillna("")]
    ax.scatter(effects["throughput_ratio"], y + 0.15, marker="o", c=colors)
    ax.scatter(effects["interactivity_ratio"], y - 0.15, marker="^", c=colors)
    pub = effects["published_ratio"].notna().to_numpy()
    ax.scatter(effects.loc[pub, "published_ratio"], y[pub] + 0.15, marker="|", s=200, color="k")
    ax.set_yticks(y, effects["effect"], fontsize=8)
    _log_x(ax, (1.0, 1.5, 2.0, 3.0, 5.0, 7.0))
    ax.set_xlabel("variant / baseline")

    def key(marker: str, color: str, label: str) -> Line2D:
        return Line2D([], [], ls="", marker=marker, color=color, label=label)

    ax.legend(handles=[key("o", "k", "tok/s per GPU"), key("^", "k", "P90 interactivity"),
                       key("|", "k", "published ratio"),
                       *(key("s", c, f"published direction: {v or 'none'}")
                         for v, c in AGREE_COLOR.items())], fontsize=7, loc="lower right")


def plot_fidelity(table: pd.DataFrame, effects: pd.DataFrame | None, path: Path) -> Path:
    """Left: predicted / published for every fitted and predicted figure value (log axis),
    with the leave-one-out ratio; right: effect ratios coloured by agreement."""
    height = max(5.0, 0.25 * table["status"].isin(list(STATUS_STYLE)).sum())
    fig, axes = plt.subplots(1, 2, figsize=(15, height),
                             gridspec_kw={"width_ratios": [1.1, 1.0]})
    _ratio_panel(axes[0], table)
    _effects_panel(axes[1], effects)
    fig.tight_layout()
    for ax in axes:
        if ax.get_legend() is not None:
            _legend_below_rows(ax)
    return save_figure(fig, path)


def _legend_below_rows(ax: plt.Axes, pad: float = 0.02) -> None:
    """Lower the y axis until the legend (lower right) sits below the lowest row (y = 0)
    instead of over the markers of the last rows (it hid H2's)."""
    ax.figure.canvas.draw()
    share = (ax.get_legend().get_window_extent().height / ax.get_window_extent().height
             + pad)  # of the axes' height, whatever its limits
    top = ax.get_ylim()[1]
    ax.set_ylim((-0.5 - share * top) / (1.0 - share), top)
