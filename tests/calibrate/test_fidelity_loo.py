"""Leave-one-out: the generic machinery on a toy line fit, and the profile fit's `exclude`."""

from __future__ import annotations

import numpy as np
import pytest

from rackSim.calibrate import figures, fit
from rackSim.calibrate.loo import (
    calibration_fit,
    calibration_predict,
    figure_id,
    leave_one_out,
)
from rackSim.calibrate.scenario import DEFAULT_PROFILE
from rackSim.perf.profile import Profile

X = np.array([0.0, 1.0, 2.0, 3.0])
Y = np.array([0.1, 0.9, 2.2, 2.8])  # y = x plus noise
IDS = [f"p{i}" for i in range(len(X))]


def _line_fit(excluded: frozenset[str]) -> np.ndarray:
    keep = [i for i, name in enumerate(IDS) if name not in excluded]
    return np.polyfit(X[keep], Y[keep], 1)


def _line_predict(coef: np.ndarray, name: str) -> dict[str, float]:
    return {name: float(np.polyval(coef, X[IDS.index(name)]))}


@pytest.mark.parametrize("jobs", [1, 2])
def test_line_loo_matches_hand_computation(jobs: int) -> None:
    df = leave_one_out(IDS, _line_fit, _line_predict, jobs=jobs).set_index("key")
    assert list(df.columns) == ["left_out", "loo_predicted", "refit_predicted"]
    assert sorted(df.index) == IDS and (df["left_out"] == df.index).all()
    # Without p0 the line through (1, 0.9), (2, 2.2), (3, 2.8) has slope
    # ((-1)(0.9 - 1.9667) + (1)(2.8 - 1.9667)) / 2 = 0.95 and intercept 1.9667 - 2 x 0.95.
    assert df.loc["p0", "loo_predicted"] == pytest.approx(5.9 / 3 - 1.9, abs=1e-12)
    # Without p3: slope ((-1)(0.1 - 1.0667) + (1)(2.2 - 1.0667)) / 2 = 1.05, at x = 3:
    assert df.loc["p3", "loo_predicted"] == pytest.approx(3.2 / 3 + 1.05 * 2, abs=1e-12)
    # Every point: the closed form of least-squares LOO, y_i - e_i / (1 - h_ii).
    design = np.column_stack([np.ones_like(X), X])
    hat = np.diag(design @ np.linalg.inv(design.T @ design) @ design.T)
    full = np.polyval(np.polyfit(X, Y, 1), X)
    expect = Y - (Y - full) / (1 - hat)
    assert df.loc[IDS, "loo_predicted"].to_numpy() == pytest.approx(expect, abs=1e-12)
    assert df.loc[IDS, "refit_predicted"].to_numpy() == pytest.approx(full, abs=1e-12)


def test_figure_id_of_fit_table_keys() -> None:
    assert [figure_id(k) for k in ("D5@DEP4", "C1.ring", "E1.off", "P3")] == [
        "D5", "C1", "E1", "P3"]


def test_exclude_rejects_unknown_figure() -> None:
    p = fit.start_profile(Profile.load(DEFAULT_PROFILE))
    with pytest.raises(ValueError, match="exclude: no fitted figure"):
        fit.fit_published(p, lambda _: None, frozenset({"Z9"}))


def test_leaving_c1_out_leaves_its_parameters_at_their_initial_guesses() -> None:
    """C1 is fitted by two parameters of its own: without it nothing constrains them."""
    profile = Profile.load(DEFAULT_PROFILE)
    loo = calibration_fit(profile, frozenset({"C1"}))
    for name in ("allreduce_call_ms", "allreduce_hop_ms"):
        assert loo.value(name) == pytest.approx(fit.START[name][0], rel=1e-9)
        assert loo.params[name]["fitted_to"] == []
        assert "left out" in loo.params[name]["source"]
    start = profile.with_values({n: fit.START[n][0]
                                 for n in ("allreduce_call_ms", "allreduce_hop_ms")})
    expect = {k: v for k, v in figures.predict_cpu(start).items() if k.startswith("C1")}
    assert calibration_predict(loo, "C1") == pytest.approx(expect, rel=1e-9)
    # C2 (its own stage, unaffected by C1) is still met within 1e-6
    pred = calibration_predict(loo, "C2")
    assert pred == pytest.approx({"C2.baseline": 38.8, "C2.optimised": 6.0}, rel=1e-6)
