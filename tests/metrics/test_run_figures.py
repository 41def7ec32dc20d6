"""The run's figures: the decode breakdown's steps and bars, what each figure shows and where."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rackSim.metrics.histogram import LatencyHistogram
from rackSim.metrics.records import STEP_COLUMNS
from rackSim.metrics.summary import Result
from rackSim.perf.step import COMPONENTS
from rackSim.report.plots import BREAKDOWN_BARS, decode_breakdown_bars, plot_decode_breakdown
from rackSim.run import decode_breakdown_ms


def _steps(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    """Steps (instance, start s, moe ms); every other component 1 ms."""
    out = []
    for name, start, moe in rows:
        row = dict.fromkeys(STEP_COLUMNS, 0.0)
        row.update({f"{c}_ms": 1.0 for c in COMPONENTS}, instance=name, start_s=start,
                   moe_ms=moe)
        out.append(row)
    return pd.DataFrame(out, columns=list(STEP_COLUMNS))


def test_one_bar_per_decode_instance_over_the_window() -> None:
    """Steps before the window [10, 20) s and after it (a drain), and prefill steps, are left
    out; decode-2 sorts before decode-10; each bar is its instance's mean per component."""
    steps = _steps([("decode-10", 11.0, 4.0), ("decode-2", 5.0, 100.0), ("decode-2", 12.0, 2.0),
                    ("decode-2", 13.0, 4.0), ("prefill-0", 12.0, 50.0),
                    ("decoder", 12.0, 9.0), ("decode-2", 20.0, 70.0)])
    title, bars = decode_breakdown_bars(steps, 10.0, 20.0)
    assert title.startswith("Decode step breakdown")
    assert list(bars.index) == ["decode-2", "decode-10"]
    assert bars.loc["decode-2", "moe"] == pytest.approx(3.0)
    assert bars.loc["decode-10", "moe"] == pytest.approx(4.0)
    assert bars.loc["decode-2", "sync"] == pytest.approx(1.0)


def test_summary_decode_breakdown_leaves_out_the_drain() -> None:
    """The summary's mean decode step is over the steps started in the window [10, 20) s: a
    drain's light steps after it (and warm-up's before it) do not count."""
    steps = _steps([("decode", 5.0, 100.0), ("decode", 12.0, 2.0), ("decode", 19.0, 4.0),
                    ("decode", 20.0, 70.0), ("decode", 25.0, 70.0)])
    steps["duration_ms"] = steps["moe_ms"] + 8.0
    out = decode_breakdown_ms(steps, 10.0, 20.0)
    assert out["decode_moe_ms"] == pytest.approx(3.0)
    assert out["decode_step_ms"] == pytest.approx(11.0)


def test_a_large_fleet_gets_the_mean_the_slowest_and_the_fastest() -> None:
    n = BREAKDOWN_BARS + 2
    steps = _steps([(f"decode-{j}", 1.0, float(j)) for j in range(n)]
                   + [("decode-3", 2.0, 3.0)])
    _, bars = decode_breakdown_bars(steps, 0.0, 9.0)
    assert list(bars.index) == [f"all {n}", f"slowest decode-{n - 1}", "fastest decode-0"]
    # the mean is over all steps: (0 + 1 + ... + (n-1) + 3) / (n + 1)
    assert bars.iloc[0]["moe"] == pytest.approx((n * (n - 1) / 2 + 3) / (n + 1))
    assert bars.iloc[1]["moe"] == n - 1 and bars.iloc[2]["moe"] == 0


def test_colocated_instances_when_there_is_no_decode_instance(tmp_path) -> None:
    steps = _steps([("colocated-0", 1.0, 2.0), ("colocated-1", 1.0, 3.0)])
    title, bars = decode_breakdown_bars(steps, 0.0, 9.0)
    assert "colocated" in title and list(bars.index) == ["colocated-0", "colocated-1"]
    result = Result({"window_start_s": 0.0}, pd.DataFrame(), steps, pd.DataFrame(),
                    LatencyHistogram())
    path = plot_decode_breakdown(result, tmp_path / "b.png")
    assert path.stat().st_size > 10_000


