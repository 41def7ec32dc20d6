"""A plain roofline step model: each part costs max(bytes / bandwidth, FLOPs / peak).

Mechanistic and uncalibrated: efficiencies are scenario inputs (`perf.hbm_efficiency`,
`perf.flops_efficiency`). The calibrated model (rackSim.perf.calibrated) refines it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rackSim.config.specs import RunConfig
from rackSim.perf.step import DecodeBatch, PrefillBatch, StepBreakdown

MS = 1e3


@dataclass(frozen=True, slots=True)
class Roofline:
    """Per-GPU speeds after efficiency (bytes/s, FLOP/s)."""

    hbm_bytes_s: float
    flops_s: float
    nvlink_bytes_s: float
    host_link_bytes_s: float

    def mem_ms(self, nbytes: float) -> float:
        return nbytes / self.hbm_bytes_s * MS

    def compute_ms(self, flops: float) -> float:
        return flops / self.flops_s * MS

    def op_ms(self, nbytes: float, flops: float) -> float:
        return max(self.mem_ms(nbytes), self.compute_ms(flops))


def roofline_for(cfg: RunConfig) -> Roofline:
    hw, p = cfg.hardware, cfg.perf
    return Roofline(
        hbm_bytes_s=hw.hbm_bw_bytes_s * p.hbm_efficiency,
        flops_s=hw.flops[p.weight_dtype] * p.flops_efficiency,
        nvlink_bytes_s=hw.nvlink_bw_bytes_s * p.hbm_efficiency,
        host_link_bytes_s=hw.host_link_bw_bytes_s,
    )


def moe_ms(cfg: RunConfig, roof: Roofline, tokens: float, ranks: int, top_k: int,
           experts: int, expert_params: float, layers: int) -> float:
    """Routed-expert time on one EP rank for `tokens` tokens (summed over all ranks).

    Weight traffic: every expert a rank hosts that receives at least one token is read once.
    Compute: 2 FLOPs per weight per token routed to the rank's experts.
    """
    if tokens <= 0 or experts == 0:
        return 0.0
    local = experts / ranks
    assignments = tokens * top_k
    p_hit = 1.0 - (1.0 - 1.0 / experts) ** assignments  # chance an expert sees any token
    read = local * p_hit * expert_params * cfg.model.weight_bytes_per_param * layers
    flops = 2.0 * expert_params * assignments / ranks * layers
    return roof.op_ms(read, flops)


def alltoall_ms(cfg: RunConfig, roof: Roofline, tokens_per_rank: float, ranks: int) -> float:
    """Dispatch + combine per MoE layer: each token's hidden state goes to top-k experts and
    back (FP8 dispatch, BF16 combine), over NVLink; only the share leaving the rank moves."""
    if ranks <= 1 or tokens_per_rank <= 0:
        return 0.0
    m = cfg.model
    remote = (ranks - 1) / ranks
    nbytes = tokens_per_rank * m.experts_per_token * m.hidden_size * (1 + 2) * remote
    return nbytes / roof.nvlink_bytes_s * MS * m.num_moe_layers


def allreduce_ms(algorithm: str, ranks: int, hop_ms: float) -> float:
    """Latency of a small DP-sync all-reduce over `ranks` CPU workers.

    ring: 2 (n - 1) sequential hops; recursive doubling: ceil(log2 n) hops.
    """
    if ranks <= 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (ranks - 1) * hop_ms
    return (ranks - 1).bit_length() * hop_ms


class RooflineStepModel:
    """Step time from bytes moved and FLOPs, with perfect balance and no stragglers."""

    #: CPU cost per scheduled step (ms) and per admitted prompt token (ms/token): ASSUMED
    #: order-of-magnitude values for the plain model; the calibrated model fits them.
    CPU_STEP_MS = 1.0
    CPU_MS_PER_PROMPT_TOKEN = 7e-6
    ALLREDUCE_HOP_MS = 0.05

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.roof = roofline_for(cfg)
        m = cfg.model
        self._dense_bytes = m.dense_params * m.weight_bytes_per_param
        self._dense_flops_per_token = 2.0 * (m.active_params - m.expert_params
                                             * m.experts_per_token * m.num_moe_layers)

    def prefill_step(self, batch: PrefillBatch) -> StepBreakdown:
        cfg, roof, m = self.cfg, self.roof, self.cfg.model
        n = batch.ranks
        per_rank = batch.new_tokens / n
        moe = moe_ms(cfg, roof, batch.new_tokens, n, m.experts_per_token, m.num_routed_experts,
                     m.expert_params, m.num_moe_layers)
        dense = roof.op_ms(self._dense_bytes, self._dense_flops_per_token * per_rank)
        # Sparse attention: each new token attends to at most window + top-k earlier tokens.
        avg_context = batch.attended_tokens / max(batch.num_requests, 1)
        per_query = min(avg_context, m.sliding_window + m.attention_topk_tokens)
        attention = roof.compute_ms(4.0 * per_query * m.hidden_size * m.num_layers * per_rank)
        # The indexer scores every earlier token for every new token.
        indexer = roof.compute_ms(2.0 * m.indexer_bytes_per_token * avg_context * per_rank)
        host = batch.host_loaded_bytes / n / roof.host_link_bytes_s * MS
        cpu = self.CPU_STEP_MS + self.CPU_MS_PER_PROMPT_TOKEN * batch.admitted_prompt_tokens + host
        comm = alltoall_ms(cfg, roof, per_rank, n)
        return StepBreakdown(moe=moe, attention=attention, indexer=indexer, dense=dense,
                             comm=comm, cpu=cpu)

    def decode_step(self, batch: DecodeBatch) -> StepBreakdown:
        cfg, roof, m = self.cfg, self.roof, self.cfg.model
        n = len(batch.requests_per_rank)
        q = 1 + batch.draft_tokens  # tokens verified per request
        reqs = max(batch.requests_per_rank)
        total_tokens = sum(batch.requests_per_rank) * q
        ctx = max(batch.context_tokens_per_rank)
        moe = moe_ms(cfg, roof, total_tokens, n, m.experts_per_token, m.num_routed_experts,
                     m.expert_params, m.num_moe_layers)
        dense = roof.op_ms(self._dense_bytes, self._dense_flops_per_token * reqs * q)
        # Attention reads, per request: the sliding window plus top-k selected tokens of KV.
        sel = min(m.sliding_window + m.attention_topk_tokens, ctx / max(reqs, 1))
        attention = roof.mem_ms(reqs * sel * m.kv_bytes_per_token)
        indexer = roof.mem_ms(ctx * m.indexer_bytes_per_token)
        draft = 0.0
        if m.draft is not None and batch.draft_tokens:
            d = m.draft
            per_draft = moe_ms(cfg, roof, sum(batch.requests_per_rank), n, d.experts_per_token,
                               d.num_routed_experts, 3.0 * m.hidden_size * d.moe_intermediate_size,
                               d.num_layers)
            draft = per_draft * batch.draft_tokens
        comm = alltoall_ms(cfg, roof, reqs * q, n)
        cpu = self.CPU_STEP_MS + self.CPU_MS_PER_PROMPT_TOKEN * batch.admitted_prompt_tokens
        sync = allreduce_ms(cfg.deployment.allreduce, n, self.ALLREDUCE_HOP_MS)
        return StepBreakdown(moe=moe, attention=attention, indexer=indexer, dense=dense,
                             comm=comm, draft=draft, cpu=cpu, sync=sync)

    decode_repeat = decode_step  # nothing carries over from one step to the next

    def mixed_step(self, prefill: PrefillBatch, decode: DecodeBatch) -> StepBreakdown:
        """A colocated step: experts, all-to-all and dense GEMMs over both token sets at once
        (weights read once); attention, indexer, draft and CPU of each part; the busiest rank's
        prefill and decode tokens set the per-rank work."""
        if prefill.new_tokens <= 0:
            return self.decode_step(decode)
        p = self.prefill_step(prefill)
        reqs = decode.requests_per_rank
        if sum(reqs) <= 0:
            return p
        d = self.decode_step(decode)
        cfg, roof, m = self.cfg, self.roof, self.cfg.model
        n = prefill.ranks
        q = 1 + decode.draft_tokens
        per_rank = max(prefill.new_tokens / n, prefill.busiest_rank_tokens) + max(reqs) * q
        moe = moe_ms(cfg, roof, prefill.new_tokens + sum(reqs) * q, n, m.experts_per_token,
                     m.num_routed_experts, m.expert_params, m.num_moe_layers)
        dense = roof.op_ms(self._dense_bytes, self._dense_flops_per_token * per_rank)
        return StepBreakdown(moe=moe, attention=p.attention + d.attention,
                             indexer=p.indexer + d.indexer, dense=dense,
                             comm=alltoall_ms(cfg, roof, per_rank, n), draft=d.draft, cpu=p.cpu,
                             sync=d.sync)
