"""The fidelity table: status of each figure, fit groups, headline rows, leave-one-out cells."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from rackSim.calibrate import figures
from rackSim.calibrate.fidelity import (
    FidelityError,
    build_table,
    classify,
    fit_dof,
    format_table,
    headline_predictions,
    loo_note,
    read_headline_fit,
    seed_spread,
    summary,
)
from rackSim.perf.profile import Profile


def _fig(value: str, use: str = "calibration") -> dict[str, str]:
    return {"quantity": "q", "value": value, "unit": "u", "conditions": "", "use": use}


def test_status_of_every_kind_of_figure() -> None:
    figs = figures.read_figures()
    fitted = {"D3", "C1"}
    assert classify("D3", figs["D3"], fitted, True) == "fitted"
    assert classify("L2", figs["L2"], fitted, True) == "predicted"
    assert classify("D6", figs["D6"], fitted, False) == "qualitative"
    assert classify("C3", figs["C3"], fitted, False) == "qualitative"
    for fid in ("M1", "M7", "E3", "P7", "K1", "K2", "$1", "$5", "H4"):
        assert classify(fid, figs[fid], fitted, fid == "H4") == "input", fid
    assert classify("H5", figs["H5"], fitted, False) == "not modelled"
    assert classify("H1", figs["H1"], fitted, True) == "predicted"
    assert classify("H1", figs["H1"], fitted | {"H1"}, True) == "fitted"


def _profile() -> Profile:
    """X: 2 parameters for its 2 values; Y and Z share c, d is at a bound: 1 free for 3."""
    p = Profile("toy")
    p.set_param("a", 1.0, "", ["X"], "t")
    p.set_param("b", 1.0, "", ["X"], "t")
    p.set_param("c", 1.0, "", ["Y", "Z"], "t")
    p.set_param("d", 0.0, "", ["Z"], "t")
    p.params["d"]["at_bound"] = "[0, 1]"
    p.set_param("k", 1.0, "", ["aic:moe_perf"], "kernel table")
    return p


FIT_ROWS = [
    {"figure": "X.on", "published": 2.0, "predicted": 2.0, "error": 0.0},
    {"figure": "X.off", "published": 4.0, "predicted": 4.0, "error": 0.0},
    {"figure": "Y", "published": 10.0, "predicted": 11.0, "error": 0.1},
    {"figure": "Z@W1", "published": 5.0, "predicted": 4.0, "error": -0.2},
    {"figure": "Z@W2", "published": 5.0, "predicted": 6.0, "error": 0.2},
    {"figure": "V", "published": 8.0, "predicted": 6.0, "error": -0.25},
    {"figure": "B", "published": "<1 s", "predicted": 0.01, "error": "ok"},
]


def test_fit_groups_count_free_parameters_against_values() -> None:
    dof = fit_dof(_profile(), [r["figure"] for r in FIT_ROWS[:-1]])
    assert dof == {"X": (2, 2), "Y": (1, 3), "Z": (1, 3)}


def test_loo_note_says_what_is_left() -> None:
    assert loo_note((3, 3), 1) == "underdetermined without it: 3 params, 2 values"
    assert loo_note((2, 2), 2) == "nothing else constrains its 2 params: initial guesses"
    assert loo_note((4, 8), 2) == ""
    assert loo_note(None, 1) == ""


def _figs() -> dict[str, dict[str, str]]:
    return {"X": _fig("2 -> 4"), "Y": _fig("10"), "Z": _fig("5"), "V": _fig("8"),
            "B": _fig("<1"), "Q": _fig("qualitative", "mechanism"), "M": _fig("3", "model spec"),
            "H1": _fig("100", "headline"), "H2": _fig("200", "headline"),
            "H3": _fig("40", "headline"), "H4": _fig("34 to 64", "headline"),
            "H5": _fig("7.9", "headline")}


def _headline(gpus: int = 48) -> dict:
    summ = {"throughput_tok_s_gpu": 50.0, "interactivity_tok_s": 250.0,
            "revenue_usd_gpu_h": 40.0, "num_gpus": gpus}
    return headline_predictions(_figs(), summ)


def test_headline_rows_and_gpu_range() -> None:
    h = _headline()
    assert h["H1"][0]["error"] == pytest.approx(-0.5)
    assert h["H2"][0]["error"] == pytest.approx(0.25)
    assert h["H4"][0]["check"] == "ok"
    assert _headline(72)["H4"][0]["check"] == "outside"
    assert _headline(34)["H4"][0]["check"] == "ok"
    figs = {**_figs(), "H4": _fig("several", "headline")}
    with pytest.raises(FidelityError, match="H4"):
        headline_predictions(figs, {"throughput_tok_s_gpu": 1, "interactivity_tok_s": 1,
                                    "revenue_usd_gpu_h": 1, "num_gpus": 8})


LOO = pd.DataFrame({"left_out": ["X", "X", "Y", "Z", "Z"],
                    "key": ["X.on", "X.off", "Y", "Z@W1", "Z@W2"],
                    "loo_predicted": [3.0, 4.0, 12.0, 4.5, 5.5],
                    "refit_predicted": [2.0, 4.0, 11.0, 4.0, 6.0]})


def test_table_without_headline_fit() -> None:
    df = build_table(_figs(), FIT_ROWS, _profile(), _headline(), None, LOO).set_index("key")
    assert list(df.loc[["X.on", "Y", "Z@W1", "V", "B", "Q", "M", "H1", "H4", "H5"],
                       "status"]) == ["fitted", "fitted", "fitted", "predicted", "predicted",
                                      "qualitative", "input", "predicted", "input",
                                      "not modelled"]
    assert df.loc["X.on", "exactly_determined"] is True
    assert df.loc["Y", "exactly_determined"] is False
    assert df.loc["X.off", "value"] == "2 -> 4" and df.loc["X.off", "published"] == 4.0
    assert df.loc["X.on", "loo_error"] == pytest.approx(0.5)
    assert df.loc["Z@W2", "loo_error"] == pytest.approx(0.1)
    assert df.loc["Z@W2", "refit_predicted"] == 6.0
    assert df.loc["X.on", "loo_note"] == "nothing else constrains its 2 params: initial guesses"
    assert df.loc["Z@W1", "loo_note"] == "" and df.loc["Y", "loo_note"] == ""
    assert math.isnan(df.loc["V", "loo_predicted"]) and df.loc["V", "loo_note"] == ""
    assert df.loc["B", "check"] == "ok" and math.isnan(df.loc["B", "error"])
    assert df.loc["H1", "loo_note"] == "n/a (no headline fit)"
    assert math.isnan(df.loc["H1", "loo_predicted"])
    assert df.loc["H4", "predicted"] == 48 and df.loc["H4", "check"] == "ok"
    assert df.loc["H1", "error"] == pytest.approx(-0.5)


def test_table_with_headline_fit_and_without_loo() -> None:
    hfit = {"fitted_to": ["H1", "H2"], "priors": {"a": {}, "b": {}, "c": {}},
            "loo": {"H1": {"predicted": 80.0, "note": "refit without H1"}}}
    df = build_table(_figs(), FIT_ROWS, _profile(), _headline(), hfit, None).set_index("key")
    assert list(df.loc["H1", ["fit_params", "fit_targets", "exactly_determined"]]) == [
        3, 2, True]
    assert df.loc["H3", "fit_params"] is None or math.isnan(df.loc["H3", "fit_params"])
    assert df.loc["H1", "status"] == "fitted" and df.loc["H3", "status"] == "predicted"
    assert df.loc["H1", "loo_error"] == pytest.approx(-0.2)
    assert df.loc["H1", "loo_note"] == "refit without H1"
    assert df.loc["H2", "loo_note"] == "n/a (not in the headline fit's loo)"
    assert df.loc["X.on", "loo_note"] == "not run (--no-loo)"


def test_headline_error_over_seeds() -> None:
    """H1-H3 carry the range of their error over the reported seed and the others; the
    other rows none; the summary and the terminal view show it."""
    h = _headline()
    other = headline_predictions(_figs(), {"throughput_tok_s_gpu": 40.0,
                                           "interactivity_tok_s": 260.0,
                                           "revenue_usd_gpu_h": 40.0, "num_gpus": 48})
    seed_spread(h, [other])
    df = build_table(_figs(), FIT_ROWS, _profile(), h, None, LOO)
    rows = df.set_index("key")
    assert list(rows.loc["H1", ["seed_error_min", "seed_error_max"]]) == pytest.approx(
        [-0.6, -0.5])
    assert list(rows.loc["H2", ["seed_error_min", "seed_error_max"]]) == pytest.approx(
        [0.25, 0.3])
    assert list(rows.loc["H3", ["seed_error_min", "seed_error_max"]]) == [0.0, 0.0]
    assert rows.drop(index=["H1", "H2", "H3"])["seed_error_min"].isna().all()
    assert summary(df, None)["error_over_seeds"] == {"H1": pytest.approx([-0.6, -0.5]),
                                                     "H2": pytest.approx([0.25, 0.3]),
                                                     "H3": [0.0, 0.0]}
    view = format_table(df, None)
    assert "over seeds" in view and "-60.0% to -50.0%" in view


def test_table_without_simulation_and_its_summary() -> None:
    df = build_table(_figs(), FIT_ROWS, _profile(), None, None, LOO)
    assert df.set_index("key").loc["H1", "status"] == "not modelled"
    s = summary(df, None, window_s=1.0)
    assert s["complete"] is True and s["window_s"] == 1.0
    assert s["figures_by_status"]["fitted"] == 3
    assert s["fitted_error"] == {"rows": 5, "median_abs": pytest.approx(0.1),
                                 "max_abs": pytest.approx(0.2), "worst": "Z@W1"}
    assert s["loo_error"]["worst"] == "X.on" and s["loo_error"]["max_abs"] == pytest.approx(0.5)
    assert s["exactly_determined"] == ["X"]
    assert s["refit_drift_max"] == pytest.approx(0.0)


def test_headline_fit_file(tmp_path: Path) -> None:
    assert read_headline_fit(tmp_path / "none.yaml") is None
    good = tmp_path / "good.yaml"
    good.write_text("fitted_to: [H1]\nloo:\n  H1: {predicted: 9.0e5, note: x}\n")
    assert read_headline_fit(good)["loo"]["H1"]["predicted"] == 9.0e5
    for text in ("loo: {H1: {note: x}}\n", "loo: [1, 2]\n", "loo: {H1: {predicted: abc}}\n",
                 "a: [\n"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(FidelityError, match="bad.yaml"):
            read_headline_fit(bad)
