"""TP small-batch decode: the standard path vs the specialised low-latency kernels (L1, L2)."""

from __future__ import annotations

import pytest

from rackSim.calibrate.scenario import DEFAULT_PROFILE, operating_point
from rackSim.perf import DecodeBatch
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.profile import Profile

PROFILE = Profile.load(DEFAULT_PROFILE)
BATCH = DecodeBatch([1], [30_000.0], 3.25, 3, 0, 0, 10)


def _tp(hardware: str = "b300_hgx", gpus: int = 4):
    return operating_point(hardware=hardware, decode_gpus=gpus, prefill_gpus=gpus,
                           parallelism="TP", profile=DEFAULT_PROFILE)


def _profile(std_us: float, ll_us: float, **settings: object) -> Profile:
    p = PROFILE.with_values({"tp_layer_latency_us_standard": std_us,
                             "tp_layer_latency_us_low_latency": ll_us})
    p.settings = {**p.settings, **settings}
    return p


def _step(p: Profile, low_latency: bool | None, hardware: str = "b300_hgx"):
    m = CalibratedStepModel(_tp(hardware), "decode", profile=p, balancedness=(1.0, 1.0),
                            low_latency_decode=low_latency)
    return m.decode_step(BATCH), m


def test_b300_hardware_spec() -> None:
    hw = _tp().hardware
    assert hw.name == "B300-HGX" and hw.gpus_per_rack == 8
    assert hw.hbm_bw_bytes_s == 7.75e12 and hw.hbm_bytes == 275e9
    assert hw.flops == {"fp4": 14e15, "fp8": 4.5e15, "bf16": 2.25e15}
    assert hw.nvlink_bw_bytes_s == 900e9 and hw.power_w == 1100


def test_layer_latency_by_hand() -> None:
    """Per-layer latency x layers executed: 43 target layers + 3 draft tokens x 1 draft layer.
    With 50 us (standard) and 10 us (specialised) per layer the paths differ by
    (43 + 3 * 1) * 40 us = 1.84 ms: 43 * 40 us = 1.72 ms in `dense`, 3 * 40 us = 0.12 ms in
    `draft`; every other part is identical."""
    p = _profile(50.0, 10.0)
    std, m = _step(p, False)
    ll, _ = _step(p, True)
    assert m.cfg.model.num_layers == 43 and m.cfg.model.draft.num_layers == 1
    assert std.total_ms - ll.total_ms == pytest.approx(1.84, rel=1e-9)
    assert std.dense - ll.dense == pytest.approx(1.72, rel=1e-9)
    assert std.draft - ll.draft == pytest.approx(0.12, rel=1e-9)
    for part in ("moe", "attention", "indexer", "comm", "cpu", "sync"):
        assert getattr(std, part) == getattr(ll, part)
    # zero latency on both paths: the step of the plain bytes/FLOPs model
    zero, _ = _step(_profile(0.0, 0.0), True)
    assert ll.total_ms - zero.total_ms == pytest.approx(46 * 0.010, rel=1e-9)


def test_toggle_profile_setting_and_constructor_override() -> None:
    on = _profile(50.0, 10.0, low_latency_decode=True)
    off = _profile(50.0, 10.0, low_latency_decode=False)
    assert _step(on, None)[1].low_latency_decode is True
    assert _step(off, None)[1].low_latency_decode is False
    assert _step(off, True)[1].low_latency_decode is True  # the argument wins
    assert _step(off, None)[0].total_ms == pytest.approx(_step(on, False)[0].total_ms)


def test_dep_decode_is_unchanged_by_the_toggle() -> None:
    """The D1-D5 (DEP) step has its per-layer costs fitted to D1-D5; the toggle is TP only."""
    cfg = operating_point(decode_gpus=4, profile=DEFAULT_PROFILE)
    b = DecodeBatch([1] * 4, [30_000.0] * 4, 3.25, 3, 0, 0, 10)
    a = CalibratedStepModel(cfg, "decode", profile=PROFILE, balancedness=(1.0, 1.0),
                            low_latency_decode=True).decode_step(b)
    c = CalibratedStepModel(cfg, "decode", profile=PROFILE, balancedness=(1.0, 1.0),
                            low_latency_decode=False).decode_step(b)
    assert a.total_ms == c.total_ms


def test_gain_shrinks_with_work_per_step() -> None:
    """A fixed per-layer latency is amortised over more work: the specialised path's gain falls
    as concurrency grows."""
    gains = []
    for c in (1, 4, 16):
        b = DecodeBatch([c], [c * 30_000.0], 3.25, 3, 0, 0, 10)
        t = [CalibratedStepModel(_tp(), "decode", profile=PROFILE, balancedness=(1.0, 1.0),
                                 low_latency_decode=on).decode_step(b).total_ms
             for on in (False, True)]
        gains.append(t[0] / t[1])
    assert gains[0] > gains[1] > gains[2] > 1.0
