"""Dense (non-routed) work of one GPU: every GEMM of the layer stack priced from its shape, and
the hyper-connection (mHC) mixing.

The GEMM list (`dense_gemms`) follows the DeepSeek-V4 layer (vLLM `deepseek_v4.py`): per layer
the fused q/kv down-projection (wq_a + wkv), the q up-projection wq_b, the grouped output
projection wo_a (o_groups GEMMs of heads x head_dim / o_groups -> o_lora_rank) and wo_b, the
shared expert (gate+up, down) and the router gate; per compressed layer the compressor's
fused kv + gate projection (2 x head_dim outputs each on CSA layers, whose windows overlap;
1 x on HCA layers); per CSA layer the indexer's wq_b, weights_proj and its own compressor; once
per step the LM head over the last token of each request. FP8 block-quantised GEMMs are the
linear layers vLLM quantises (the checkpoint's `quantization_config`); compressors, indexer
weights_proj, router and LM head run in BF16.

One GEMM call of M rows (tokens), N outputs, K inputs on one GPU (ms); a grouped call
(wo_a: o_groups GEMMs in one einsum kernel) pays `kernel` once and the rest per group::

    kernel + (N K w + M K a + 2 M N) / hbm + M K quant / hbm + 2 M N K / flops

w / a: weight and activation bytes per element (FP8 1, BF16 2); 2 M N: the BF16 output;
quant: bytes-equivalent per input element of the dynamic FP8 activation quantisation (0 for
BF16). The terms add (no overlap): it fits the GB300 GEMM tables better than a max.

Per layer, mHC reads and writes the hc_mult-wide residual stream at the two hyper-connection
sites (attention and FFN)::

    mhc = mhc_kernel + tokens * 2 sites * (3 hc_mult + 2) * hidden * 2 bytes / mhc_hbm

(per site: pre reads the residual (hc_mult x hidden BF16) and writes the layer input; post
reads the layer output and the residual and writes the residual).
"""

from __future__ import annotations

from dataclasses import dataclass

from rackSim.config.specs import ModelSpec

#: Bytes per weight of an FP8 block-quantised GEMM: 1 byte + a 4-byte scale per 128 x 128 block.
FP8_BLOCK_WEIGHT_BYTES = 1.0 + 4.0 / (128 * 128)
BF16_BYTES = 2.0
#: bytes per weight / per activation element, by GEMM dtype
WEIGHT_BYTES = {"fp8": FP8_BLOCK_WEIGHT_BYTES, "bf16": BF16_BYTES}
ACTIVATION_BYTES = {"fp8": 1.0, "bf16": BF16_BYTES}
#: mHC parameters per layer and site: (2 + hc_mult) * hc_mult mixing rows over hc_mult * hidden
#: inputs, plus as many biases and 3 scales (vLLM `hc_attn_fn`, `hc_attn_base`, `hc_attn_scale`)
MHC_SITES = 2


@dataclass(frozen=True, slots=True)
class DenseGeometry:
    """Layer shapes of the non-routed part of the model (config.json fields in brackets)."""

    hidden: int                 # hidden_size
    layers: int                 # num_hidden_layers
    csa_layers: int             # layers with the small compress ratio (indexer + overlap)
    hca_layers: int             # layers with the large compress ratio
    heads: int                  # num_attention_heads
    head_dim: int               # head_dim
    q_lora_rank: int            # q_lora_rank
    o_lora_rank: int            # o_lora_rank
    o_groups: int               # o_groups
    indexer_heads: int          # index_n_heads
    indexer_head_dim: int       # index_head_dim
    shared_intermediate: int    # moe_intermediate_size x n_shared_experts
    routed_experts: int         # n_routed_experts (router outputs)
    vocab: int                  # vocab_size
    hc_mult: int                # hc_mult


@dataclass(frozen=True, slots=True)
class Gemm:
    """One GEMM of the layer stack: `groups` GEMMs of K -> N in each of `layers` layers.

    rows: 'tokens' (M = tokens of the step) or 'requests' (M = one row per request: LM head).
    decode_overlapped: in decode it runs on a side stream beside the fused q/kv projection
        (vLLM's multi-stream input GEMMs, used below a token threshold), so it adds no time to
        a decode step.
    """

    name: str
    n: int
    k: int
    layers: int
    dtype: str
    groups: int = 1
    rows: str = "tokens"
    decode_overlapped: bool = False

    @property
    def params(self) -> float:
        return float(self.groups * self.n * self.k * self.layers)

    @property
    def weight_bytes(self) -> float:
        return self.params * WEIGHT_BYTES[self.dtype]


