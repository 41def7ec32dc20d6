"""Sweep figures: the Pareto frontier is exactly the non-dominated set; `racksim-plot plots`
draws every PNG from a real sweep, refuses a directory without a table and a sweep with
nothing finished."""

from __future__ import annotations

import json

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackSim.report.command import main as plot_main
from rackSim.report.sweep_plots import (
    latency_scenarios,
    pareto_front,
    point_labels,
    varied_keys,
)

FIGURES = ("pareto.png", "economics.png", "decode_breakdown.png", "latency.png",
           "ttft_stages.png")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=40))
def test_pareto_front_is_exactly_the_non_dominated_points(points):
    x, y = (np.array(v, float) for v in zip(*points, strict=True))
    front = pareto_front(x, y)

    def dominated(i: int) -> bool:
        return bool(((x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))).any())

    assert front.any()
    for i in range(len(x)):
        assert front[i] == (not dominated(i))


def test_pareto_front_ignores_missing_values():
    x = np.array([1.0, np.nan, 3.0, 2.0])
    y = np.array([3.0, 9.0, 1.0, 1.0])
    assert pareto_front(x, y).tolist() == [True, False, True, False]


def test_frontier_of_the_sweep(joblib_sweep):
    sweep_dir, _ = joblib_sweep
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    ok = table[table["status"] == "ok"]
    front = pareto_front(ok["interactivity_tok_s"], ok["throughput_tok_s_gpu"])
    # the most interactive and the highest-throughput scenarios always lie on the frontier
    assert front[np.argmax(ok["interactivity_tok_s"].to_numpy())]
    assert front[np.argmax(ok["throughput_tok_s_gpu"].to_numpy())]
    assert varied_keys(table) == ["deployment.decode.gpus", "workload.replay.concurrency"]
    first = ok.iloc[0]
    assert point_labels(ok)[0] == f"{first['layout']} c={first['workload.replay.concurrency']}"


def test_the_pareto_legend_names_only_what_is_drawn(caught_figures, tmp_path):
    """Six scenarios all on the frontier: no 'dominated' entry (there was one, with no
    points); one dominated point brings it back."""
    import rackSim.report.sweep_plots as sweep_plots

    figures = caught_figures(sweep_plots, "save_figure")
    x = np.array([469.3, 473.3, 474.4, 486.2, 510.9, 536.9])
    on_front = pd.DataFrame({"k": range(6), "status": "ok", "interactivity_tok_s": x,
                             "throughput_tok_s_gpu": 1000 - x})
    sweep_plots.plot_pareto(on_front, tmp_path / "a.png")
    below = pd.concat([on_front, on_front.iloc[[0]].assign(k=6, throughput_tok_s_gpu=1.0)])
    sweep_plots.plot_pareto(below, tmp_path / "b.png")
    legends = [[t.get_text() for t in f.axes[0].get_legend().get_texts()] for f in figures]
    assert legends == [["Pareto frontier"], ["dominated", "Pareto frontier"]]


def test_the_breakdown_title_names_what_its_bars_are(caught_figures, tmp_path):
    """A concurrency sweep at one width draws a bar per scenario: its title said 'by DEP
    width'. A width sweep draws a bar per width."""
    import rackSim.report.sweep_plots as sweep_plots

    figures = caught_figures(sweep_plots, "save_figure")
    table = pd.DataFrame({"k": range(4), "status": "ok", "interactivity_tok_s": 400.0,
                          "decode_moe_ms": 1.0,
                          "decode_sync_ms": 0.5, "decode_straggler_ms": 1e-6,
                          "workload.replay.concurrency": [50, 100, 200, 400],
                          "decode_gpus": 32})
    sweep_plots.plot_breakdown_by_width(table, tmp_path / "a.png")
    sweep_plots.plot_breakdown_by_width(table.assign(decode_gpus=[4, 8, 16, 32]),
                                        tmp_path / "b.png")
    assert [f.axes[0].get_title() for f in figures] == [
        "Decode step breakdown by scenario", "Decode step breakdown by DEP width"]
    # room above the stacks (1.5 ms): a near-zero component on top pinned the axis there
    assert all(f.axes[0].get_ylim()[1] >= 1.05 * 1.5 - 1e-9 for f in figures)