def test_throughput_figure_of_a_run_interrupted_in_its_warm_up(tmp_path) -> None:
    """No window, no series: the figure says so, without matplotlib's empty-legend warning."""
    import warnings

    from rackSim.report.plots import plot_throughput

    result = Result({"window_start_s": 0.0}, pd.DataFrame(), pd.DataFrame(), pd.DataFrame(),
                    LatencyHistogram())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = plot_throughput(result, tmp_path / "t.png")
    assert path.stat().st_size > 5_000


def test_the_breakdown_legend_covers_neither_the_bars_nor_the_axis_label(
        caught_figures) -> None:
    """The legend (10 components) sat below the axes over 'mean step time (ms)'."""
    import rackSim.report.plots as plots

    figures = caught_figures(plots, "save_figure")
    for n in (1, 3):
        steps = _steps([(f"decode-{j}", 1.0, 2.0 + j) for j in range(n)])
        result = Result({"window_start_s": 0.0}, pd.DataFrame(), steps, pd.DataFrame(),
                        LatencyHistogram())
        plot_decode_breakdown(result, None)
        fig = figures[-1]
        ax = fig.axes[0]
        legend = ax.get_legend().get_window_extent()
        assert not legend.overlaps(ax.xaxis.label.get_window_extent())
        assert not legend.overlaps(ax.get_window_extent())
        assert legend.y0 >= 0 and legend.y1 <= fig.bbox.height  # inside the figure
        assert ax.get_xlim()[1] > 1.0 * (2.0 + n - 1 + len(COMPONENTS) - 1)  # room past a bar


def test_the_throughput_stack_covers_the_window_and_its_legend_sits_beside_it(
        caught_figures) -> None:
    """Three one-minute buckets of a 3-minute window: the stack ends at 3 min (the last
    bucket had no width: it ended at 2), and its legend is beside the axes (a stack filled
    from 0 has no free corner: lower right, it covered the last minutes)."""
    import rackSim.report.plots as plots

    figures = caught_figures(plots, "save_figure")
    ts = pd.DataFrame({"t_s": [0.0, 60.0, 120.0], "cached": [300.0, 400.0, 350.0],
                       "uncached": [500.0, 450.0, 480.0], "output": [20.0, 25.0, 22.0]})
    plots.plot_throughput(Result({"window_s": 180.0}, pd.DataFrame(), pd.DataFrame(), ts,
                                 LatencyHistogram()), None)
    ax = figures[0].axes[0]
    ends = [p.vertices[:, 0].max() for c in ax.collections for p in c.get_paths()]
    assert len(ends) == 3 and all(e == pytest.approx(3.0) for e in ends)
    legend = ax.get_legend().get_window_extent()
    assert not legend.overlaps(ax.get_window_extent())
    assert legend.x1 <= figures[0].bbox.width  # inside the figure


def test_a_narrow_inter_token_latency_spread_is_labelled_between_decades(
        caught_figures) -> None:
    """ITL from 1.5 to 3 ms with a tail to 25 ms: on a log axis whose decades alone are
    labelled, only '10' showed; where a decade has room its 2 and 5 are labelled too."""
    import rackSim.report.plots as plots

    figures = caught_figures(plots, "save_figure")

    def labels(values) -> list[str]:
        itl = LatencyHistogram()
        itl.add_many(np.asarray(values, float))
        requests = pd.DataFrame({"phase": ["window"], "error": [None], "ttft_ms": [100.0],
                                 "tpot_ms": [2.0]})
        plots.plot_latency(Result({}, requests, pd.DataFrame(), pd.DataFrame(), itl), None)
        ax = figures[-1].axes[1]
        lo, hi = ax.get_xlim()
        shown = [t.get_text() for t in ax.get_xticklabels(minor=False)
                 + ax.get_xticklabels(minor=True)
                 if t.get_text() and lo <= t.get_position()[0] <= hi]
        return shown

    narrow = labels(np.r_[np.linspace(1.5, 3.0, 500), 25.0])
    assert len(narrow) >= 4 and "2" in narrow, narrow
    wide = labels(np.r_[np.linspace(1.5, 3.0, 500), 2000.0])  # three decades: decades only
    assert set(wide) <= {"1", "10", "100", "1000"} and len(wide) >= 3, wide


