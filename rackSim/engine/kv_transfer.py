"""The KV transfer channel from prefill instances to the decode instance.

Each prefill instance has one outgoing link and each decode rank one incoming link; a transfer
occupies both for its duration (FIFO), so concurrent transfers contend. One event per transfer.
Push mode overlaps transfers with decoding; pull mode hands the request over at once and the
decode worker reads the KV synchronously when it admits it (the engine charges the read to
that step as `kv_stall`).
"""

from __future__ import annotations

from collections.abc import Callable

import simpy
from simpy.events import Timeout

from rackSim.engine.request import Job
from rackSim.perf.kv_transfer import kv_transfer_ms


class KvTransferChannel:
    def __init__(self, env: simpy.Environment, mode: str, prefill_link_bytes_s: float,
                 decode_link_bytes_s: float, latency_ms: float, n_prefill: int, n_ranks: int,
                 deliver: Callable[[Job], None]):
        self.env, self.mode, self.deliver = env, mode, deliver
        self.latency_ms = latency_ms
        self._bw = min(prefill_link_bytes_s, decode_link_bytes_s)  # a transfer's bytes/s
        self._out_free = [0.0] * n_prefill
        self._in_free = [0.0] * n_ranks
        self.bytes_moved = 0.0

    def bandwidth(self) -> float:
        """Bytes/s of one transfer: the slower of its two links."""
        return self._bw

    def read_ms(self, nbytes: float) -> float:
        """Synchronous read by a decode worker (pull mode)."""
        return kv_transfer_ms(nbytes, self.bandwidth(), self.latency_ms)

    def send(self, job: Job, nbytes: float) -> None:
        job.rec.kv_bytes_moved = nbytes
        self.bytes_moved += nbytes
        if self.mode == "pull" or nbytes <= 0:
            self.deliver(job)
            return
        env = self.env
        src, dst = job.rec.prefill_instance, job.decode_rank
        start = max(env.now, self._out_free[src], self._in_free[dst])
        end = start + kv_transfer_ms(nbytes, self._bw, self.latency_ms) / 1e3
        self._out_free[src] = self._in_free[dst] = end
        ev = Timeout(env, end - env.now)
        ev.callbacks.append(lambda _e, j=job: self.deliver(j))
