"""Prefill optimisation toggles and the part of the prefill cost each one changes.

* bounded replay - a chunk that follows a cached prefix re-runs ("replays") some of the cached
  tokens through the first `replay_layers` layers to rebuild compressed-attention state. The
  unbounded implementation replays `baseline_replay_tokens` (fitted, P3); bounded replay caps
  it at `replay_tokens` (128, P7). Touches: every per-token cost of those layers.
* large pages - shared host tables mapped with 2 MB GPU pages instead of 4 KB pages: fewer TLB
  misses on the gathers through them. Without it the KV/index gathers of attention and the
  indexer cost `1 + tlb_overhead` times more (fitted, P4).
* DeepSelect - the prefill indexer's top-k selection becomes one memory-bound pass over the
  logits (4 bytes per candidate) instead of a selection costing `topk_ns_per_candidate` per
  candidate (fitted, P5). Touches: the indexer.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes per indexer logit read by a single-pass top-k (FP32 logits).
LOGIT_BYTES = 4.0


@dataclass(frozen=True, slots=True)
class PrefillOptimisations:
    bounded_replay: bool = True
    large_pages: bool = True
    deepselect: bool = True
    replay_layers: int = 20
    replay_tokens: int = 128


def replayed_tokens(opts: PrefillOptimisations, cached_tokens: float,
                    baseline_replay_tokens: float) -> float:
    """Cached tokens one request replays through the first `opts.replay_layers` layers."""
    bound = opts.replay_tokens if opts.bounded_replay else baseline_replay_tokens
    return max(0.0, min(cached_tokens, bound))


def gather_factor(opts: PrefillOptimisations, tlb_overhead: float) -> float:
    """Multiplier on KV / index-key gathers through host-shared tables."""
    return 1.0 if opts.large_pages else 1.0 + tlb_overhead


def topk_select_ms(opts: PrefillOptimisations, candidates: float, ns_per_candidate: float,
                   hbm_bytes_ms: float) -> float:
    """Top-k selection over `candidates` indexer logits (ms)."""
    if candidates <= 0:
        return 0.0
    if opts.deepselect:
        return candidates * LOGIT_BYTES / hbm_bytes_ms
    return candidates * ns_per_candidate * 1e-6
