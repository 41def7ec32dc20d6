"""Time to move KV blocks from a prefill instance to the decode instance.

Two mechanisms (published K1):

* push - the prefill side packs a request's KV rows into one contiguous region and sends it
  with one scatter-gather transfer (NIXL/UCX); the decode worker keeps stepping, the transfer
  overlaps with decode. Cost: one setup latency + bytes over the link share.
* pull - the decode worker reads the blocks synchronously, one read per KV block; its steps
  stall for the whole read. Cost: one setup latency per block + bytes over the link share.

Contention: `concurrent` transfers in flight on the same link share its bandwidth equally.
"""

from __future__ import annotations

import math

#: Tokens per KV block (the engine's 64-token prefix-cache block).
BLOCK_TOKENS = 64


def kv_transfer_ms(nbytes: float, bandwidth_bytes_s: float, latency_ms: float) -> float:
    """One transfer alone on its link: setup latency + bytes over bandwidth (ms)."""
    if nbytes <= 0:
        return 0.0
    return latency_ms + nbytes / bandwidth_bytes_s * 1e3


def shared_bandwidth_bytes_s(bandwidth_bytes_s: float, concurrent: int) -> float:
    """Bandwidth one of `concurrent` simultaneous transfers gets on a shared link (bytes/s)."""
    return bandwidth_bytes_s / max(1, concurrent)


def push_transfer_ms(nbytes: float, bandwidth_bytes_s: float, latency_ms: float,
                     concurrent: int = 1) -> float:
    """Push: packed rows sent as one region, one setup latency (ms). Overlaps decode."""
    return kv_transfer_ms(nbytes, shared_bandwidth_bytes_s(bandwidth_bytes_s, concurrent),
                          latency_ms)


def pull_transfer_ms(nbytes: float, tokens: int, bandwidth_bytes_s: float, latency_ms: float,
                     concurrent: int = 1, block_tokens: int = BLOCK_TOKENS) -> float:
    """Pull: one synchronous read per KV block, each paying `latency_ms` (ms).

    The decode worker that issues the reads stalls for the returned time.
    """
    if nbytes <= 0:
        return 0.0
    blocks = max(1, math.ceil(tokens / block_tokens))
    bw = shared_bandwidth_bytes_s(bandwidth_bytes_s, concurrent)
    return blocks * latency_ms + nbytes / bw * 1e3


def transfer_ms(mode: str, nbytes: float, tokens: int, bandwidth_bytes_s: float,
                latency_ms: float, concurrent: int = 1) -> float:
    """Duration of one prefill->decode KV transfer in `mode` 'push' or 'pull' (ms)."""
    if mode == "push":
        return push_transfer_ms(nbytes, bandwidth_bytes_s, latency_ms, concurrent)
    if mode == "pull":
        return pull_transfer_ms(nbytes, tokens, bandwidth_bytes_s, latency_ms, concurrent)
    raise ValueError(f"unknown KV transfer mode '{mode}'")


def decode_stall_ms(mode: str, nbytes: float, tokens: int, bandwidth_bytes_s: float,
                    latency_ms: float, concurrent: int = 1) -> float:
    """How long the receiving decode worker is blocked by one transfer (ms): the whole
    transfer for pull, nothing for push (it overlaps)."""
    if mode == "pull":
        return pull_transfer_ms(nbytes, tokens, bandwidth_bytes_s, latency_ms, concurrent)
    return 0.0