def test_the_breakdown_figure_takes_the_runs_window(monkeypatch, tmp_path) -> None:
    """The figure's steps are the summary's: those started in [window_start_s, window_end_s),
    which a run's summary records; without them, every step."""
    import rackSim.report.plots as plots
    from rackSim.config import compose_scenario
    from rackSim.run import simulate

    seen = []

    def bars(steps, t0, t1):  # noqa: ANN001, ANN202 - records the window it was given
        seen.append((t0, t1))
        return "t", pd.DataFrame()

    monkeypatch.setattr(plots, "decode_breakdown_bars", bars)
    for summary in ({"window_start_s": 10.0, "window_end_s": 20.0}, {}):
        plots.plot_decode_breakdown(Result(summary, pd.DataFrame(), pd.DataFrame(),
                                           pd.DataFrame(), LatencyHistogram()),
                                    tmp_path / "b.png")
    assert seen == [(10.0, 20.0), (-np.inf, np.inf)]
    s = simulate(compose_scenario(["experiment=smoke", "workload.replay.window_s=5",
                                   "progress=false"]), progress=False).summary
    assert s["window_end_s"] - s["window_start_s"] == pytest.approx(s["window_s"])


def _staged(ttft_parts: list[tuple[float, float, float, float, float]]) -> pd.DataFrame:
    """Requests sent at 0 s whose five TTFT stages last these seconds, in stage order."""
    rows = []
    for parts in ttft_parts:
        t = np.cumsum((0.0, *parts))
        rows.append({"send_s": t[0], "prefill_start_s": t[1], "prefill_end_s": t[2],
                     "kv_ready_s": t[3], "decode_start_s": t[4], "first_token_s": t[5]})
    return pd.DataFrame(rows)


def test_ttft_stage_bars_are_the_mean_and_the_slowest_tenths() -> None:
    """Ten requests: nine wait 0.1 s for a prefill step, one 2 s; the slowest tenth is that
    one, the mean spreads it over the ten."""
    from rackSim.report.plots import ttft_stage_bars

    bars = ttft_stage_bars(_staged([(0.1, 0.05, 0.001, 0.0, 0.01)] * 9
                                   + [(2.0, 0.05, 0.001, 0.003, 0.01)]))
    assert list(bars.index) == ["all", "slowest 10 %"]
    assert bars.loc["all", "prefill_queue"] == pytest.approx((9 * 100 + 2000) / 10)
    assert bars.loc["slowest 10 %", "prefill_queue"] == pytest.approx(2000)
    assert bars.loc["slowest 10 %", "decode_admission"] == pytest.approx(3)
    assert bars.loc["all", "prefill"] == pytest.approx(50)
    # a measured run's records have no stage times
    assert ttft_stage_bars(pd.DataFrame({"send_s": [0.0], "first_token_s": [1.0]})).empty
    assert ttft_stage_bars(_staged([(0.1, 0.05, 0.0, 0.0, 0.01)]).assign(
        prefill_start_s=np.nan)).empty


def test_the_latency_figure_splits_the_ttft_by_stage(caught_figures) -> None:
    import rackSim.report.plots as plots

    figures = caught_figures(plots, "save_figure")
    requests = _staged([(0.1, 0.05, 0.001, 0.0, 0.01)] * 20).assign(
        phase="window", error=None, ttft_ms=161.0, tpot_ms=2.0)
    plots.plot_latency(Result({}, requests, pd.DataFrame(), pd.DataFrame(),
                              LatencyHistogram()), None)
    ax = figures[-1].axes[3]
    assert ax.get_title() == "TTFT by stage"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "prefill wait", "prefill", "KV", "decode wait", "first step"]
    widths = [p.get_width() for p in ax.patches]
    assert sum(widths) == pytest.approx(2 * 161.0)  # two bars, each the whole TTFT
