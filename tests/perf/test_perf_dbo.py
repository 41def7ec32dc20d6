"""Dual-batch overlap (`rackSim/perf/overlap.py`, `deployment.*.dbo`): vLLM's four-phase
schedule by hand, its bounds, the threshold every rank must meet, and what it does to the
steps of a generated model (DeepSeek-V3 on GB200, DeepEP all-to-all kernels)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rackSim.calibrate.figures import expected
from rackSim.config import compose_scenario
from rackSim.config.errors import ScenarioError
from rackSim.config.specs import RunConfig
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.comm import COMBINE_BYTES, DISPATCH_BYTES, alltoall_layer_ms
from rackSim.perf.overlap import (
    dual_batch_ms,
    least_rank_tokens,
    microbatched,
    prefill_microbatch,
    split_alltoall_ms,
)
from rackSim.perf.step import DecodeBatch, PrefillBatch, StepBreakdown

V3_GB200 = ["experiment=smoke", "model=deepseek_v3", "hardware=gb200_nvl72",
            "perf.profile=calibration/gb200_nvl72__deepseek_v3.yaml", "perf.weight_dtype=fp8",
            "workload=synthetic", "workload.synthetic.max_context_tokens=40000",
            "deployment.prefill.instances=2", "deployment.prefill.gpus_per_instance=8",
            "deployment.decode.gpus=16", "deployment.decode.speculative.num_draft_tokens=0",
            "deployment.decode.speculative.accepted_tokens_per_step=1"]
#: the SGLang GB200 prefill operating point (docs/models.md): 8 requests of 2,000 tokens a rank
PREFILL = PrefillBatch(new_tokens=8 * 16000, attended_tokens=8 * 16000, num_requests=64,
                       admitted_prompt_tokens=0, ranks=8)
GPU_PARTS = ("moe", "attention", "indexer", "dense", "comm")


@cache
def _cfg(*extra: str) -> RunConfig:
    return compose_scenario([*V3_GB200, *extra])


def _model(role: str, *extra: str) -> CalibratedStepModel:
    return CalibratedStepModel(_cfg(*extra), role, balancedness=(1.0, 1.0))


def _gpu(b: StepBreakdown) -> float:
    return sum(getattr(b, k) for k in GPU_PARTS)


def _decode(requests: list[int], ctx_per_request: float = 4000.0) -> DecodeBatch:
    return DecodeBatch(requests, [r * ctx_per_request for r in requests], 1.0, 0, 0, 0, 0)


# -- the schedule --------------------------------------------------------------------------------
def test_four_phases_by_hand() -> None:
    """Per MoE layer max(A, D) + max(M, D) + max(M, C) + max(A, C); dense-only layers run both
    microbatches' A back to back. A = 1, M = 3, D = 2, C = 4 ms a layer over 8 MoE layers of
    10: 8 x (2 + 3 + 4 + 4) + 2 x 2 x 1 = 108 ms."""
    assert dual_batch_ms(10.0, 24.0, 16.0, 32.0, layers=10, moe_layers=8) == pytest.approx(108.0)


def test_nothing_to_hide_and_nothing_to_hide_behind() -> None:
    """No all-to-all: both microbatches' compute in a row; no compute: both all-to-alls."""
    assert dual_batch_ms(10.0, 20.0, 0.0, 0.0, 4, 4) == pytest.approx(60.0)
    assert dual_batch_ms(0.0, 0.0, 3.0, 5.0, 4, 4) == pytest.approx(16.0)


@given(a=st.floats(0, 50), m=st.floats(0, 50), d=st.floats(0, 50), c=st.floats(0, 50),
       layers=st.integers(1, 100), dense_layers=st.integers(0, 5))
def test_overlap_is_bounded_by_its_parts(a: float, m: float, d: float, c: float,
                                         layers: int, dense_layers: int) -> None:
    """Never shorter than either resource's total work (compute of both microbatches, or
    their all-to-alls), never longer than both in a row."""
    total = layers + dense_layers
    t = dual_batch_ms(a, m, d, c, total, layers)
    compute, comm = 2.0 * (a + m), 2.0 * (d + c)
    assert t >= max(compute, comm) * (1 - 1e-9) - 1e-9
    assert t <= (compute + comm) * (1 + 1e-9) + 1e-9


