"""The plan's Pareto figure: the plans' labels stay readable when the plans screen alike."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.text import Text

import rackSim.report.plan_figures as plan_figures


def test_labels_of_plans_that_screen_alike_do_not_overlap(caught_figures):
    """Three plans within 1 % of each other (as the reference plan's are): labels offset from
    each star came out in reverse order, their lines crossing, the lowest on its star; they
    now stand in one column above the highest star, the first plan on top. A plan far from
    them keeps its label by its star (in the column, its leader line crossed the figure)."""
    figures = caught_figures(plan_figures, "_png", layout=False)  # saved with bbox "tight"
    rng = np.random.default_rng(0)
    screened = pd.DataFrame({"interactivity_tok_s": rng.uniform(50, 1400, 500),
                             "throughput_tok_s_gpu": rng.uniform(2e4, 4.3e5, 500),
                             "feasible": rng.random(500) < 0.6})
    plans = pd.DataFrame({"racks": [2, 2, 15, 2],
                          "layout": ["P19xDEP2+2xDEP8", "P20xDEP2+2xDEP8", "C9xDEP8",
                                     "P10xDEP4+2xDEP8"],
                          "interactivity_tok_s": [206.6, 203.4, 215.0, 202.2],
                          "throughput_tok_s_gpu": [340_933.0, 336_492.0, 45_000.0, 339_597.0]})
    plan_figures.pareto_png(screened, plans, 150.0)
    fig = figures[0]
    labels = [t for t in fig.axes[0].texts if " x " in t.get_text()]
    assert [t.get_text() for t in labels] == [f"{r} x {x}" for r, x in
                                              zip(plans["racks"], plans["layout"], strict=True)]
    boxes = [Text.get_window_extent(t) for t in labels]  # the text, not its arrow
    assert all(not a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert boxes[0].y0 > boxes[1].y0 > boxes[3].y0  # the near plans in a column, plan 1 on top
    assert abs(boxes[0].x0 - boxes[3].x0) < 1
    stars = fig.axes[0].transData.transform(
        np.c_[plans["interactivity_tok_s"], plans["throughput_tok_s_gpu"] / 1e3])
    assert not any(b.contains(x, y) for b in boxes for x, y in stars)
    # the colocated fleet far below is labelled beside its own star, not in the column
    far = boxes[2]
    assert 0 < far.x0 - stars[2][0] < 30 and 0 < far.y0 - stars[2][1] < 30
