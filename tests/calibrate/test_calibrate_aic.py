"""The MoE model against aiconfigurator-core GB300 kernel tables at EP widths left out of the
fit. Tolerance per held-out width: median |error| <= 25 %, 90th percentile <= 40 %.
(The kernel tables step with tile sizes that a smooth bytes/FLOPs model does not follow.)
"""

from __future__ import annotations

import pytest

from rackSim.calibrate import aic
from rackSim.calibrate.scenario import DEFAULT_PROFILE, operating_point
from rackSim.perf.moe import MoeKernel
from rackSim.perf.profile import Profile

ROOT = aic.aic_root()
pytestmark = pytest.mark.skipif(ROOT is None, reason="aiconfigurator-core not installed "
                                                     "(optional extra 'aic')")
MEDIAN_TOL, P90_TOL = 0.25, 0.40


def _kernel() -> tuple[MoeKernel, float]:
    p = Profile.load(DEFAULT_PROFILE)
    cfg = operating_point()
    hw = cfg.hardware
    k = MoeKernel(kernel_ms=p.value("moe_kernel_us") / 1e3,
                  hbm_bytes_ms=hw.hbm_bw_bytes_s / 1e3 * p.value("moe_hbm_efficiency"),
                  flops_ms=hw.flops["fp4"] / 1e3 * p.value("moe_flops_efficiency"),
                  token_bytes=p.value("moe_token_bytes"))
    return k, cfg.model.weight_bytes_per_param


def test_held_out_ep_widths_within_tolerance() -> None:
    assert ROOT is not None
    rows = aic.load_moe_rows(ROOT)
    assert set(aic.HELD_OUT_EP) <= set(rows.moe_ep_size)
    kernel, wb = _kernel()
    held = aic.held_out_errors(kernel, rows, wb)
    for r in held.itertuples():
        assert r.median_abs_err <= MEDIAN_TOL, r
        assert r.p90_abs_err <= P90_TOL, r


def test_profile_records_the_same_held_out_errors() -> None:
    stored = Profile.load(DEFAULT_PROFILE).kernel_fit["moe"]["held_out"]
    assert [r["ep"] for r in stored] == list(aic.HELD_OUT_EP)
    assert ROOT is not None
    kernel, wb = _kernel()
    held = aic.held_out_errors(kernel, aic.load_moe_rows(ROOT), wb)
    for s, r in zip(stored, held.itertuples(), strict=True):
        assert s["median_abs_err"] == pytest.approx(r.median_abs_err, rel=1e-3)


def test_weight_bound_at_few_tokens_compute_bound_at_many() -> None:
    """Table shape the model must follow: at EP 8, 1 -> 32 tokens grows latency (more experts
    hit, weight reads); at 16K tokens latency grows with tokens (compute)."""
    assert ROOT is not None
    rows = aic.load_moe_rows(ROOT)
    kernel, wb = _kernel()
    sub = rows[rows.moe_ep_size == 8].sort_values("num_tokens")
    pred = aic.predict_moe_rows(kernel, sub, wb)
    meas = sub.latency.to_numpy()
    assert pred[-1] / pred[0] == pytest.approx(meas[-1] / meas[0], rel=0.35)
