"""Attention and indexer cost of DeepSeek-V4-style hybrid compressed attention.

Layers come in three kinds (counts from the model's `compress_ratios`):

* CSA layers (compressed sparse attention, ratio `csa_compress`): each query attends the
  sliding window plus the `topk_entries` compressed entries its indexer selects;
* HCA layers (heavily compressed attention, ratio `hca_compress`): the window plus every
  compressed entry (ctx / hca_compress - grows with context);
* window-only layers: the sliding window.

Entries one query attends, over all layers, at context c (window W)::

    E(c) = csa * (min(c, W) + min(c / csa_compress, topk_entries))
         + hca * (min(c, W) + c / hca_compress) + swa * min(c, W)

Decode, one DP rank holding `r` requests with `c` context tokens in all, `q` query tokens per
request (1 + drafts), per step (ms)::

    attention = layers * kernel + r * q * E(c / r) * entry_flops / flops
              + r * E(c / r) * entry_bytes / hbm
    indexer   = csa * kernel_idx + c * indexer_bytes_per_token / hbm_idx

`entry_flops` = 2 (QK and PV) x 2 x heads x head_dim; `entry_bytes` spreads the model's global
KV bytes per token over the entries one token creates. The indexer scans every request's index
keys once per step (the logits kernel serves all q queries in one pass).

Prefill, `n` new tokens from `r` requests of one rank at mean context c (the prefill kernels
are vLLM's `flash_mla_sparse_fwd` and the indexer's `fp8_fp4_paged_mqa_logits`, fitted to the
GB300 context-phase tables)::

    attention = layers * (kernel_p + ceil(r / chunk_requests) * chunk)
              + layers * n * query_bytes / hbm_p + n * E(c) * entry_flops / flops_p
    indexer   = csa * (kernel_idx_p + n * row) + pairs * pair_flops / flops_idx_p

vLLM gathers the KV of `chunk_requests` (4) requests per sparse-attention call, so many short
requests cost more than one long one; `query_bytes` is a query's BF16 q read plus its output
write (2 x heads x head_dim x 2); the indexer scores pairs = n * c / csa_compress query x key
pairs per CSA layer (2 x heads x head_dim FLOPs each) and then selects the top-k (see
prefill_opts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class AttentionCost:
    """Attention geometry and fitted speeds (ms, bytes/ms, FLOP/ms); `prefill_*` and
    `indexer_*_prefill` speeds price the prefill kernels, the others decode."""

    kernel_ms: float
    flops_ms: float
    bytes_ms: float
    indexer_kernel_ms: float
    indexer_bytes_ms: float
    prefill_kernel_ms: float
    prefill_chunk_ms: float
    prefill_chunk_requests: int
    prefill_query_bytes: float
    prefill_bytes_ms: float
    prefill_flops_ms: float
    indexer_kernel_ms_prefill: float
    indexer_row_ms_prefill: float
    indexer_flops_ms_prefill: float
    entry_flops: float
    kv_bytes_per_token: float
    indexer_bytes_per_token: float
    indexer_pair_flops: float
    window: int
    topk_entries: float
    layers: int
    csa_layers: int
    csa_compress: int
    hca_layers: int
    hca_compress: int

    #: window-only layers
    swa_layers: int = field(init=False)
    #: KV bytes per attended entry: global KV bytes per token over entries per token
    entry_bytes: float = field(init=False)

    def __post_init__(self) -> None:
        swa = self.layers - self.csa_layers - self.hca_layers
        per_token = self.csa_layers / self.csa_compress + self.hca_layers / self.hca_compress + swa
        object.__setattr__(self, "swa_layers", swa)
        object.__setattr__(self, "entry_bytes", self.kv_bytes_per_token / per_token)

    def entries(self, context: float) -> float:
        """Entries one query attends over all layers at `context` tokens."""
        w = context if context < self.window else self.window
        sel = context / self.csa_compress
        return (self.csa_layers * (w + (sel if sel < self.topk_entries else self.topk_entries))
                + self.hca_layers * (w + context / self.hca_compress) + self.swa_layers * w)

    def decode_attention_ms(self, requests: float, context_tokens: float, q: int) -> float:
        """Attention of one rank: `requests` requests holding `context_tokens` in all (ms)."""
        fixed = self.layers * self.kernel_ms
        if requests <= 0:
            return fixed
        e = self.entries(context_tokens / requests)
        return fixed + requests * e * (q * self.entry_flops / self.flops_ms
                                       + self.entry_bytes / self.bytes_ms)

    def decode_indexer_ms(self, requests: float, context_tokens: float) -> float:
        """Indexer of one rank: every request's index keys are scanned once per step (ms)."""
        fixed = self.csa_layers * self.indexer_kernel_ms
        if requests <= 0:
            return fixed
        return fixed + context_tokens * self.indexer_bytes_per_token / self.indexer_bytes_ms

    def prefill_attention_ms(self, new_tokens: float, mean_context: float,
                             requests: float = 1.0) -> float:
        """Attention for `new_tokens` queries from `requests` requests of one rank at
        `mean_context` (ms)."""
        if new_tokens <= 0:
            return 0.0
        chunks = math.ceil(max(requests, 1.0) / self.prefill_chunk_requests)
        return (self.layers * (self.prefill_kernel_ms + chunks * self.prefill_chunk_ms
                               + new_tokens * self.prefill_query_bytes / self.prefill_bytes_ms)
                + new_tokens * self.entries(mean_context) * self.entry_flops
                / self.prefill_flops_ms)

    def prefill_indexer_pairs(self, new_tokens: float, mean_context: float) -> float:
        """Query x compressed-key pairs the indexer scores on one rank, all CSA layers."""
        return self.csa_layers * new_tokens * mean_context / self.csa_compress

    def prefill_indexer_score_ms(self, new_tokens: float, mean_context: float) -> float:
        """Indexer scoring (logits) of one rank over all CSA layers (ms)."""
        if new_tokens <= 0:
            return 0.0
        pairs = self.prefill_indexer_pairs(new_tokens, mean_context)
        return (self.csa_layers * (self.indexer_kernel_ms_prefill
                                   + new_tokens * self.indexer_row_ms_prefill)
                + pairs * self.indexer_pair_flops / self.indexer_flops_ms_prefill)
