"""Routed-expert (MoE) layer time on one expert-parallel rank.

One MoE layer on a rank costs (ms)::

    kernel_us / 1e3                                  launch + routing fixed cost
  + tokens_in * hidden * token_bytes / hbm           activation traffic (permute, gather, scale)
  + experts_hit * expert_bytes / hbm                weight reads: each hosted expert that
                                                     receives a token is read once
  + assignments * 2 * expert_params / flops          grouped-GEMM compute

`hbm` and `flops` are the hardware peaks times fitted efficiencies. The weight and compute terms
add rather than overlap: against the GB300 kernel tables a generalised mean
(w^p + c^p)^(1/p) fits best at p = 1 (checked while building the calibration). Weight reads
dominate when
each expert sees few tokens (decode), compute when it sees many (prefill). Expert-load imbalance
enters through the hottest rank: it receives `mean / balancedness` token assignments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def experts_hit_random(local_experts: float, total_experts: int, assignments: float) -> float:
    """Expected number of a rank's `local_experts` that receive at least one of `assignments`
    token->expert assignments routed uniformly over `total_experts` experts."""
    if assignments <= 0:
        return 0.0
    miss = math.exp(assignments * math.log1p(-1.0 / total_experts))
    return local_experts * (1.0 - miss)


def experts_hit_balanced(local_experts: float, total_experts: int, assignments: float) -> float:
    """Experts hit when assignments are spread evenly (round robin) - the `balanced`
    distribution of the aiconfigurator kernel tables."""
    return min(local_experts, assignments * local_experts / total_experts)


@dataclass(frozen=True, slots=True)
class MoeKernel:
    """Fitted MoE kernel speeds for one GPU (see module docstring).

    kernel_ms: fixed cost per MoE layer call (ms).
    hbm_bytes_ms: achieved HBM bytes per ms.
    flops_ms: achieved FLOPs per ms.
    token_bytes: activation bytes moved per token entering the kernel per hidden element.
    """

    kernel_ms: float
    hbm_bytes_ms: float
    flops_ms: float
    token_bytes: float

    def layer_ms(self, tokens_in: float, assignments: float, experts_hit: float,
                 expert_bytes: float, expert_params: float, hidden: int) -> float:
        """One MoE layer on one rank (ms).

        tokens_in: tokens the rank's kernel routes/permutes.
        assignments: token->expert pairs computed on this rank.
        experts_hit: hosted experts with at least one assignment.
        expert_bytes / expert_params: one expert's weights (bytes / params).
        """
        if tokens_in <= 0 and assignments <= 0:
            return 0.0
        weights = experts_hit * expert_bytes / self.hbm_bytes_ms
        compute = 2.0 * expert_params * assignments / self.flops_ms
        tokens = tokens_in * hidden * self.token_bytes / self.hbm_bytes_ms
        return self.kernel_ms + tokens + weights + compute


@dataclass(frozen=True, slots=True)
class MoeShape:
    """Routed-expert geometry of one model (target or draft)."""

    experts: int
    top_k: int
    expert_params: float
    expert_bytes: float
    hidden: int
    layers: int


def dispatched_tokens(tokens_total: float, ranks: int, top_k: int, balancedness: float,
                      backend: str) -> float:
    """Token copies the hottest of `ranks` EP ranks receives from one all-to-all dispatch
    (and returns through the combine).

    'deepep_low_latency' writes one copy per selected expert: `tokens_total * top_k / ranks
    / balancedness`. 'deepep_high_throughput' (DeepEP's normal kernels) sends a token once
    to each rank that hosts any of its experts: with each of its `top_k` choices landing on
    the hottest rank with probability `1 / (ranks * balancedness)`, that rank receives
    `tokens_total * (1 - (1 - p)^top_k)` tokens, at most one per token.
    """
    b = min(max(balancedness, 1e-3), 1.0)
    if backend == "deepep_low_latency":
        return tokens_total * top_k / ranks / b
    if backend == "deepep_high_throughput":
        p = min(1.0, 1.0 / (ranks * b))
        return tokens_total * (1.0 - (1.0 - p) ** top_k)
    raise ValueError(f"unknown all-to-all backend '{backend}'")


def moe_rank_ms(kernel: MoeKernel, shape: MoeShape, tokens_total: float, ranks: int,
                balancedness: float = 1.0, tokens_in: float | None = None,
                redundant_experts: int = 0) -> float:
    """MoE time of the hottest EP rank for one step, summed over `shape.layers` (ms).

    tokens_total: tokens entering the MoE over the whole instance (all DP ranks).
    balancedness: mean rank load / max rank load, in (0, 1].
    tokens_in: tokens the rank's kernel routes: what the dispatch delivers
        (`dispatched_tokens`), or every token of the instance under an all-gather dispatch;
        None: one per token->expert pair it computes.
    """
    if tokens_total <= 0 or shape.experts == 0:
        return 0.0
    b = min(max(balancedness, 1e-3), 1.0)
    slots = shape.experts + redundant_experts
    local = slots / ranks
    assignments = tokens_total * shape.top_k
    hot = assignments / ranks / b
    hit = min(local, experts_hit_random(local, slots, assignments / b))
    return shape.layers * kernel.layer_ms(hot if tokens_in is None else tokens_in, hot, hit,
                                          shape.expert_bytes, shape.expert_params,
                                          shape.hidden)
