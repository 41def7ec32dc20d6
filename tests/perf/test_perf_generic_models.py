"""Generated models (GQA dense, GQA MoE, MLA MoE) through the step models: KV bytes per token
read by decode attention, no MoE / all-to-all / indexer / mHC where the model has none, TP
splitting GQA KV heads, and the reference model's numbers untouched."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackSim.calibrate.scenario import DEFAULT_PROFILE
from rackSim.config import compose_scenario
from rackSim.config.specs import RunConfig
from rackSim.perf.attention import attention_cost
from rackSim.perf.calibrated import CalibratedStepModel, dense_cost
from rackSim.perf.profile import Profile
from rackSim.perf.roofline import RooflineStepModel
from rackSim.perf.step import DecodeBatch, PrefillBatch

#: speeds a table profile fits for standard attention (values only matter for the arithmetic)
ATTN = {"attn_kernel_us": 4.0, "attn_hbm_efficiency": 0.7, "attn_flops_efficiency": 0.5,
        "attn_request_us": 0.0}
NO_SPEC = ["deployment.decode.speculative.num_draft_tokens=0",
           "deployment.decode.speculative.accepted_tokens_per_step=1"]


#: layouts whose weights fit: Qwen3-235B needs 4-wide prefill on H200 (141 GB); DeepSeek-V3
#: (671B in FP8) 4-wide instances on GB300 (279 GB) - on H200 it needs 8-wide instances, a
#: whole HGX node each
FITS = {"qwen3_235b_a22b": ["hardware=h200_hgx", "deployment.prefill.instances=1",
                            "deployment.prefill.gpus_per_instance=4"],
        "deepseek_v3": ["hardware=gb300_nvl72", "deployment.prefill.gpus_per_instance=4"]}


def _cfg(model: str, *extra: str) -> RunConfig:
    return compose_scenario(["experiment=smoke", f"model={model}", "perf.weight_dtype=fp8",
                             "workload=synthetic", *NO_SPEC,
                             *FITS.get(model, ["hardware=h200_hgx"]), *extra])


def _profile() -> Profile:
    """The reference profile's speeds plus ATTN's, standing in for any model's profile (so
    it names no model: a profile that names one prices that model only)."""
    p = Profile.load(DEFAULT_PROFILE).with_values(ATTN)
    del p.meta["model"]
    return p


def _decode(reqs: list[int], ctx: list[float], step: int = 1) -> DecodeBatch:
    return DecodeBatch(requests_per_rank=reqs, context_tokens_per_rank=ctx,
                       tokens_per_request=1.0, draft_tokens=0, new_loads=0,
                       admitted_prompt_tokens=0, step_index=step)


@pytest.mark.parametrize("model, kv_bytes", [
    ("meta_llama_3_1_70b", 2 * 80 * 8 * 128),      # GQA: 2 x layers x kv_heads x head_dim
    ("qwen3_235b_a22b", 2 * 94 * 4 * 128),
    ("deepseek_v3", 61 * (512 + 64)),               # MLA: layers x (latent + rope)
])
def test_decode_attention_reads_every_cached_byte(model: str, kv_bytes: int) -> None:
    cfg = _cfg(model)
    assert cfg.model.kv_bytes_per_token == kv_bytes
    a = attention_cost(cfg.model, cfg.hardware, _profile(), "fp8")
    hbm_ms = cfg.hardware.hbm_bw_bytes_s / 1e3 * ATTN["attn_hbm_efficiency"]
    flops_ms = cfg.hardware.flops["bf16"] / 1e3 * ATTN["attn_flops_efficiency"]
    reqs, ctx = 8, 8 * 10_000
    got = a.decode_attention_ms(reqs, ctx, q=1)
    # full attention: every layer attends the whole context; bytes = KV of all tokens
    expect = (cfg.model.num_layers * ATTN["attn_kernel_us"] / 1e3 + ctx * kv_bytes / hbm_ms
              + ctx * cfg.model.num_layers * a.entry_flops / flops_ms)
    assert got == pytest.approx(expect, rel=1e-12)
    assert a.decode_indexer_ms(reqs, ctx) == 0.0
    assert a.prefill_indexer_score_ms(4096, 2048) == 0.0


def test_mla_decode_attends_the_absorbed_latent_and_prefill_per_head() -> None:
    cfg = _cfg("deepseek_v3")
    a = attention_cost(cfg.model, cfg.hardware, _profile(), "fp8")
    assert a.entry_flops == 2 * 128 * (2 * 512 + 64)
    assert a.prefill_entry_flops == 2 * 128 * (192 + 128)


def test_dense_model_has_no_moe_comm_or_mhc() -> None:
    cfg = _cfg("meta_llama_3_1_70b")
    model = CalibratedStepModel(cfg, "decode", profile=_profile())
    assert model.eplb_target is None
    out = model.decode_step(_decode([16, 16, 16, 16], [16 * 8000.0] * 4))
    assert out.moe == out.comm == out.indexer == out.draft == 0.0
    assert out.dense > 0 and out.attention > 0
    d = dense_cost(cfg, _profile())
    assert d.mhc_ms(1000) == 0.0
    # the dense GEMMs hold every non-embedding parameter once
    assert sum(g.params for g in d.gemms) == pytest.approx(
        cfg.model.dense_params - cfg.model.vocab_size * cfg.model.hidden_size)
    p = model.prefill_step(PrefillBatch(new_tokens=8192, attended_tokens=8192, num_requests=2,
                                        admitted_prompt_tokens=8192, ranks=2))
    assert p.moe == p.comm == p.indexer == 0.0 and p.attention > 0


def test_moe_models_route_and_balance() -> None:
    cfg = _cfg("qwen3_235b_a22b")
    model = CalibratedStepModel(cfg, "decode", profile=_profile())
    out = model.decode_step(_decode([32] * 4, [32 * 4000.0] * 4))
    assert out.moe > 0 and out.comm > 0 and out.attention > 0


def test_tp_splits_gqa_kv_heads() -> None:
    """TP4 decode of Llama-3.1-70B: each GPU reads a quarter of the KV (8 KV heads / 4)."""
    tp = _cfg("meta_llama_3_1_70b", "deployment.decode.parallelism=TP")
    model = CalibratedStepModel(tp, "decode", profile=_profile())
    assert model._kv_shards == 4
    a = model.attn
    one = model.decode_step(_decode([1, 0, 0, 0], [50_000.0, 0, 0, 0])).attention
    two = model.decode_step(_decode([1, 0, 0, 0], [100_000.0, 0, 0, 0])).attention
    per_token = (two - one) / 50_000
    expect = a.layers * (a.entry_flops / a.flops_ms / 4 + a.entry_bytes / a.bytes_ms / 4)
    assert per_token == pytest.approx(expect, rel=1e-9)


def test_tp_width_that_does_not_divide_the_heads_is_refused() -> None:
    from rackSim.config import ConfigError

    with pytest.raises(ConfigError, match="divides 64"):
        _cfg("meta_llama_3_1_70b", "deployment.decode.parallelism=TP",
             "deployment.decode.gpus=3")


def test_roofline_prices_a_dense_model_without_experts() -> None:
    cfg = _cfg("meta_llama_3_1_70b", "perf.model=roofline")
    out = RooflineStepModel(cfg).decode_step(_decode([8] * 4, [8 * 4000.0] * 4))
    assert out.moe == 0.0 and out.comm == 0.0 and out.dense > 0


@settings(max_examples=40, deadline=None)
@given(reqs=st.integers(1, 256), ctx=st.floats(1.0, 60_000.0),
       more=st.floats(1.0, 60_000.0), model=st.sampled_from(["meta_llama_3_1_70b",
                                                             "deepseek_v3"]))
def test_decode_attention_grows_with_context_and_requests(reqs: int, ctx: float, more: float,
                                                           model: str) -> None:
    a = _attn(model)
    base = a.decode_attention_ms(reqs, reqs * ctx, 1)
    assert a.decode_attention_ms(reqs, reqs * (ctx + more), 1) >= base
    assert a.decode_attention_ms(reqs + 1, (reqs + 1) * ctx, 1) >= base
    # more query tokens per request (speculative verification) only add FLOPs
    assert a.decode_attention_ms(reqs, reqs * ctx, 4) >= base


@cache
def _attn(model: str):
    cfg = _cfg(model)
    return attention_cost(cfg.model, cfg.hardware, _profile(), "fp8")
