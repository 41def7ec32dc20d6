"""The KV transfer channel from prefill instances to the decode ranks.

Each prefill instance has one outgoing link and each decode rank one incoming link.

* push: a transfer occupies both links for its duration (FIFO), so concurrent pushes contend;
  the decode rank may admit the request once its KV has landed. One event per transfer.
* pull: the request is handed over at once; the decode rank reads the KV synchronously in the
  step that admits it, and that step stalls for the reads (`read_stall_ms`, asked by the
  decode instance with the blocks and bytes each rank reads in the step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import simpy
from simpy.events import Timeout

from rackSim.config.specs import KvTransferSpec
from rackSim.engine.request import Job
from rackSim.perf.kv_transfer import decode_stall_ms, push_transfer_ms


class KvTransferChannel:
    def __init__(self, env: simpy.Environment, spec: KvTransferSpec,
                 prefill_link_bytes_s: float, decode_link_bytes_s: float, layers: int,
                 n_prefill: int, n_ranks: int, deliver: Callable[[Job], None]):
        self.env, self.mode, self.deliver = env, spec.mode, deliver
        self.spec, self.layers = spec, layers
        self._bw = min(prefill_link_bytes_s, decode_link_bytes_s)  # a transfer's bytes/s
        self._out_free = [0.0] * n_prefill
        self._in_free = [0.0] * n_ranks
        self.bytes_moved = 0.0

    def bandwidth(self) -> float:
        """Bytes/s of one transfer: the slower of its two links."""
        return self._bw

    def read_stall_ms(self, reads_per_rank: Iterable[tuple[int, float]]) -> float:
        """Pull: how long a decode step stalls on its ranks' synchronous reads, given
        (KV blocks, bytes) read by each rank that admits requests in the step (ms)."""
        s = self.spec
        return decode_stall_ms(reads_per_rank, self.layers, self._bw,
                               s.descriptor_latency_us / 1e3, s.descriptor_post_us / 1e3,
                               s.post_threads, s.descriptors_in_flight)

    def send(self, job: Job, nbytes: float) -> None:
        job.rec.kv_bytes_moved = nbytes
        self.bytes_moved += nbytes
        if self.mode == "pull" or nbytes <= 0:
            self.deliver(job)
            return
        env = self.env
        src, dst = job.rec.prefill_instance, job.decode_rank
        start = max(env.now, self._out_free[src], self._in_free[dst])
        end = start + push_transfer_ms(nbytes, self._bw, self.spec.latency_ms) / 1e3
        self._out_free[src] = self._in_free[dst] = end
        ev = Timeout(env, end - env.now)
        ev.callbacks.append(lambda _e, j=job: self.deliver(j))
