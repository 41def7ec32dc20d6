"""A prefill instance: chunked prefill over a FIFO queue, with an instance-wide prefix cache."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import simpy

from rackSim.engine.prefix_cache import TieredPrefixCache
from rackSim.engine.request import Job
from rackSim.perf.step import PrefillBatch, StepModel
from rackSim.workload.graph import BLOCK_TOKENS


class PrefillInstance:
    """Computes prompt KV in chunks of at most `token_budget` tokens per step.

    vLLM-style scheduling: requests already running (partly prefilled) first, then waiting
    ones in arrival order; a newly scheduled request looks up the prefix cache, so its cached
    part is what is resident *when it starts*. A full hit still computes the last prompt token.
    """

    def __init__(self, env: simpy.Environment, index: int, ranks: int, token_budget: int,
                 max_num_seqs: int, cache: TieredPrefixCache, model: StepModel,
                 kv_bytes_per_token: float, on_prefilled: Callable[[Job], None],
                 step_writer: Callable[[str, StepModel], Callable[..., None]]):
        self.env, self.index, self.ranks = env, index, ranks
        self.name = f"prefill-{index}"
        self.max_seqs = max_num_seqs
        self.step_tokens = token_budget * ranks
        self.cache, self.model = cache, model
        self.kv_bytes_per_token = kv_bytes_per_token
        self.on_prefilled = on_prefilled
        self.write_step = step_writer(self.name, model)  # StepLog.writer
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.queued_tokens = 0  # prompt tokens still to compute, as estimated at submission
        self.steps = 0
        self._wake: simpy.Event | None = None
        env.process(self._loop())

    @property
    def requests_held(self) -> int:
        """Requests submitted here whose prompt is not computed yet."""
        return len(self.waiting) + len(self.running)

    def estimated_uncached(self, job: Job) -> int:
        """Prompt tokens this instance would compute for `job` if it started now."""
        gpu, host = self.cache.lookup(job.path)
        uncached = job.prompt_tokens - (gpu + host) * BLOCK_TOKENS
        return uncached if uncached > 1 else 1

    def submit(self, job: Job, uncached: int | None = None) -> None:
        """Queue `job`; `uncached` is its estimated uncached tokens here, if already known."""
        job.rec.prefill_instance = self.index
        if uncached is None:
            uncached = self.estimated_uncached(job)
        job.computed = job.prompt_tokens - uncached  # refined at _start
        self.waiting.append(job)
        self.queued_tokens += job.prompt_tokens - job.computed
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def _start(self, job: Job) -> None:
        gpu, host = self.cache.lookup(job.path)
        cached = min((gpu + host) * BLOCK_TOKENS, job.prompt_tokens - 1)
        job.host_blocks = max(0, min(host, cached // BLOCK_TOKENS - gpu))
        job.rec.cached_tokens = cached
        job.rec.prefill_start_s = self.env.now
        self.queued_tokens -= cached - job.computed  # correct the estimate made at submit
        job.computed = cached
        self.cache.gpu.pin(job.path)

    def _schedule(self) -> tuple[list[tuple[Job, int]], PrefillBatch]:
        left = self.step_tokens
        chunks: list[tuple[Job, int]] = []
        admitted_tokens = 0
        host_bytes = 0.0
        attended = 0
        for job in self.running:
            if left <= 0:
                break
            n = min(job.prompt_tokens - job.computed, left)
            chunks.append((job, n))
            left -= n
        while self.waiting and left > 0 and len(self.running) < self.max_seqs:
            job = self.waiting.popleft()
            self._start(job)
            self.running.append(job)
            admitted_tokens += job.prompt_tokens
            host_bytes += job.host_blocks * BLOCK_TOKENS * self.kv_bytes_per_token
            n = min(job.prompt_tokens - job.computed, left)
            chunks.append((job, n))
            left -= n
        new = 0
        for job, n in chunks:
            new += n
            attended += job.computed + n
        batch = PrefillBatch(new_tokens=new, attended_tokens=attended, num_requests=len(chunks),
                             admitted_prompt_tokens=admitted_tokens, ranks=self.ranks,
                             host_loaded_bytes=host_bytes)
        return chunks, batch

    def _loop(self):
        env, model, write_step = self.env, self.model, self.write_step
        timeout, event = env.timeout, env.event
        gpu = self.cache.gpu
        while True:
            if not self.waiting and not self.running:
                self._wake = event()
                yield self._wake
            chunks, batch = self._schedule()
            cost = model.prefill_step(batch)
            start = env.now
            total_ms = cost.total_ms
            yield timeout(total_ms / 1e3)
            self.steps += 1
            write_step(self.steps, start, cost, total_ms, batch.num_requests,
                       batch.new_tokens, 0, 0, batch.attended_tokens, 0)
            done = []
            queued = self.queued_tokens
            for job, n in chunks:
                job.computed += n
                queued -= n
                if job.computed >= job.prompt_tokens:
                    done.append(job)
            self.queued_tokens = queued
            if done:
                self.running = [j for j in self.running if j.computed < j.prompt_tokens]
                now = env.now
                for job in done:
                    gpu.unpin(job.path)
                    self.cache.insert(job.path)
                    job.rec.prefill_end_s = now
                    self.on_prefilled(job)