def test_latency_curves_prefer_the_frontier():
    """Beyond 12 scenarios, the curves drawn are spread along the Pareto frontier."""
    x = np.arange(30, dtype=float)
    table = pd.DataFrame({"k": range(30), "status": "ok", "interactivity_tok_s": x,
                          "throughput_tok_s_gpu": np.where(x % 2 == 0, 100 - x, 0.0)})
    picked = latency_scenarios(table)
    assert len(picked) == 12
    front = pareto_front(table["interactivity_tok_s"], table["throughput_tok_s_gpu"])
    assert front.sum() == 16  # 15 even points and the last (x=29, nothing to its right)
    assert front[picked.index].all()
    assert picked["interactivity_tok_s"].is_monotonic_increasing
    assert picked.iloc[0]["k"] == 0 and picked.iloc[-1]["k"] == 29
    assert len(latency_scenarios(table.head(5))) == 5


def test_plots_command_draws_every_figure(joblib_sweep, tmp_path, capsys):
    sweep_dir, _ = joblib_sweep
    out = tmp_path / "figs"
    assert plot_main(["plots", str(sweep_dir / "sweep.parquet"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert [p.rsplit("/", 1)[-1] for p in printed] == list(FIGURES)
    for name in FIGURES:
        img = mpimg.imread(out / name)
        assert img.shape[0] >= 400 and img.shape[1] >= 800, name
        assert img[..., :3].std() > 0.05, name  # not a blank canvas
    # the same figures from the directory and from the CSV table
    assert plot_main(["plots", str(sweep_dir), "--out", str(tmp_path / "d")]) == 0
    assert plot_main(["plots", str(sweep_dir / "sweep.csv"), "--out", str(tmp_path / "c")]) == 0
    assert all((tmp_path / "c" / n).stat().st_size > 10_000 for n in FIGURES)


def test_plots_command_without_a_table_fails_clearly(tmp_path, capsys):
    assert plot_main(["plots", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no sweep table" in err and "racksim-plot table" in err
    assert plot_main(["plots", str(tmp_path / "missing.parquet")]) == 2
    bogus = tmp_path / "x.csv"
    bogus.write_text("a,b\n1,2\n")
    assert plot_main(["plots", str(bogus)]) == 2
    assert "not a sweep table" in capsys.readouterr().err


def test_plots_command_on_a_sweep_with_nothing_finished_fails_clearly(tmp_path, capsys):
    """Every scenario failed: the table has no metric columns; nothing is drawn."""
    for i, width in enumerate((5, 7)):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "job.json").write_text(json.dumps(
            {"overrides": [f"deployment.decode.gpus={width}"], "status": "failed",
             "error": f"ConfigError: deployment.decode.gpus={width}: pick a width that divides "
                      "384", "finished_at": 1.0}))
    assert plot_main(["table", str(tmp_path)]) == 0
    capsys.readouterr()
    assert plot_main(["plots", str(tmp_path), "--out", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err
    assert "no finished scenario to plot (2 in its table, 2 failed; job 0: ConfigError: " \
           "deployment.decode.gpus=5" in err and "nothing written" in err
    assert not (tmp_path / "figs").exists() and not list(tmp_path.glob("*.png"))


def test_ttft_stages_stack_each_scenarios_mean(caught_figures, tmp_path):
    """One bar per scenario, its stages summing to its mean TTFT; a table from before the
    summaries had stages says so instead of drawing empty bars."""
    import rackSim.report.sweep_plots as sweep_plots

    figures = caught_figures(sweep_plots, "save_figure")
    stages = {"ttft_prefill_queue_ms": [5.0, 3000.0], "ttft_prefill_ms": [60.0, 450.0],
              "ttft_kv_transfer_ms": [0.2, 1.0], "ttft_decode_admission_ms": [2.0, 10.0],
              "ttft_first_step_ms": [6.0, 16.0]}
    table = pd.DataFrame({"workload.replay.concurrency": [24, 300], "status": "ok",
                          "layout": "P2xDEP2+DEP4", "interactivity_tok_s": [250.0, 240.0],
                          "throughput_tok_s_gpu": [1e4, 6e4], **stages})
    sweep_plots.plot_ttft_stages(table, tmp_path / "a.png")
    ax = figures[-1].axes[0]
    widths = np.array([p.get_width() for p in ax.patches]).reshape(5, 2)  # stage x scenario
    assert widths.sum(axis=0) == pytest.approx([73.2, 3477.0])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["P2xDEP2+DEP4 c=24",
                                                            "P2xDEP2+DEP4 c=300"]
    sweep_plots.plot_ttft_stages(table.drop(columns=list(stages)), tmp_path / "b.png")
    assert "no TTFT stages" in figures[-1].axes[0].texts[0].get_text()
