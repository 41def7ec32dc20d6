"""Attention and indexer cost: hand calculations."""

from __future__ import annotations

import pytest

from rackSim.perf.attention import AttentionCost
from rackSim.perf.prefill_opts import (
    LOGIT_BYTES,
    PrefillOptimisations,
    gather_factor,
    replayed_tokens,
    topk_select_ms,
)

ATTN = AttentionCost(kernel_ms=0.005, flops_ms=1e12, bytes_ms=6e9, indexer_kernel_ms=0.007,
                     indexer_bytes_ms=8e9, prefill_kernel_ms=0.013, prefill_chunk_ms=0.0046,
                     prefill_chunk_requests=4, prefill_query_bytes=131072.0,
                     prefill_bytes_ms=4e9, prefill_flops_ms=1.2e12,
                     indexer_kernel_ms_prefill=0.006, indexer_row_ms_prefill=4e-6,
                     indexer_flops_ms_prefill=2e12, entry_flops=131072.0,
                     kv_bytes_per_token=890.0, indexer_bytes_per_token=700.0,
                     indexer_pair_flops=16384.0, window=128, topk_entries=512, layers=43,
                     csa_layers=21, csa_compress=4, hca_layers=20, hca_compress=128)


def test_entries_hand() -> None:
    # 128K context: CSA 21 x (128 + 512), HCA 20 x (128 + 1024), 2 window layers x 128.
    assert ATTN.entries(131072) == pytest.approx(21 * 640 + 20 * 1152 + 2 * 128)
    # 100 tokens: everything fits in the window; CSA selects 25, HCA has 0.78 entries.
    assert ATTN.entries(100) == pytest.approx(43 * 100 + 21 * 25 + 20 * 100 / 128)
    assert ATTN.entry_bytes == pytest.approx(890 / (21 / 4 + 20 / 128 + 2))


def test_decode_attention_hand() -> None:
    e = ATTN.entries(131072)
    want = 43 * 0.005 + 64 * e * (4 * 131072 / 1e12 + ATTN.entry_bytes / 6e9)
    assert ATTN.decode_attention_ms(64, 64 * 131072, 4) == pytest.approx(want)


def test_indexer_grows_with_context() -> None:
    short = ATTN.decode_indexer_ms(64, 64 * 8192)
    long = ATTN.decode_indexer_ms(64, 64 * 131072)
    assert long - short == pytest.approx(64 * (131072 - 8192) * 700 / 8e9)


def test_prefill_indexer_hand() -> None:
    pairs = ATTN.prefill_indexer_pairs(32768, 147456)
    assert pairs == pytest.approx(21 * 32768 * 147456 / 4)
    assert ATTN.prefill_indexer_score_ms(32768, 147456) == pytest.approx(
        21 * (0.006 + 32768 * 4e-6) + pairs * 16384 / 2e12)


def test_prefill_attention_hand() -> None:
    """43 layers x (kernel + KV-gather chunks + query bytes) + entries x FLOPs; 9 requests
    take three 4-request chunks, one request one."""
    e = ATTN.entries(20000)
    flops = 16384 * e * 131072 / 1.2e12
    per_layer = 0.013 + 3 * 0.0046 + 16384 * 131072 / 4e9
    assert ATTN.prefill_attention_ms(16384, 20000, 9) == pytest.approx(43 * per_layer + flops)
    one = 43 * (0.013 + 0.0046 + 16384 * 131072 / 4e9) + flops
    assert ATTN.prefill_attention_ms(16384, 20000, 1) == pytest.approx(one)
    assert ATTN.prefill_attention_ms(0, 20000, 1) == 0.0


def test_prefill_toggles_hand() -> None:
    on, off = PrefillOptimisations(), PrefillOptimisations(False, False, False)
    assert replayed_tokens(on, 131072, 14000) == 128
    assert replayed_tokens(off, 131072, 14000) == 14000
    assert replayed_tokens(off, 500, 14000) == 500
    assert gather_factor(off, 0.07) == pytest.approx(1.07) and gather_factor(on, 0.07) == 1.0
    assert topk_select_ms(on, 1e9, 0.01, 6e9) == pytest.approx(1e9 * LOGIT_BYTES / 6e9)
    assert topk_select_ms(off, 1e9, 0.01, 6e9) == pytest.approx(1e9 * 0.01e-6)
