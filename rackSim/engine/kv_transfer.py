"""The KV transfer channel from prefill instances to the decode ranks of a fleet.

Each prefill instance has one outgoing link and each decode rank one incoming link on each of
two networks: NVLink inside a rack (its NVLink domain), and the scale-out NICs between racks.
A transfer uses NVLink when both ends sit in the same rack, the NICs otherwise (prefill in one
rack, decode in another); prefill instances and decode ranks are numbered across the fleet.

* push: a transfer occupies its two links for its duration (FIFO), so concurrent pushes on the
  same network contend; the decode rank may admit the request once its KV has landed. One
  event per transfer.
* pull: the request is handed over at once; the decode rank reads the KV synchronously in the
  step that admits it, and that step stalls for the reads (`read_stall_ms`, asked by the
  decode instance with the blocks and bytes each rank reads in the step, local and remote).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import simpy
from simpy.events import Timeout

from rackSim.config.specs import KvTransferSpec
from rackSim.engine.request import Job
from rackSim.perf.kv_transfer import (
    decode_stall_ms,
    push_transfer_ms,
    scaleout_bandwidth_bytes_s,
)


@dataclass(frozen=True, slots=True)
class LinkEnd:
    """One end of the channel: its rack, its GPUs (each with a NIC) and its NVLink share
    (bytes/s, one direction)."""

    rack: int
    gpus: int
    nvlink_bytes_s: float


class KvTransferChannel:
    def __init__(self, env: simpy.Environment, spec: KvTransferSpec, layers: int,
                 prefills: list[LinkEnd], ranks: list[LinkEnd], nic_bytes_s: float,
                 network_latency_ms: float, deliver: Callable[[Job], None]):
        self.env, self.mode, self.deliver = env, spec.mode, deliver
        self.spec, self.layers = spec, layers
        self.prefills, self.ranks = prefills, ranks
        self.nic_bytes_s, self.network_latency_ms = nic_bytes_s, network_latency_ms
        self._out_free = [0.0] * len(prefills)      # NVLink
        self._in_free = [0.0] * len(ranks)
        self._nic_out_free = [0.0] * len(prefills)  # scale-out NICs
        self._nic_in_free = [0.0] * len(ranks)
        self.bytes_moved = 0.0
        self.bytes_cross_rack = 0.0

    def bandwidth(self, src: int = 0, dst: int = 0) -> float:
        """Bytes/s of a transfer from prefill instance `src` to decode rank `dst`: the slower
        of its two links, their NICs when they sit in different racks."""
        a, b = self.prefills[src], self.ranks[dst]
        if a.rack != b.rack:
            return scaleout_bandwidth_bytes_s(self.nic_bytes_s, a.gpus, b.gpus,
                                              self.spec.efficiency)
        return min(a.nvlink_bytes_s, b.nvlink_bytes_s)

    def read_stall_ms(self, reads_per_rank: Iterable[tuple[int, float, int, float]],
                      local_bytes_s: float, remote_bytes_s: float) -> float:
        """Pull: how long a decode step stalls on its ranks' synchronous reads, given (KV
        blocks, bytes, remote blocks, remote bytes) read by each rank that admits requests
        in the step, over links of `local_bytes_s` (NVLink) and `remote_bytes_s` (NICs)."""
        s = self.spec
        return decode_stall_ms(reads_per_rank, self.layers, local_bytes_s,
                               s.descriptor_latency_us / 1e3, s.descriptor_post_us / 1e3,
                               s.post_threads, s.descriptors_in_flight, remote_bytes_s,
                               self.network_latency_ms)

    def send(self, job: Job, nbytes: float) -> None:
        """Move `nbytes` of `job`'s KV from its prefill instance to its decode rank."""
        job.rec.kv_bytes_moved = nbytes
        self.bytes_moved += nbytes
        if job.remote:
            self.bytes_cross_rack += nbytes
        if self.mode == "pull" or nbytes <= 0:
            self.deliver(job)
            return
        env = self.env
        src, dst = job.rec.prefill_instance, job.rank_id
        if job.remote:
            out_free, in_free = self._nic_out_free, self._nic_in_free
            latency_ms = self.spec.latency_ms + self.network_latency_ms
        else:
            out_free, in_free = self._out_free, self._in_free
            latency_ms = self.spec.latency_ms
        start = max(env.now, out_free[src], in_free[dst])
        end = start + push_transfer_ms(nbytes, self.bandwidth(src, dst), latency_ms) / 1e3
        out_free[src] = in_free[dst] = end
        ev = Timeout(env, end - env.now)
        ev.callbacks.append(lambda _e, j=job: self.deliver(j))
