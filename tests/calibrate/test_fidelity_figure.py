"""The fidelity figure: every marker stays visible beside its legend."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection

import rackSim.report.fidelity_plots as fidelity_plots


def test_no_marker_lies_under_a_legend(caught_figures, tmp_path):
    """The legends sit at the lower right, where the last rows are: H2 (2.4x its published
    value, the bottom rows' largest ratio) was drawn under the figure's legend."""
    keys = [f"D{i}" for i in range(1, 21)] + ["L2", "H1", "H2", "H3"]
    ratios = [1.0] * 20 + [1.69, 0.10, 2.40, 0.20]
    table = pd.DataFrame({
        "key": keys, "published": 100.0, "predicted": 100.0 * np.array(ratios),
        "status": ["fitted"] * 20 + ["predicted"] * 4,
        "loo_predicted": [120.0] * 20 + [np.nan] * 4,
        "exactly_determined": [True] * 20 + [False] * 4,
        "seed_error_min": [np.nan] * 21 + [-0.91, 1.35, -0.82],
        "seed_error_max": [np.nan] * 21 + [-0.88, 1.45, -0.79]})
    effects = pd.DataFrame({
        "effect": [f"effect {i}" for i in range(12)],
        "throughput_ratio": np.linspace(0.7, 2.3, 12)[::-1],
        "interactivity_ratio": np.linspace(0.75, 2.2, 12),
        "published_ratio": [np.nan] * 10 + [0.9, 0.85],
        "agrees": ["yes", "no", "within noise", ""] * 3})
    figures = caught_figures(fidelity_plots, "save_figure")
    fidelity_plots.plot_fidelity(table, effects, tmp_path / "f.png")
    fig = figures[0]
    for ax in fig.axes:
        box = ax.get_legend().get_window_extent()
        points = np.vstack([c.get_offset_transform().transform(c.get_offsets())
                            for c in ax.collections if isinstance(c, PathCollection)])
        assert len(points) >= len(ax.get_yticks())
        inside = ((points[:, 0] >= box.x0) & (points[:, 0] <= box.x1)
                  & (points[:, 1] >= box.y0) & (points[:, 1] <= box.y1))
        assert not inside.any(), points[inside]
    # the headline rows' range over seeds: one bar each, from 1 + min to 1 + max error
    bars = [c for c in fig.axes[0].collections if c.get_label() == "over seeds"]
    assert len(bars) == 1
    spans = sorted(v for seg in bars[0].get_segments() for v in (seg[0][0], seg[1][0]))
    assert spans == pytest.approx([0.09, 0.12, 0.18, 0.21, 2.35, 2.45])
