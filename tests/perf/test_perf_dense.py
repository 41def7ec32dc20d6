"""Dense work from the DeepSeek-V4 layer shapes: hand calculations of the parameter count, the
GEMM list, the GEMM and mHC time, and the model spec's parameter check."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from rackSim.calibrate.scenario import DEFAULT_PROFILE, operating_point
from rackSim.config.specs import ModelSpec
from rackSim.perf.calibrated import dense_geometry
from rackSim.perf.dense import (
    FP8_BLOCK_WEIGHT_BYTES,
    DenseCost,
    DenseGeometry,
    GemmKernel,
    dense_gemms,
    dense_params,
    mhc_bytes_per_token,
)
from rackSim.perf.profile import Profile

#: DeepSeek-V4-Flash config.json shapes, with V4.1's 384 experts and 2688-wide shared expert
V41 = DenseGeometry(hidden=4096, layers=43, csa_layers=21, hca_layers=20, heads=64,
                    head_dim=512, q_lora_rank=1024, o_lora_rank=1024, o_groups=8,
                    indexer_heads=64, indexer_head_dim=128, shared_intermediate=2688,
                    routed_experts=384, vocab=129280, hc_mult=4)
H = 4096


def _per_layer(names: tuple[str, ...]) -> float:
    return sum(g.params / g.layers for g in dense_gemms(V41) if g.name in names)


def test_gemm_shapes_per_layer_hand() -> None:
    attention = H * 1024 + H * 512 + 1024 * 64 * 512 + 8 * (64 * 512 // 8) * 1024 + 8192 * H
    assert attention == 106_954_752
    assert _per_layer(("attn.wq_a+wkv", "attn.wq_b", "attn.wo_a", "attn.wo_b")) == attention
    assert _per_layer(("compressor.csa",)) == 2 * H * 2 * 512      # kv + gate, overlapping
    assert _per_layer(("compressor.hca",)) == 2 * H * 512
    assert _per_layer(("indexer.wq_b", "indexer.weights_proj", "indexer.compressor")) == (
        1024 * 64 * 128 + H * 64 + 2 * H * 2 * 128)
    assert _per_layer(("shared.gate_up", "shared.down")) == 3 * H * 2688
    assert _per_layer(("router",)) == H * 384
    layers = {g.name: g.layers for g in dense_gemms(V41)}
    assert layers["compressor.csa"] == layers["indexer.wq_b"] == 21
    assert layers["compressor.hca"] == 20 and layers["attn.wq_b"] == 43
    assert layers["lm_head"] == 1


def test_dense_parameter_count_hand() -> None:
    """7.666B: the sum written out in scenarios/model/deepseek_v4_1_flash.yaml."""
    mhc = 43 * 2 * (24 * 4 * H + 24 + 3) + 4 * 4 * H + 4 + 1
    want = (43 * (106_954_752 + 3 * H * 2688 + H * 384) + 21 * (2 * H * 1024 + 10_747_904)
            + 20 * 2 * H * 512 + mhc + 2 * 129280 * H)
    assert dense_params(V41) == pytest.approx(want, rel=1e-12)
    assert dense_params(V41) == pytest.approx(7.6657e9, rel=1e-4)


def test_model_spec_states_the_same_dense_count() -> None:
    cfg = operating_point()
    m = cfg.model
    g = dense_geometry(cfg, Profile.load(DEFAULT_PROFILE))
    assert g == V41
    assert m.dense_params == pytest.approx(dense_params(g), rel=1e-3)
    # and routed + dense is M1's 552B within the stated rounding of the expert width
    assert (m.routed_params + m.dense_params) / m.total_params - 1 == pytest.approx(0.0019,
                                                                                abs=1e-4)


def test_v4_flash_itself_sums_to_284b() -> None:
    """The same sum over the V4-Flash config (256 experts x 2048) gives 284.3B."""
    flash = replace(V41, shared_intermediate=2048, routed_experts=256)
    routed = 256 * 43 * 3 * H * 2048
    assert dense_params(flash) + routed == pytest.approx(284.33e9, rel=1e-4)


def test_model_spec_rejects_a_dense_count_that_misses_total_params() -> None:
    data = operating_point().model.model_dump()
    data["dense_params"] = 19e9
    with pytest.raises(ValidationError, match="dense_params"):
        ModelSpec.model_validate(data)


def test_gemm_time_hand() -> None:
    k = GemmKernel(kernel_ms=0.005, hbm_bytes_ms=6e9, flops_ms=3e12, quant_bytes=10.0,
                   weight_bytes=FP8_BLOCK_WEIGHT_BYTES, activation_bytes=1.0)
    m, n, kk = 16384, 32768, 1024
    nbytes = n * kk * FP8_BLOCK_WEIGHT_BYTES + m * kk * (1.0 + 10.0) + 2 * m * n
    one = nbytes / 6e9 + 2 * m * n * kk / 3e12
    assert k.ms(m, n, kk) == pytest.approx(0.005 + one)
    # a grouped call (wo_a: 8 GEMMs in one einsum kernel) pays the fixed cost once
    assert k.ms(m, n, kk, groups=8) == pytest.approx(0.005 + 8 * one)
    assert k.ms(m, n, kk, launch=False) == pytest.approx(one)


def test_dense_cost_hand() -> None:
    """Prefill pays every GEMM and mHC with their fixed costs; decode drops the fixed costs
    and the side-stream GEMMs; the LM head runs one row per request."""
    fp8 = GemmKernel(0.007, 6e9, 5e12, 0.0, 1.0, 1.0)
    bf16 = GemmKernel(0.003, 7e9, 2.5e12, 0.0, 2.0, 2.0)
    gemms = dense_gemms(V41)
    cost = DenseCost(gemms, {"fp8": fp8, "bf16": bf16}, 43, 0.024, mhc_bytes_per_token(V41),
                     5e9)
    assert mhc_bytes_per_token(V41) == 2 * (3 * 4 + 2) * H * 2
    tokens, requests = 8192.0, 4.0
    want = sum(g.layers * {"fp8": fp8, "bf16": bf16}[g.dtype].ms(
        requests if g.name == "lm_head" else tokens, g.n, g.k, g.groups) for g in gemms)
    mhc = 43 * (0.024 + tokens * mhc_bytes_per_token(V41) / 5e9)
    assert cost.ms(tokens, requests) == pytest.approx(want + mhc)
    kernels = {"fp8": fp8, "bf16": bf16}
    decode = sum(g.layers * kernels[g.dtype].ms(
        requests if g.name == "lm_head" else 256.0, g.n, g.k, g.groups, launch=False)
        for g in gemms if not g.decode_overlapped)
    assert cost.ms(256.0, requests, decode=True) == pytest.approx(
        decode + 43 * 256.0 * mhc_bytes_per_token(V41) / 5e9)
    assert {g.name for g in gemms if g.decode_overlapped} == {
        "compressor.csa", "compressor.hca", "indexer.weights_proj", "indexer.compressor"}
    assert cost.ms(0.0, 0.0) == 0.0
