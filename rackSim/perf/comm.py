"""Collective communication: MoE dispatch/combine all-to-all and the DP-sync all-reduce."""

from __future__ import annotations

#: Bytes per hidden element: FP8 dispatch (1 byte + per-128 block scale) and BF16 combine.
DISPATCH_BYTES = 1.0 + 4.0 / 128
COMBINE_BYTES = 2.0


def alltoall_layer_ms(token_copies: float, hidden: int, ranks: int, op_ms: float,
                      nvlink_bytes_ms: float) -> float:
    """Dispatch + combine for one MoE layer on the busiest rank (ms).

    token_copies: token copies the rank receives (`moe.dispatched_tokens`: one per selected
        expert with DeepEP's low-latency kernels, one per token and rank with its normal ones).
    Only the (ranks - 1) / ranks share that lives on other ranks crosses NVLink; each of the
    two operations also pays a fixed `op_ms` (launch, barrier, signalling).
    """
    if ranks <= 1 or token_copies <= 0:
        return 0.0
    remote = (ranks - 1) / ranks
    nbytes = token_copies * hidden * (DISPATCH_BYTES + COMBINE_BYTES) * remote
    return 2.0 * op_ms + nbytes / nvlink_bytes_ms


def allreduce_hops(algorithm: str, ranks: int) -> int:
    """Sequential message hops of a small all-reduce over `ranks` workers.

    ring: reduce-scatter + all-gather, 2 (n - 1) hops.
    recursive_doubling: ceil(log2 n) exchange rounds.
    """
    if ranks <= 1:
        return 0
    if algorithm == "ring":
        return 2 * (ranks - 1)
    if algorithm == "recursive_doubling":
        return (ranks - 1).bit_length()
    raise ValueError(f"unknown all-reduce algorithm '{algorithm}'")


def allreduce_ms(algorithm: str, ranks: int, call_ms: float, hop_ms: float) -> float:
    """DP-sync CPU all-reduce latency (ms): a fixed call cost plus one latency per hop."""
    if ranks <= 1:
        return 0.0
    return call_ms + allreduce_hops(algorithm, ranks) * hop_ms
