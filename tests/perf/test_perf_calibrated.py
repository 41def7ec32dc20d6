"""The calibrated step model as the engine uses it."""

from __future__ import annotations

import pytest

from rackSim.calibrate.scenario import DEFAULT_PROFILE, operating_point
from rackSim.perf import COMPONENTS, DecodeBatch, PrefillBatch, build_step_model
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.prefill_opts import PrefillOptimisations
from rackSim.perf.profile import Profile

PROFILE = Profile.load(DEFAULT_PROFILE)


def _model(width: int = 32, **kw: object) -> CalibratedStepModel:
    cfg = operating_point(decode_gpus=width, profile=DEFAULT_PROFILE)
    return CalibratedStepModel(cfg, "decode", profile=PROFILE, **kw)


def _batch(width: int, reqs: int = 64, ctx: float = 131072.0, step: int = 7500,
           drafts: int = 3) -> DecodeBatch:
    return DecodeBatch([reqs] * width, [reqs * ctx] * width, 3.25, drafts, 0, 0, step)


def test_build_step_model_dispatches_and_fields_sum() -> None:
    cfg = operating_point(decode_gpus=32, profile=DEFAULT_PROFILE)
    model = build_step_model(cfg, "decode", seed=0)
    assert isinstance(model, CalibratedStepModel)
    b = model.decode_step(_batch(32))
    d = b.as_dict()
    assert set(d) == set(COMPONENTS)
    assert all(v >= 0 for v in d.values())
    assert b.total_ms == pytest.approx(sum(d.values()))
    assert 5.0 < b.total_ms < 60.0


def test_same_seed_same_numbers_other_seed_other_stragglers() -> None:
    jittery = PROFILE.with_values({"straggler_jitter_us": 50.0})
    cfg = operating_point(decode_gpus=16, profile=DEFAULT_PROFILE)
    runs = []
    for seed in (1, 1, 2):
        m = CalibratedStepModel(cfg, "decode", seed=seed, profile=jittery)
        runs.append([m.decode_step(_batch(16, step=s)).total_ms for s in range(0, 9000, 97)])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_step_waits_for_the_busiest_rank() -> None:
    m = _model(4)
    even = m.decode_step(DecodeBatch([64] * 4, [64 * 65536.0] * 4, 3.25, 3, 0, 0, 10))
    skew = m.decode_step(DecodeBatch([64, 64, 64, 64], [64 * 65536.0] * 3 + [64 * 131072.0],
                                     3.25, 3, 0, 0, 10))
    alone = m.decode_step(DecodeBatch([64] * 4, [64 * 131072.0] * 4, 3.25, 3, 0, 0, 10))
    assert skew.attention == pytest.approx(alone.attention)
    assert skew.indexer == pytest.approx(alone.indexer) and skew.indexer > even.indexer
    # the short-context path (no linear shortcut) agrees with the busiest-rank rule too
    short = m.decode_step(DecodeBatch([3, 64, 10, 1], [300.0, 64 * 900.0, 5000.0, 100.0],
                                      3.25, 3, 0, 0, 10))
    ref = m.attn.decode_attention_ms(64, 64 * 900.0, 4)
    assert short.attention == pytest.approx(ref)


def test_busiest_rank_mixes_linear_short_and_empty_ranks() -> None:
    """Per-rank work is attention + indexer + dense of that rank alone; the chosen rank is the
    one where that is largest, whichever pricing path each rank takes."""
    m = _model(8)
    a = m.attn

    def work(r: int, c: float) -> float:
        return (a.decode_attention_ms(r, c, 4) + a.decode_indexer_ms(r, c)
                + r * m._rank_terms(4)[2])

    def brute(reqs: list[int], ctxs: list[float]) -> tuple[int, float]:
        best = max(range(len(reqs)), key=lambda i: work(reqs[i], ctxs[i]) if reqs[i] else -1)
        return reqs[best], ctxs[best]

    # empty, linear, short, short, linear (ties rank 1), empty ...
    reqs = [0, 2, 16, 1, 2, 0, 0, 0]
    ctxs = [0.0, 2 * 100_000.0, 16 * 900.0, 100.0, 2 * 100_000.0, 0.0, 0.0, 0.0]
    assert m._busiest_rank(reqs, ctxs, 4) == brute(reqs, ctxs) == (16, 16 * 900.0)
    ctxs[4] = 2 * 4_000_000.0  # a long-context pair outweighs the short requests
    assert m._busiest_rank(reqs, ctxs, 4) == brute(reqs, ctxs) == (2, ctxs[4])


def test_ring_allreduce_costs_more_than_recursive_doubling() -> None:
    ring = _model(32, allreduce="ring").decode_step(_batch(32))
    rd = _model(32, allreduce="recursive_doubling").decode_step(_batch(32))
    assert ring.sync > rd.sync
    assert ring.sync == pytest.approx(PROFILE.value("allreduce_call_ms")
                                      + 62 * PROFILE.value("allreduce_hop_ms"))


def test_eplb_off_is_less_balanced_and_slower() -> None:
    on, off = _model(32, eplb_enabled=True), _model(32, eplb_enabled=False)
    b_on, b_off = on.decode_step(_batch(32)), off.decode_step(_batch(32))
    assert on.balancedness(7500)[0] > off.balancedness(7500)[0]
    assert b_on.moe + b_on.comm < b_off.moe + b_off.comm


def test_wider_instances_spend_less_moe_time_per_step() -> None:
    fixed = {"balancedness": (1.0, 1.0)}
    moe = [_model(w, **fixed).decode_step(_batch(w)).moe for w in (4, 8, 16, 32, 64)]
    assert moe == sorted(moe, reverse=True)


