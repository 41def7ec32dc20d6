"""Time to move KV blocks from a prefill instance to the decode instance."""

from __future__ import annotations


def kv_transfer_ms(nbytes: float, bandwidth_bytes_s: float, latency_ms: float) -> float:
    """One transfer alone on its link: setup latency + bytes over bandwidth (ms)."""
    if nbytes <= 0:
        return 0.0
    return latency_ms + nbytes / bandwidth_bytes_s * 1e3
