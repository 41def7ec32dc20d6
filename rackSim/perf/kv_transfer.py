"""Time to move KV blocks from a prefill instance to a decode rank (published K1).

Two mechanisms:

* push (K1) - the prefill side packs a request's KV rows into one contiguous region and writes
  it with one scatter-gather transfer (NIXL/UCX); the decode worker keeps stepping, the
  transfer overlaps with decode. Cost: one setup latency + bytes over the link
  (`push_transfer_ms`). The engine holds the prefill and decode links for that long (FIFO), so
  concurrent pushes queue behind each other.
* pull - the decode worker reads the KV synchronously, the way vLLM's NIXL connector issues
  reads: one descriptor per (KV block, layer) - vLLM registers one memory region per layer
  for an MLA-style cache and `_get_block_descs_ids` lists region x block - all of a request's
  descriptors in one READ transfer, which the UCX backend posts one descriptor at a time and
  completes with one flush (`pull_transfer_ms`). The decode step that admits the request waits
  for the reads, and every rank waits for the slowest (per-layer sync, C3): `decode_stall_ms`.

KV that leaves its NVLink domain (prefill in one rack, decode in another) crosses the
scale-out network instead: the GPUs at each end stripe the bytes over their own NICs, so the
link is the narrower end's NICs (`scaleout_bandwidth_bytes_s`), and every message pays the
network's latency once more (a push its one-way latency, a pull read its round trip).

A block-layer descriptor of DeepSeek-V4 is tiny (64 tokens x 890 B / 43 layers ~ 1.3 KB), so a
pull is bound by posting descriptors, not by bytes. See docs/perf.md for the sources.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

#: Tokens per KV block (the engine's 64-token prefix-cache block).
BLOCK_TOKENS = 64


def kv_blocks(tokens: float, block_tokens: int = BLOCK_TOKENS) -> int:
    """KV blocks holding `tokens` tokens (a partial last block counts)."""
    return math.ceil(tokens / block_tokens) if tokens > 0 else 0


def push_transfer_ms(nbytes: float, bandwidth_bytes_s: float, latency_ms: float) -> float:
    """Push: a request's packed KV rows written as one region (ms): one setup latency + bytes
    over the link. Overlaps decode."""
    if nbytes <= 0:
        return 0.0
    return latency_ms + nbytes / bandwidth_bytes_s * 1e3


def scaleout_bandwidth_bytes_s(nic_bytes_s: float, src_gpus: int, dst_gpus: int,
                               efficiency: float) -> float:
    """Bytes/s of one KV transfer between NVLink domains: each end stripes it over its GPUs'
    NICs (`nic_bytes_s` per GPU, one direction), the narrower end sets the pace, and
    `efficiency` is the achieved share of line rate."""
    return efficiency * nic_bytes_s * min(src_gpus, dst_gpus)


def pull_transfer_ms(blocks: int, layers: int, nbytes: float, bandwidth_bytes_s: float,
                     descriptor_latency_ms: float, descriptor_post_ms: float,
                     post_threads: int, descriptors_in_flight: int) -> float:
    """Pull: one decode rank reads `blocks` KV blocks of `layers` layers synchronously (ms).

    Every (block, layer) is one descriptor: `d = blocks x layers`. Descriptors are posted at
    `post_threads / descriptor_post_ms` per ms and at most `descriptors_in_flight` are
    outstanding, each completing `descriptor_latency_ms` after it is posted (Little's law:
    at most `in_flight / latency` complete per ms); the bytes cannot beat the link. The
    slowest of the three sets the pace, and the last descriptor's latency (the final flush)
    is paid once::

        t = latency + max(d * post / threads, d * latency / in_flight, bytes / bandwidth)
    """
    d = blocks * layers
    if d <= 0:
        return 0.0
    per_descriptor = max(descriptor_post_ms / post_threads,
                         descriptor_latency_ms / descriptors_in_flight)
    return descriptor_latency_ms + max(d * per_descriptor, nbytes / bandwidth_bytes_s * 1e3)


def decode_stall_ms(reads_per_rank: Iterable[tuple[int, float]], layers: int,
                    bandwidth_bytes_s: float, descriptor_latency_ms: float,
                    descriptor_post_ms: float, post_threads: int,
                    descriptors_in_flight: int, remote_bandwidth_bytes_s: float = 0.0,
                    network_latency_ms: float = 0.0) -> float:
    """How long a decode step stalls on the pulls of the requests it admits (ms).

    `reads_per_rank` holds, for each rank that admits requests this step, (KV blocks, bytes)
    summed over its requests, optionally followed by (blocks, bytes) read from other racks. A
    rank posts its requests' reads one after another (vLLM's `start_load_kv` loops over the
    requests, each READ posts its descriptors in turn), so its descriptors add up and it pays
    one trailing latency per link; reads from another rack go over the scale-out link
    (`remote_bandwidth_bytes_s`), each descriptor completing a network round trip
    (2 x `network_latency_ms`) later. Ranks read in parallel, and every rank waits for the
    slowest (per-layer sync, C3): the stall is the max over ranks.
    """
    def rank_ms(blocks: int, nbytes: float, remote_blocks: int = 0,
                remote_bytes: float = 0.0) -> float:
        t = pull_transfer_ms(blocks, layers, nbytes, bandwidth_bytes_s, descriptor_latency_ms,
                             descriptor_post_ms, post_threads, descriptors_in_flight)
        if remote_blocks:
            t += pull_transfer_ms(remote_blocks, layers, remote_bytes, remote_bandwidth_bytes_s,
                                  descriptor_latency_ms + 2 * network_latency_ms,
                                  descriptor_post_ms, post_threads, descriptors_in_flight)
        return t

    return max((rank_ms(*reads) for reads in reads_per_rank), default=0.0)
