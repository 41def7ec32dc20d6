"""Decode admission CPU: per DP rank, hidden behind the GPU step by async scheduling, exposed
by the slowest rank beyond it."""

from __future__ import annotations

import pytest

from rackSim.calibrate.scenario import DEFAULT_PROFILE, operating_point
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.cpu import exposed_cpu_ms, rank_admission_ms
from rackSim.perf.profile import Profile
from rackSim.perf.step import DecodeBatch

PROFILE = Profile.load(DEFAULT_PROFILE)
NS = PROFILE.value("admission_ns_per_token")  # C2, optimised: ~7.0 ns per prompt token


def test_rank_admission_hand() -> None:
    # 3 requests, 300K prompt tokens, 40 received blocks at 7 ns / token, 50 us / request,
    # 1 us / block: 2.1 + 0.15 + 0.04 ms
    assert rank_admission_ms(3, 300_000, 40, 7.0, 50.0, 1.0) == pytest.approx(2.29)
    assert rank_admission_ms(0, 0, 0, 7.0, 50.0, 1.0) == 0.0


def test_exposed_cpu_is_the_slowest_ranks_excess_over_the_gpu_step() -> None:
    ranks = [(1, 100_000, 10), (4, 400_000, 80)]  # 0.76 ms and 3.08 ms of work
    assert exposed_cpu_ms(0.0, ranks, 5.0, 7.0, 50.0, 1.0) == 0.0  # hidden
    assert exposed_cpu_ms(0.0, ranks, 2.0, 7.0, 50.0, 1.0) == pytest.approx(3.08 - 2.0)
    # the fitted per-step residual shows whatever the overlap
    assert exposed_cpu_ms(0.05, ranks, 5.0, 7.0, 50.0, 1.0) == pytest.approx(0.05)
    assert exposed_cpu_ms(0.05, [], 0.0, 7.0, 50.0, 1.0) == pytest.approx(0.05)


def _model(width: int) -> CalibratedStepModel:
    cfg = operating_point(decode_gpus=width, profile=DEFAULT_PROFILE)
    return CalibratedStepModel(cfg, "decode", profile=PROFILE, balancedness=(1.0, 1.0))


def _batch(width: int, admissions: tuple = (), loads: int = 0, tokens: int = 0) -> DecodeBatch:
    return DecodeBatch([64] * width, [64 * 40_000.0] * width, 3.25, 3, loads, tokens, 7500,
                       admissions)


def _gpu(cost) -> float:
    return cost.total_ms - cost.cpu - cost.sync - cost.straggler - cost.kv_stall


def test_a_burst_on_one_rank_shows_beyond_the_gpu_step_and_spread_over_ranks_hides() -> None:
    m = _model(32)
    d = m.cfg.deployment.decode
    step = m.profile.value("cpu_step_ms")
    quiet = m.decode_step(_batch(32))
    assert quiet.cpu == step  # D1-D5 (no loads): the fitted per-step residual, unchanged
    # K2's burst of 140 new loads of 100K-token prompts (1 block each to move), all on one
    # rank: 140 x (0.70 ms copy + 50 us) + 140 blocks x 1 us ~ 105 ms, far beyond the GPU step
    burst = ((140, 140 * 100_000, 140),)
    cost = m.decode_step(_batch(32, burst, 140, 140 * 100_000))
    work = (140 * 100_000 * NS * 1e-6 + (140 * d.admission_us_per_request
                                         + 140 * d.admission_us_per_block) * 1e-3)
    assert cost.cpu == pytest.approx(step + work - _gpu(cost), rel=1e-9)
    # the same 140 loads spread over the 32 ranks (4-5 each, ~3.4 ms) hide under the step
    spread = tuple((5 if r < 12 else 4, (5 if r < 12 else 4) * 100_000, 5 if r < 12 else 4)
                   for r in range(32))
    assert sum(s[0] for s in spread) == 140
    assert m.decode_step(_batch(32, spread, 140, 140 * 100_000)).cpu == step


def test_a_caller_without_per_rank_admissions_is_taken_as_one_rank() -> None:
    m = _model(8)
    one = m.decode_step(_batch(8, ((140, 14_000_000, 0),), 140, 14_000_000))
    legacy = m.decode_step(_batch(8, (), 140, 14_000_000))
    assert legacy.cpu == pytest.approx(one.cpu) and legacy.cpu > 0.0


def test_tp_instance_exposes_admission_beyond_its_gpu_step() -> None:
    cfg = operating_point(decode_gpus=4, profile=DEFAULT_PROFILE, parallelism="TP")
    m = CalibratedStepModel(cfg, "decode", profile=PROFILE, balancedness=(1.0, 1.0))
    b = DecodeBatch([64], [64 * 40_000.0], 3.25, 3, 140, 14_000_000, 7, ((140, 14_000_000, 0),))
    cost = m.decode_step(b)
    d = cfg.deployment.decode
    work = 14_000_000 * NS * 1e-6 + 140 * d.admission_us_per_request * 1e-3
    assert cost.cpu == pytest.approx(m.profile.value("cpu_step_ms") + work - _gpu(cost),
                                     rel=1e-9)
