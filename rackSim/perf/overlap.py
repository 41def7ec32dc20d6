"""Dual-batch overlap (vLLM `--enable-dbo`): a step of a DEP instance runs as two
microbatches, and the MoE all-to-all of one hides behind the other's compute.

vLLM's schedule (docs/design/dbo.md of vLLM; DeepSeek's profile-data describes the same idea)
runs each MoE layer in four phases; in each, one microbatch computes while the other's
dispatch (D) or combine (C) is in flight, and a phase lasts as long as the longer of the two:

    compute: | A0 | M1 | M0 | A1 |
    comm:    | D1 | D0 | C1 | C0 |

A is a microbatch's compute outside the routed experts (attention, indexer, dense GEMMs,
shared experts; vLLM splits the shared experts off A, which this keeps in it), M its routed
experts. Every part is priced at the microbatch's own size, so what does not shrink with the
batch (expert weights read in a decode step, per-kernel fixed costs) is paid twice: at small
batches the overlap costs more than it hides. Dense-only layers have no all-to-all to hide:
both microbatches' A run back to back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from rackSim.perf.comm import COMBINE_BYTES, DISPATCH_BYTES
from rackSim.perf.step import PrefillBatch


def microbatched(rank_tokens: Iterable[float], threshold: int) -> bool:
    """Whether a step is split: every DP rank must schedule at least `threshold` tokens
    (and two, one per microbatch), since the ranks agree on it and any rank below vetoes it
    (vLLM `check_ubatch_thresholds` and its DP all-reduce)."""
    least = max(threshold, 2)
    return all(t >= least for t in rank_tokens)


def least_rank_tokens(batch: PrefillBatch) -> float:
    """New tokens of a prefill step's least loaded DP rank: the even share, or what the
    other ranks share when one rank computes more than it."""
    n = batch.ranks
    even = batch.new_tokens / n
    if n < 2 or batch.busiest_rank_tokens <= even:
        return even
    return (batch.new_tokens - batch.busiest_rank_tokens) / (n - 1)


def prefill_microbatch(batch: PrefillBatch) -> PrefillBatch:
    """One of the two microbatches of a prefill step: half its new tokens over half its
    requests (at least one: a split request is in both), attending to the step's mean
    context; its admissions and host loads are the step's (CPU work, not split)."""
    reqs = max(batch.num_requests, 1)
    half_reqs = max(reqs / 2.0, 1.0)
    new = batch.new_tokens / 2.0
    mean_context = max(batch.attended_tokens - batch.new_tokens, 0) / reqs \
        + batch.new_tokens / reqs / 2.0
    cached = mean_context - new / half_reqs / 2.0
    return replace(batch, new_tokens=new, attended_tokens=cached * half_reqs + new,
                   num_requests=half_reqs, busiest_rank_tokens=batch.busiest_rank_tokens / 2.0)


def split_alltoall_ms(comm_ms: float, calls: int, op_ms: float) -> tuple[float, float]:
    """(dispatch, combine) of an all-to-all total `comm_ms` (`comm.alltoall_layer_ms` summed
    over `calls` layers): each pays its fixed `op_ms` per call, and the bytes split as FP8
    dispatch and BF16 combine elements do (ms)."""
    fixed = calls * op_ms
    moved = max(comm_ms - 2.0 * fixed, 0.0)
    dispatch = fixed + moved * DISPATCH_BYTES / (DISPATCH_BYTES + COMBINE_BYTES)
    return dispatch, comm_ms - dispatch


def dual_batch_ms(outside_ms: float, moe_ms: float, dispatch_ms: float, combine_ms: float,
                  layers: int, moe_layers: int) -> float:
    """Forward time of both microbatches (ms) from one microbatch's parts summed over the
    model: `outside_ms` over its `layers`, the routed experts and the all-to-all over its
    `moe_layers` (each layer taken as the mean of its kind)."""
    a = outside_ms / layers
    if moe_layers <= 0:
        return 2.0 * outside_ms + 2.0 * moe_ms
    m, d, c = moe_ms / moe_layers, dispatch_ms / moe_layers, combine_ms / moe_layers
    moe_layer = max(a, d) + max(m, d) + max(m, c) + max(a, c)
    return moe_layers * moe_layer + (layers - moe_layers) * 2.0 * a
