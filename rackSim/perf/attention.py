"""Attention and indexer cost of DeepSeek-V4-style hybrid compressed attention, and of standard
(GQA, MLA) attention as its special case: no CSA / HCA layers, every layer a "window" layer
whose window is the whole context, no indexer.

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

from rackSim.config.specs import HardwareSpec, ModelSpec
from rackSim.perf.dense import BF16_BYTES
from rackSim.perf.profile import Profile

MS = 1e3


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
    #: FLOPs per attended entry in prefill (0: `entry_flops`); MLA prefill attends per-head
    #: keys and values, decode the absorbed latent
    prefill_entry_flops: float = 0.0
    #: decode: per-request cost per layer (ms) beyond its KV bytes and FLOPs (the kernel's
    #: per-sequence work: block-table walk, query load, output write); 0 for compressed
    #: attention, whose profile folds it into the kernel cost
    request_ms: float = 0.0

    #: window-only layers
    swa_layers: int = field(init=False)
    #: KV bytes per attended entry: global KV bytes per token over entries per token
    entry_bytes: float = field(init=False)

    def __post_init__(self) -> None:
        swa = self.layers - self.csa_layers - self.hca_layers
        per_token = self.csa_layers / self.csa_compress + self.hca_layers / self.hca_compress + swa
        object.__setattr__(self, "swa_layers", swa)
        object.__setattr__(self, "entry_bytes", self.kv_bytes_per_token / per_token)
        if not self.prefill_entry_flops:
            object.__setattr__(self, "prefill_entry_flops", self.entry_flops)

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
        return fixed + requests * (e * (q * self.entry_flops / self.flops_ms
                                        + self.entry_bytes / self.bytes_ms)
                                   + self.layers * self.request_ms)

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
                + new_tokens * self.entries(mean_context) * self.prefill_entry_flops
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


def attention_cost(m: ModelSpec, hw: HardwareSpec, p: Profile, weight_dtype: str
                   ) -> AttentionCost:
    """Attention priced with the profile's speeds. Compressed (V4) attention takes its shapes
    from the profile; a model with an `attention` section (GQA, MLA) is the special case with
    no CSA / HCA layers, the whole context as its window and no indexer. Decode FLOPs per
    attended entry: QK and PV over every query head (MLA: against the absorbed latent,
    kv_lora_rank + rope wide); prefill: per-head keys and values (MLA runs un-absorbed)."""
    hbm_ms = hw.hbm_bw_bytes_s / MS
    attn_dtype = "bf16" if "bf16" in hw.flops else weight_dtype
    a = m.attention
    if a is not None:
        decode_flops = (2.0 * a.heads * (2 * a.kv_lora_rank + a.rope_head_dim)
                        if a.kind == "mla" else 2.0 * a.heads * (a.head_dim + a.v_head_dim))
        return AttentionCost(
            kernel_ms=p.value("attn_kernel_us") / MS, request_ms=p.value("attn_request_us") / MS,
            flops_ms=hw.flops[attn_dtype] / MS * p.value("attn_flops_efficiency"),
            bytes_ms=hbm_ms * p.value("attn_hbm_efficiency"),
            indexer_kernel_ms=0.0, indexer_bytes_ms=1.0,
            prefill_kernel_ms=p.value("prefill_attn_kernel_us") / MS,
            prefill_chunk_ms=p.value("prefill_attn_chunk_us") / MS,
            prefill_chunk_requests=int(p.value("prefill_chunk_requests")),
            prefill_query_bytes=a.heads * (a.head_dim + a.v_head_dim) * BF16_BYTES,
            prefill_bytes_ms=hbm_ms * p.value("prefill_attn_hbm_efficiency"),
            prefill_flops_ms=hw.flops[attn_dtype] / MS * p.value("prefill_attn_flops_efficiency"),
            indexer_kernel_ms_prefill=0.0, indexer_row_ms_prefill=0.0,
            indexer_flops_ms_prefill=1.0, entry_flops=decode_flops,
            kv_bytes_per_token=m.kv_bytes_per_token, indexer_bytes_per_token=0.0,
            indexer_pair_flops=0.0, window=m.sliding_window, topk_entries=0.0,
            layers=m.num_layers, csa_layers=0, csa_compress=1, hca_layers=0, hca_compress=1,
            prefill_entry_flops=2.0 * a.heads * (a.head_dim + a.v_head_dim))
    idx_dtype = "fp8" if "fp8" in hw.flops else weight_dtype
    csa_compress = int(p.value("csa_compress"))
    heads, head_dim = p.value("attention_heads"), p.value("attention_head_dim")
    return AttentionCost(
        kernel_ms=p.value("indexer_kernel_us") / MS,
        flops_ms=hw.flops[attn_dtype] / MS * p.value("attn_flops_efficiency"),
        bytes_ms=hbm_ms * p.value("moe_hbm_efficiency"),
        indexer_kernel_ms=p.value("indexer_kernel_us") / MS,
        indexer_bytes_ms=hbm_ms * p.value("indexer_hbm_efficiency"),
        prefill_kernel_ms=p.value("prefill_attn_kernel_us") / MS,
        prefill_chunk_ms=p.value("prefill_attn_chunk_us") / MS,
        prefill_chunk_requests=int(p.value("prefill_chunk_requests")),
        prefill_query_bytes=2.0 * heads * head_dim * BF16_BYTES,
        prefill_bytes_ms=hbm_ms * p.value("prefill_attn_hbm_efficiency"),
        prefill_flops_ms=hw.flops[attn_dtype] / MS * p.value("prefill_attn_flops_efficiency"),
        indexer_kernel_ms_prefill=p.value("prefill_indexer_kernel_us") / MS,
        indexer_row_ms_prefill=p.value("prefill_indexer_row_ns") * 1e-6,
        indexer_flops_ms_prefill=(hw.flops[idx_dtype] / MS
                                  * p.value("prefill_indexer_flops_efficiency")),
        entry_flops=4.0 * heads * head_dim,
        kv_bytes_per_token=m.kv_bytes_per_token,
        indexer_bytes_per_token=m.indexer_bytes_per_token,
        indexer_pair_flops=2.0 * p.value("indexer_heads") * p.value("indexer_head_dim"),
        window=m.sliding_window, topk_entries=m.attention_topk_tokens / csa_compress,
        layers=m.num_layers, csa_layers=int(p.value("csa_layers")),
        csa_compress=csa_compress, hca_layers=int(p.value("hca_layers")),
        hca_compress=int(p.value("hca_compress")))
