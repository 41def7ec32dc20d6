"""The workload figure: in-flight requests over time, prompt lengths, reuse, fan-out."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rackSim.workload.stats import WorkloadStats  # noqa: E402


def plot_workload(stats: WorkloadStats, path: str | Path) -> None:
    """Write a 2x2 PNG summary of `stats` to `path`."""
    s, tab, fl = stats.summary, stats.requests, stats.inflight
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    ax[0, 0].step(fl["t_s"], fl["inflight"], where="post", lw=0.8)
    ax[0, 0].set(title="in-flight requests (nominal timing)", xlabel="time (s)",
                 ylabel="requests")
    bins = np.logspace(0, np.log10(max(2, tab["prompt"].max())), 60)
    ax[0, 1].hist(tab["prompt"], bins=bins, alpha=0.7, label="prompt")
    ax[0, 1].hist(tab["output"].clip(lower=1), bins=bins, alpha=0.7, label="output")
    ax[0, 1].set(xscale="log", title="tokens per request", xlabel="tokens", ylabel="requests")
    ax[0, 1].legend()
    caches = [c for c in tab.columns if c.startswith("cached_")]
    labels = ["infinite" if c == "cached_inf" else f"LRU {int(c[7:]):,}" for c in caches]
    reuse = [tab[c].sum() / tab["prompt"].sum() for c in caches]
    bars = ax[1, 0].bar(labels, reuse)
    ax[1, 0].bar_label(bars, [f"{r:.1%}" for r in reuse], fontsize=8)  # 0 % draws no bar
    share = s["structural_prefix_share"]  # 0 for a trace: its reuse is across sessions
    ax[1, 0].axhline(share, color="k", ls="--", lw=0.8,
                     label=f"prefix share of prompts (graph): {share:.1%}")
    ax[1, 0].set(title="prefix reuse (cached / prompt tokens)", ylim=(0, 1))
    ax[1, 0].legend()
    agents = tab.groupby("session")["agent"].max()
    ax[1, 1].set(title="subagent branches per session", xlabel="branches", ylabel="sessions")
    if agents.max() > 0:
        ax[1, 1].hist(agents, bins=np.arange(agents.max() + 2) - 0.5)
        ax[1, 1].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    else:  # a trace, or a pool without subagents: one bar at 0 said little
        ax[1, 1].text(0.5, 0.5, f"no subagent branches in {s['sessions']:,} sessions",
                      ha="center", va="center", transform=ax[1, 1].transAxes)
        ax[1, 1].set(xticks=[], yticks=[])
    fig.suptitle(f"{s['source']}: {s['sessions']:,} sessions, {s['requests']:,} requests")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