def test_the_all_to_all_splits_by_bytes() -> None:
    """A DEP8 layer at 12,000 token copies of 7,168 elements: dispatch is one fixed cost plus
    the FP8 bytes, combine one plus the BF16 bytes; the two add up to the total."""
    op, bw, copies, hidden, n = 0.02, 100e6, 12000.0, 7168, 8
    layer = alltoall_layer_ms(copies, hidden, n, op, bw)
    dispatch, combine = split_alltoall_ms(58 * layer, 58, op)
    remote = copies * hidden * (n - 1) / n / bw
    assert dispatch == pytest.approx(58 * (op + remote * DISPATCH_BYTES))
    assert combine == pytest.approx(58 * (op + remote * COMBINE_BYTES))


def test_every_rank_must_reach_the_threshold() -> None:
    """vLLM splits a step only if every DP rank schedules at least the threshold's tokens
    (and two, one per microbatch): one rank below vetoes it."""
    assert microbatched([32, 40, 512], 32)
    assert not microbatched([32, 31, 512], 32)
    assert not microbatched([1], 0)


def test_the_least_loaded_prefill_rank() -> None:
    even = replace(PREFILL, new_tokens=8000)
    assert least_rank_tokens(even) == 1000
    assert least_rank_tokens(replace(even, busiest_rank_tokens=4500)) == 500


@pytest.mark.parametrize("requests", [1, 3, 64])
def test_a_prefill_microbatch_is_half_at_the_same_mean_context(requests: int) -> None:
    """Half the new tokens over half the requests (a split request counts in both), attending
    to the step's mean context (the model's `cached + new / requests / 2`)."""
    batch = PrefillBatch(new_tokens=16384, attended_tokens=requests * 50000 + 16384,
                         num_requests=requests, admitted_prompt_tokens=900, ranks=2,
                         host_loaded_bytes=1e6, busiest_rank_tokens=9000)
    half = prefill_microbatch(batch)

    def mean_context(b: PrefillBatch) -> float:
        reqs = max(b.num_requests, 1)
        return (b.attended_tokens - b.new_tokens) / reqs + b.new_tokens / reqs / 2.0

    assert half.new_tokens == 8192 and half.busiest_rank_tokens == 4500
    assert half.num_requests == max(requests / 2, 1)
    assert mean_context(half) == pytest.approx(mean_context(batch))
    assert (half.admitted_prompt_tokens, half.host_loaded_bytes) == (900, 1e6)


# -- the step model --------------------------------------------------------------------------------
def test_below_the_threshold_a_step_is_priced_as_without_overlap() -> None:
    """8 decode tokens a rank (threshold 32) and 400 prefill tokens a rank (512): unchanged."""
    on, off = (_model("decode", f"deployment.decode.dbo.enabled={e}") for e in (True, False))
    few = _decode([8] * 16)
    assert on.decode_step(few).as_dict() == off.decode_step(few).as_dict()
    small = replace(PREFILL, new_tokens=3200, attended_tokens=3200, num_requests=2)
    on, off = (_model("prefill", f"deployment.prefill.dbo.enabled={e}") for e in (True, False))
    assert on.prefill_step(small).as_dict() == off.prefill_step(small).as_dict()


def test_one_rank_below_the_threshold_vetoes_the_overlap() -> None:
    batch = _decode([64] * 15 + [20])
    on, off = (_model("decode", f"deployment.decode.dbo.enabled={e}") for e in (True, False))
    assert on.decode_step(batch).as_dict() == off.decode_step(batch).as_dict()


def test_an_overlapped_prefill_step_is_the_schedule_of_its_microbatch() -> None:
    """The step's GPU time is `dual_batch_ms` of the microbatch priced alone, its DeepGEMM
    kernels (MoE, dense GEMMs) slowed by 148 / (148 - 20) on the SMs DeepEP's normal kernels
    leave of GB200's; the exposed all-to-all is what the schedule adds to the compute."""
    on = _model("prefill", "deployment.prefill.dbo.enabled=true")
    off = _model("prefill")
    step = expected(on.prefill_step(PREFILL), on)
    half = off.prefill_step(prefill_microbatch(PREFILL))
    s = 148 / 128
    outside = half.attention + half.indexer + half.dense * s
    dispatch, combine = split_alltoall_ms(half.comm, 58, off._a2a_op_ms)
    assert _gpu(step) == pytest.approx(
        dual_batch_ms(outside, half.moe * s, dispatch, combine, 61, 58), rel=1e-12)
    assert step.moe == pytest.approx(2 * half.moe * s, rel=1e-12)
    assert step.dense == pytest.approx(2 * half.dense * s, rel=1e-12)
    assert step.attention == pytest.approx(2 * half.attention, rel=1e-12)