def dense_gemms(g: DenseGeometry) -> tuple[Gemm, ...]:
    """The dense GEMMs of one forward pass (see the module docstring)."""
    L, csa, hca, h = g.layers, g.csa_layers, g.hca_layers, g.hidden
    return (
        Gemm("attn.wq_a+wkv", g.q_lora_rank + g.head_dim, h, L, "fp8"),
        Gemm("attn.wq_b", g.heads * g.head_dim, g.q_lora_rank, L, "fp8"),
        Gemm("attn.wo_a", g.o_lora_rank, g.heads * g.head_dim // g.o_groups, L, "fp8",
             groups=g.o_groups),
        Gemm("attn.wo_b", h, g.o_groups * g.o_lora_rank, L, "fp8"),
        Gemm("compressor.csa", 2 * 2 * g.head_dim, h, csa, "bf16", decode_overlapped=True),
        Gemm("compressor.hca", 2 * g.head_dim, h, hca, "bf16", decode_overlapped=True),
        Gemm("indexer.wq_b", g.indexer_heads * g.indexer_head_dim, g.q_lora_rank, csa, "fp8"),
        Gemm("indexer.weights_proj", g.indexer_heads, h, csa, "bf16", decode_overlapped=True),
        Gemm("indexer.compressor", 2 * 2 * g.indexer_head_dim, h, csa, "bf16",
             decode_overlapped=True),
        Gemm("shared.gate_up", 2 * g.shared_intermediate, h, L, "fp8"),
        Gemm("shared.down", h, g.shared_intermediate, L, "fp8"),
        Gemm("router", g.routed_experts, h, L, "bf16"),
        Gemm("lm_head", g.vocab, h, 1, "bf16", rows="requests"),
    )


def model_gemms(m: ModelSpec) -> tuple[Gemm, ...]:
    """The dense GEMMs of a model with standard attention (`m.attention`: GQA or MLA), in the
    dtype it is served in (`m.gemm_dtype`); router and LM head in BF16.

    GQA: fused qkv ((heads + 2 kv_heads) x head_dim outputs) and o. MLA (DeepSeek-V3): q_a and
    q_b (or one q projection without a q LoRA), kv_a (latent + rope), kv_b (latent -> per-head
    nope keys and values; in decode vLLM absorbs it into batched matmuls that read the same
    weights) and o. Then the dense FFN of `dense_ffn_layers` layers, the shared experts of the
    MoE layers, the router and the LM head.
    """
    a, h, L, dt = m.attention, m.hidden_size, m.num_layers, m.gemm_dtype
    if a is None:
        raise ValueError(f"model '{m.name}' has no 'attention' section (compressed attention "
                         "takes its GEMMs from dense_gemms)")
    if a.kind == "gqa":
        attn = (Gemm("attn.qkv", (a.heads + 2 * a.kv_heads) * a.head_dim, h, L, dt),
                Gemm("attn.o", h, a.heads * a.head_dim, L, dt))
    else:
        nope = a.head_dim - a.rope_head_dim
        q = ((Gemm("attn.q_a", a.q_lora_rank, h, L, dt),
              Gemm("attn.q_b", a.heads * a.head_dim, a.q_lora_rank, L, dt))
             if a.q_lora_rank else (Gemm("attn.q", a.heads * a.head_dim, h, L, dt),))
        attn = (*q, Gemm("attn.kv_a", a.kv_lora_rank + a.rope_head_dim, h, L, dt),
                Gemm("attn.kv_b", a.heads * (nope + a.v_head_dim), a.kv_lora_rank, L, dt),
                Gemm("attn.o", h, a.heads * a.v_head_dim, L, dt))
    ffn: tuple[Gemm, ...] = ()
    if m.dense_ffn_layers:
        i, n = m.dense_intermediate_size, m.dense_ffn_layers
        ffn = (Gemm("mlp.gate_up", 2 * i, h, n, dt), Gemm("mlp.down", h, i, n, dt))
    moe: tuple[Gemm, ...] = ()
    if m.num_moe_layers:
        n, s = m.num_moe_layers, m.moe_intermediate_size * m.num_shared_experts
        shared = (Gemm("shared.gate_up", 2 * s, h, n, dt), Gemm("shared.down", h, s, n, dt)) \
            if s else ()
        moe = (*shared, Gemm("router", m.num_routed_experts, h, n, "bf16"))
    return (*attn, *ffn, *moe, Gemm("lm_head", m.vocab_size, h, 1, "bf16", rows="requests"))


