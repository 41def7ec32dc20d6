"""MoE layer cost: hand calculations and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rackSim.perf.moe import (
    MoeKernel,
    MoeShape,
    dispatched_tokens,
    experts_hit_balanced,
    experts_hit_random,
    moe_rank_ms,
)

KERNEL = MoeKernel(kernel_ms=0.02, hbm_bytes_ms=6.4e9, flops_ms=3e12, token_bytes=2.0)
SHAPE = MoeShape(experts=384, top_k=6, expert_params=3 * 4096 * 2688,
                 expert_bytes=3 * 4096 * 2688 * 0.53125, hidden=4096, layers=42)


def test_experts_hit_random_hand() -> None:
    # 1 assignment over 4 experts: each expert is hit with p = 1/4; 2 local experts -> 0.5.
    assert experts_hit_random(2, 4, 1) == pytest.approx(0.5)
    # 2 assignments: p(hit) = 1 - (3/4)^2 = 7/16 per expert.
    assert experts_hit_random(2, 4, 2) == pytest.approx(2 * 7 / 16)
    assert experts_hit_random(10, 384, 0) == 0.0


def test_experts_hit_balanced_hand() -> None:
    assert experts_hit_balanced(8, 256, 64) == pytest.approx(2.0)  # 64 of 256 experts, 1/32 local
    assert experts_hit_balanced(8, 256, 10_000) == 8


def test_layer_ms_hand() -> None:
    # kernel 0.02 + tokens 10*4096*2/6.4e9 + weights 3*1e6/6.4e9 + compute 2*1e6*60/3e12
    got = KERNEL.layer_ms(10, 60, 3, 1e6, 1e6, 4096)
    want = 0.02 + 10 * 4096 * 2 / 6.4e9 + 3e6 / 6.4e9 + 2 * 1e6 * 60 / 3e12
    assert got == pytest.approx(want, rel=1e-12)


def test_moe_rank_ms_weight_bound_hand() -> None:
    # 1024 tokens on DEP4: every hosted expert is hit (6144 assignments over 384 experts).
    tokens, ranks = 1024, 4
    local = 96
    hit = local * (1 - math.exp(6144 * math.log1p(-1 / 384)))
    assert hit == pytest.approx(96, rel=1e-6)
    per_layer = (0.02 + 1536 * 4096 * 2 / 6.4e9 + hit * SHAPE.expert_bytes / 6.4e9
                 + 2 * SHAPE.expert_params * 1536 / 3e12)
    assert moe_rank_ms(KERNEL, SHAPE, tokens, ranks) == pytest.approx(42 * per_layer, rel=1e-9)


def test_imbalance_slows_moe() -> None:
    fast = moe_rank_ms(KERNEL, SHAPE, 8192, 32, balancedness=1.0)
    slow = moe_rank_ms(KERNEL, SHAPE, 8192, 32, balancedness=0.35)
    assert slow > fast * 1.2


def test_allgather_dispatch_routes_every_token() -> None:
    a2a = moe_rank_ms(KERNEL, SHAPE, 8192, 32)
    ag = moe_rank_ms(KERNEL, SHAPE, 8192, 32, tokens_in=8192)
    # allgather routes 8192 tokens per rank instead of 8192*6/32 = 1536 copies.
    extra = 42 * (8192 - 1536) * 4096 * 2 / 6.4e9
    assert ag - a2a == pytest.approx(extra, rel=1e-9)


def test_low_latency_dispatch_sends_a_copy_per_selected_expert() -> None:
    # 8192 tokens x 6 experts over 32 ranks, the hottest at balancedness 0.5: 3072 copies.
    assert dispatched_tokens(8192, 32, 6, 0.5, "deepep_low_latency") == pytest.approx(3072)


def test_high_throughput_dispatch_sends_a_token_once_per_rank() -> None:
    # DEP2, k = 6, balanced: a token misses a rank only if all 6 experts are on the other one.
    assert dispatched_tokens(1000, 2, 6, 1.0, "deepep_high_throughput") == pytest.approx(
        1000 * (1 - 0.5 ** 6))
    # One rank receives every token exactly once; a rank that hosts everything too.
    assert dispatched_tokens(1000, 1, 6, 1.0, "deepep_high_throughput") == pytest.approx(1000)
    assert dispatched_tokens(1000, 4, 6, 0.2, "deepep_high_throughput") == pytest.approx(1000)


@given(tokens=st.floats(1, 1e6), ranks=st.integers(1, 256), top_k=st.integers(1, 16),
       b=st.floats(1e-3, 1.0))
def test_high_throughput_never_sends_more_than_low_latency(tokens: float, ranks: int,
                                                            top_k: int, b: float) -> None:
    ht = dispatched_tokens(tokens, ranks, top_k, b, "deepep_high_throughput")
    ll = dispatched_tokens(tokens, ranks, top_k, b, "deepep_low_latency")
    assert ht <= ll * (1 + 1e-12)
    assert ht <= tokens * (1 + 1e-12)


def test_unknown_all2all_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="pplx"):
        dispatched_tokens(1000, 4, 6, 1.0, "pplx")