def test_the_low_latency_kernels_take_no_sms() -> None:
    """DeepEP's low-latency kernels overlap without SMs of their own: the compute parts are
    twice the microbatch's, and GB200's SM count is not needed."""
    ll = ("deployment.prefill.all2all_backend=deepep_low_latency",
          "deployment.prefill.dbo.enabled=true", "hardware.sms=null")
    on = _model("prefill", *ll)
    half = _model("prefill", *ll[:1]).prefill_step(prefill_microbatch(PREFILL))
    step = on.prefill_step(PREFILL)
    assert step.moe == pytest.approx(2 * half.moe, rel=1e-12)
    assert step.dense == pytest.approx(2 * half.dense, rel=1e-12)


def test_overlap_hides_prefill_all_to_all_and_reads_decode_weights_twice() -> None:
    """At the SGLang operating point the all-to-all (a third of the step) nearly vanishes
    behind the other microbatch's compute, and the step is shorter. A decode step at 64
    requests a rank reads its experts' weights once per microbatch: MoE time grows, while the
    exposed all-to-all shrinks."""
    off, on = (_model("prefill", f"deployment.prefill.dbo.enabled={e}") for e in (False, True))
    a, b = expected(off.prefill_step(PREFILL), off), expected(on.prefill_step(PREFILL), on)
    assert b.comm < 0.15 * a.comm
    assert b.total_ms < a.total_ms
    off, on = (_model("decode", f"deployment.decode.dbo.enabled={e}") for e in (False, True))
    a, b = off.decode_step(_decode([64] * 16)), on.decode_step(_decode([64] * 16))
    assert b.moe > 1.3 * a.moe
    assert b.comm < a.comm


def test_a_colocated_step_overlaps_its_prefill_and_decode_together() -> None:
    """A mixed step above the prefill threshold on every rank: both microbatches hold half the
    chunks and half of every rank's decoding requests; the exposed all-to-all shrinks."""
    lay = ["deployment=colocated_dep16", "deployment.colocated.gpus=8",
           "deployment.prefill.instances=0", "deployment.decode.instances=0"]
    off, on = (_model("colocated", *lay, f"deployment.colocated.dbo.enabled={e}")
               for e in (False, True))
    dec = _decode([16] * 8)
    a, b = off.mixed_step(PREFILL, dec), on.mixed_step(PREFILL, dec)
    assert b.comm < 0.5 * a.comm
    assert b.draft == a.draft


# -- refused -------------------------------------------------------------------------------------
def test_a_fused_megamoe_profile_has_nothing_to_overlap() -> None:
    cfg = compose_scenario(["experiment=smoke", "deployment.decode.dbo.enabled=true"])
    with pytest.raises(ScenarioError, match=r"deployment\.decode\.dbo\.enabled: .*MegaMoE"):
        CalibratedStepModel(cfg, "decode")


@pytest.mark.parametrize("overrides, match", [
    (["deployment.prefill.parallelism=TP", "deployment.prefill.gpus_per_instance=8",
      "deployment.prefill.dbo.enabled=true"], r"deployment\.prefill\.dbo\.enabled: .* TP8"),
    (["hardware.sms=null", "deployment.prefill.dbo.enabled=true"], r"hardware\.sms: GB200"),
    (["deployment.prefill.dbo.comm_sms=148", "deployment.prefill.dbo.enabled=true"],
     r"deployment\.prefill\.dbo\.comm_sms=148: .*148 SMs"),
    (["model=meta_llama_3_1_70b", "perf.profile=calibration/gb200_nvl72__meta_llama_3_1_70b.yaml",
      "deployment.decode.dbo.enabled=true"], r"deployment\.decode\.dbo\.enabled: .*no routed"),
])
def test_scenarios_the_overlap_cannot_run_are_refused(overrides: list[str], match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        compose_scenario([*V3_GB200, *overrides])