def test_draft_cost_per_draft_token_and_empty_batch() -> None:
    m = _model(8, balancedness=(1.0, 1.0))
    none = m.decode_step(_batch(8, drafts=0))
    three = m.decode_step(_batch(8, drafts=3))
    assert none.draft == 0.0 and three.draft > 0.0
    empty = m.decode_step(DecodeBatch([0] * 8, [0.0] * 8, 1.0, 3, 0, 0, 1))
    assert empty.moe == 0.0 and empty.total_ms == pytest.approx(empty.cpu + empty.sync)


def _prefill(opts: PrefillOptimisations | None = None, lagged: int = 0,
             host: float = 0.0) -> float:
    cfg = operating_point(prefill_gpus=2, profile=DEFAULT_PROFILE)
    m = CalibratedStepModel(cfg, "prefill", profile=PROFILE, prefill_opts=opts,
                            lagged_ranks=lagged, balancedness=(1.0, 1.0))
    b = PrefillBatch(new_tokens=65536, attended_tokens=2 * 163840, num_requests=2,
                     admitted_prompt_tokens=0, ranks=2, host_loaded_bytes=host)
    step = m.prefill_step(b)
    return step.total_ms - step.straggler + m.last_straggler_expected_ms


def test_prefill_toggles_and_lagged_rank() -> None:
    all_on = _prefill(PrefillOptimisations())
    all_off = _prefill(PrefillOptimisations(False, False, False))
    assert all_off > all_on
    for single in (PrefillOptimisations(bounded_replay=False),
                   PrefillOptimisations(large_pages=False),
                   PrefillOptimisations(deepselect=False)):
        assert all_on < _prefill(single) < all_off
    assert _prefill(lagged=1) > all_on
    host = 2 * 100e6
    cfg = operating_point(prefill_gpus=2, profile=DEFAULT_PROFILE)
    assert _prefill(host=host) - all_on == pytest.approx(
        host / 2 / cfg.hardware.host_link_bw_bytes_s * 1e3, rel=1e-6, abs=0.05)


def _tp_cfg(gpus: int = 4):
    from rackSim.config.specs import RunConfig

    data = operating_point(decode_gpus=gpus, prefill_gpus=2, profile=DEFAULT_PROFILE).model_dump()
    data["deployment"]["decode"]["parallelism"] = "TP"
    data["deployment"]["prefill"]["parallelism"] = "TP"
    return RunConfig.model_validate(data)


def test_tensor_parallel_decode_and_prefill() -> None:
    cfg = _tp_cfg(4)
    m = CalibratedStepModel(cfg, "decode", profile=PROFILE)
    assert m.tp == 4
    one = m.decode_step(DecodeBatch([1], [20_000.0], 3.25, 3, 0, 0, 1))
    many = m.decode_step(DecodeBatch([64], [64 * 20_000.0], 3.25, 3, 0, 0, 1))
    assert one.sync == 0.0  # a single DP rank needs no DP sync
    assert one.comm > 0.0 and many.comm > one.comm  # per-layer all-reduces grow with tokens
    assert many.moe > one.moe and many.total_ms > one.total_ms
    assert one.total_ms == pytest.approx(sum(one.as_dict().values()))
    # sharding: one request's 4 tokens on 4 TP GPUs read a quarter of each GEMM's weights;
    # the unsharded input activations (and their quantisation) add a few percent
    sharded = m.dense.gemm_ms(4, 1, shards=4, decode=True)
    assert 0.25 < sharded / m.dense.gemm_ms(4, 1, decode=True) < 0.28
    pre = CalibratedStepModel(cfg, "prefill", profile=PROFILE)
    b = pre.prefill_step(PrefillBatch(8192, 8192, 1, 8192, 2))
    assert b.moe > 0 and b.comm > 0 and b.sync == 0.0


def test_scenario_perf_fields_override_profile_settings() -> None:
    """PerfSpec.lagged_ranks / bounded_replay / large_pages / deepselect override the profile;
    None keeps the profile's setting."""
    cfg = operating_point(prefill_gpus=2, profile=DEFAULT_PROFILE)
    perf = cfg.perf.model_copy(update={"lagged_ranks": 1, "bounded_replay": False,
                                       "large_pages": None, "deepselect": False})
    m = CalibratedStepModel(cfg.model_copy(update={"perf": perf}), "prefill", profile=PROFILE)
    assert m.straggler.lagged == 1
    assert m.prefill_opts == PrefillOptimisations(bounded_replay=False, large_pages=True,
                                                  deepselect=False)


def test_rearrangement_copies_cost_only_while_in_flight() -> None:
    """EPLB rearrangement: the weight copies' HBM traffic is charged to the MoE time of the
    steps right after the rearrangement, and to no other step."""
    m = _model(32, eplb_enabled=True)
    interval = m.cfg.deployment.eplb.interval_steps
    before = m.decode_step(_batch(32, step=interval - 1))
    assert m.eplb_target is not None and m.eplb_target.rearrangements == 0
    at = m.decode_step(_batch(32, step=interval))
    assert m.eplb_target.rearrangements == 1 and m.eplb_target.last_moved_bytes > 0
    moved_ms = 2.0 * m.eplb_target.last_moved_bytes / m._hbm_ms
    later = m.decode_step(_batch(32, step=interval + 500))
    assert at.moe > later.moe
    assert at.moe - later.moe <= moved_ms + 1.0  # at most the whole copy, plus drift
    assert at.moe > before.moe - 1.0
