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
    "L2": (0.75, "the GB300 configuration is unspecified; at the ASSUMED L1 layout (TP4, "
                 "concurrency 1) GB300 is at least as fast as B300 in every peak, so removing "
                 "the same per-layer latency gains at least L1's 44 % there, not 26 % (see "
                 "test_l2_cannot_be_26_percent_at_the_l1_layout)"),
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


def test_l1_both_ends_within_five_percent(table: dict[str, dict[str, object]]) -> None:
    """L1: 575 (standard) -> 826 (specialised) tokens/s per user, B300 TP4, concurrency 1."""
    assert table["L1.standard"]["published"] == 575.0
    assert table["L1.low_latency"]["published"] == 826.0
    for fig in ("L1.standard", "L1.low_latency"):
        assert abs(table[fig]["error"]) <= TOLERANCE, table[fig]
    gain = table["L1.low_latency"]["predicted"] / table["L1.standard"]["predicted"] - 1.0
    assert gain == pytest.approx(0.44, abs=0.02)  # "+44 %"


def test_l2_cannot_be_26_percent_at_the_l1_layout() -> None:
    """Every GB300 peak is >= the B300 one, so a step's bytes/FLOPs time on GB300 is <= that on
    B300; removing the same per-layer latency then gains at least as much on GB300 as on B300
    (44 %, L1). 26 % on GB300 needs more work per step: the model reaches it near concurrency 6-8
    at TP4 (a prediction, recorded in calibration/README.md)."""
    p = Profile.load(DEFAULT_PROFILE)
    point = figures.targets()["low_latency"]["L2"]
    gain = {}
    for hw in ("b300_hgx", "gb300_nvl72"):
        pt = {**point, "hardware": hw}
        std, ll = (figures.low_latency_step_ms(p, pt, on) for on in (False, True))
        gain[hw] = 100.0 * (std / ll - 1.0)
    assert gain["gb300_nvl72"] >= gain["b300_hgx"] >= 40.0
    pt8 = {**point, "concurrency": 8}
    std, ll = (figures.low_latency_step_ms(p, pt8, on) for on in (False, True))
    pt6 = {**point, "concurrency": 6}
    std6, ll6 = (figures.low_latency_step_ms(p, pt6, on) for on in (False, True))
    assert 100.0 * (std / ll - 1.0) <= 26.0 <= 100.0 * (std6 / ll6 - 1.0)