def mhc_params(g: DenseGeometry) -> float:
    """Hyper-connection weights of all layers plus the output head's (params)."""
    rows = (2 + g.hc_mult) * g.hc_mult
    per_site = rows * g.hc_mult * g.hidden + rows + 3
    return g.layers * MHC_SITES * per_site + g.hc_mult * g.hc_mult * g.hidden + g.hc_mult + 1


def dense_params(g: DenseGeometry) -> float:
    """All non-routed parameters: the GEMMs, mHC, and the embedding table (params)."""
    return sum(x.params for x in dense_gemms(g)) + mhc_params(g) + float(g.vocab * g.hidden)


def mhc_bytes_per_token(g: DenseGeometry) -> float:
    """HBM bytes one token moves through the mHC of one layer (both sites, BF16): per site
    pre reads the residual (hc_mult x hidden) and writes the layer input (hidden); post reads
    the layer output and the residual and writes the residual."""
    return MHC_SITES * (3 * g.hc_mult + 2) * g.hidden * BF16_BYTES


@dataclass(frozen=True, slots=True)
class GemmKernel:
    """Fitted GEMM speeds of one dtype on one GPU (ms, bytes/ms, FLOP/ms; quant in bytes per
    input element)."""

    kernel_ms: float
    hbm_bytes_ms: float
    flops_ms: float
    quant_bytes: float
    weight_bytes: float
    activation_bytes: float

    def ms(self, m: float, n: float, k: float, groups: int = 1, launch: bool = True) -> float:
        """One GEMM call of `groups` GEMMs of `m` > 0 rows, `n` outputs, `k` inputs (ms);
        `launch` False leaves out the fixed per-call cost. Works on numpy arrays."""
        nbytes = (n * k * self.weight_bytes + m * k * (self.activation_bytes + self.quant_bytes)
                  + 2.0 * m * n)
        work = nbytes / self.hbm_bytes_ms + 2.0 * m * n * k / self.flops_ms
        return (self.kernel_ms if launch else 0.0) + groups * work


@dataclass(frozen=True, slots=True)
class DenseCost:
    """Dense time of one GPU for a step of `tokens` tokens from `requests` requests."""

    gemms: tuple[Gemm, ...]
    kernels: dict[str, GemmKernel]
    layers: int
    mhc_kernel_ms: float
    mhc_bytes_per_token: float
    mhc_bytes_ms: float

    def gemm_ms(self, tokens: float, requests: float, shards: int = 1,
                decode: bool = False) -> float:
        """All dense GEMMs (ms). `shards`: tensor-parallel width (each GEMM's outputs split
        `shards` ways); `decode`: leave out the GEMMs a decode step overlaps and the per-call
        fixed costs (see `ms`)."""
        total = 0.0
        for g in self.gemms:
            if decode and g.decode_overlapped:
                continue
            m = requests if g.rows == "requests" else tokens
            if m <= 0:
                continue
            total += g.layers * self.kernels[g.dtype].ms(m, g.n / shards, g.k, g.groups,
                                                         launch=not decode)
        return total

    def mhc_ms(self, tokens: float, decode: bool = False) -> float:
        """Hyper-connection mixing of all layers (ms); `decode` leaves out its fixed per-layer
        cost."""
        if tokens <= 0:
            return 0.0
        fixed = 0.0 if decode else self.mhc_kernel_ms
        return self.layers * (fixed + tokens * self.mhc_bytes_per_token / self.mhc_bytes_ms)

    def ms(self, tokens: float, requests: float, shards: int = 1, decode: bool = False
           ) -> float:
        """Dense time of one GPU for one step (ms). A decode step (CUDA graphs, fused
        kernels) carries no per-call fixed costs here: the calibrated model charges a decode
        step's fixed per-layer costs as fitted to the decode figures (D1-D5, L1)."""
        return (self.gemm_ms(tokens, requests, shards, decode)
                + self.mhc_ms(tokens, decode))
