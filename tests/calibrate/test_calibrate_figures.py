"""Each published calibration figure, reproduced by the committed profile.

Tolerance: 5 % relative. Figures the model cannot reach within 5 % are listed in
`LIMITS` with the reason and the tolerance they are held to instead (see calibration/README.md).
"""

from __future__ import annotations

import pytest

from rackSim.calibrate import figures
from rackSim.calibrate.fit import decode_balancedness, fit_table
from rackSim.calibrate.scenario import DEFAULT_PROFILE
from rackSim.perf.profile import Profile

TOLERANCE = 0.05

#: figure -> (tolerance, why 5 % cannot be met)
LIMITS = {
    "E2.on": (0.12, "draft model: 4 experts per rank at DEP32 and no redundant experts; no "
                    "placement can beat 4 x the contiguous balancedness (4 x 0.21 = 0.84 < "
                    "0.89; see test_no_redundancy_bound)"),
}


@pytest.fixture(scope="module")
def table() -> dict[str, dict[str, object]]:
    return {r["figure"]: r for r in fit_table(Profile.load(DEFAULT_PROFILE))}


def test_every_published_figure_is_reproduced(table: dict[str, dict[str, object]]) -> None:
    pub = figures.published_values()
    assert {k.split("@")[0] for k in table} >= {k for k in pub if not k.startswith("P6")}
    for fig, row in table.items():
        if fig == "E4":
            continue
        tol = LIMITS.get(fig, (TOLERANCE, ""))[0]
        assert abs(row["error"]) <= tol, (fig, row)


def test_limits_are_still_needed(table: dict[str, dict[str, object]]) -> None:
    """A figure that now fits within 5 % should leave LIMITS."""
    for fig in LIMITS:
        assert abs(table[fig]["error"]) > TOLERANCE, f"{fig} now fits: drop it from LIMITS"


def test_rebalance_under_one_second_at_dep32(table: dict[str, dict[str, object]]) -> None:
    assert table["E4"]["predicted"] < 1.0  # E4: < 1 s


def test_profile_residuals_are_reproducible(table: dict[str, dict[str, object]]) -> None:
    """The residuals recorded in the committed profile are what the model predicts now."""
    stored = {r["figure"]: r for r in Profile.load(DEFAULT_PROFILE).residuals}
    for fig, row in table.items():
        assert float(stored[fig]["predicted"]) == pytest.approx(float(row["predicted"]),
                                                               rel=1e-4)


def test_communication_share_grows_with_width() -> None:
    """All-to-all time relative to expert time grows from DEP4 to DEP32 (the mechanism behind
    D6; D6 itself - draft communication offsetting the MoE gain - is not reproduced, see
    calibration/README.md)."""
    p = Profile.load(DEFAULT_PROFILE)
    b = decode_balancedness(p)
    lo, _ = figures.decode_breakdown(p, 4, b[4])
    hi, m = figures.decode_breakdown(p, 32, b[32])
    assert hi.draft / hi.total_ms > 0.0
    assert hi.comm / hi.moe > lo.comm / lo.moe


def test_every_fitted_parameter_records_its_source() -> None:
    p = Profile.load(DEFAULT_PROFILE)
    for name, entry in p.params.items():
        assert entry["fitted_to"], name
        assert entry["source"] and "initial guess" not in entry["source"], name
        assert entry["fit_quality"], name
    for name, entry in p.constants.items():
        assert entry["source"], name
