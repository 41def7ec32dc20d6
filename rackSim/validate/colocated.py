"""One vLLM engine as a small SimPy model: what a single colocated server does.

A single vLLM server is not disaggregated: one scheduler mixes prefill chunks and decode
tokens in every step. This model mirrors vLLM v1's `Scheduler.schedule()` closely enough for
validation: each step first serves the running requests in order (a decode request takes one
token of the budget, a request still prefilling takes its next chunk), then admits waiting
requests FIFO while the token budget (`max_num_batched_tokens`) and `max_num_seqs` allow; a
request's prefix-cache hit is looked up when it is admitted, in whole KV blocks of the
server's size (128 tokens on CPU), at most prompt - 1 tokens (vLLM always computes the last
prompt token). A request whose prompt completes in a step emits its first token at the end of
that step; decode requests emit one token per step. Finished requests leave their prompt and
output in the prefix cache (`rackSim.engine.prefix_cache.BlockCache`, LRU, capacity = the
server's KV cache). Clients are the simulator's own (`rackSim.engine.client.AgentClients`
on `rackSim.workload.replay`), so the replay policy is the driver's; every token's time is
recorded so ITL is computed from token times exactly as for the measured run.

Kept small on purpose: no preemption (the measured server's KV cache is far larger than the
validation workload), no speculative decoding, one engine.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import simpy

from rackSim.config.specs import PricingSpec, ReplaySpec
from rackSim.engine.client import AgentClients
from rackSim.engine.prefix_cache import BlockCache
from rackSim.engine.request import Job
from rackSim.metrics.records import RequestRecord
from rackSim.perf.measured import MeasuredStepModel, Profile
from rackSim.workload.graph import BLOCK_TOKENS, RequestSpec, SessionGraph, SessionInstance
from rackSim.workload.replay import ClosedLoopReplay

ZERO_PRICING = PricingSpec(name="none", cached_input_usd_per_mtok=0.0,
                           uncached_input_usd_per_mtok=0.0, output_usd_per_mtok=0.0,
                           gpu_hour_usd=0.0)


@dataclass(slots=True, eq=False)
class _Seq:
    job: Job
    prefill_left: int = -1   # prompt tokens still to compute (-1 = not yet admitted)
    computed: int = 0        # prompt tokens whose KV exists
    emitted: int = 0


class ColocatedEngine:
    """A continuous-batching engine with chunked prefill and a prefix cache."""

    def __init__(self, env: simpy.Environment, model: MeasuredStepModel, profile: Profile,
                 steps: list[tuple]):
        shape = profile.server
        self.env, self.model, self.steps = env, model, steps
        self.budget, self.max_seqs = shape.max_num_batched_tokens, shape.max_num_seqs
        self.block = shape.block_tokens
        self.cache = BlockCache(shape.kv_capacity_tokens // BLOCK_TOKENS)
        self.api_delay_s = profile.api_overhead_ms / 1e3
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self._wake: simpy.Event = env.event()
        self._step = 0
        env.process(self._loop())

    def submit(self, job: Job) -> None:
        if self.api_delay_s > 0:
            ev = self.env.timeout(self.api_delay_s)
            ev.callbacks.append(lambda _e: self._enqueue(job))
        else:
            self._enqueue(job)

    def _enqueue(self, job: Job) -> None:
        self.waiting.append(_Seq(job))
        if not self._wake.triggered:
            self._wake.succeed()

    def warm(self, inst: SessionInstance, spec: RequestSpec) -> None:
        """Primer: make the prompt's prefix resident."""
        self.cache.insert(inst.prompt_path(spec.rid))

    def _hit_tokens(self, seq: _Seq) -> int:
        prompt = seq.job.prompt_tokens
        hit = self.cache.lookup(seq.job.path) * BLOCK_TOKENS
        return min(hit // self.block * self.block, (prompt - 1) // self.block * self.block)

    def _schedule(self) -> list[tuple[_Seq, int]]:
        budget, out = self.budget, []
        for seq in self.running:
            if budget <= 0:
                break
            n = min(seq.prefill_left, budget) if seq.prefill_left > 0 else 1
            out.append((seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            seq = self.waiting.popleft()
            hit = self._hit_tokens(seq)
            seq.job.rec.cached_tokens = hit
            seq.computed, seq.prefill_left = hit, seq.job.prompt_tokens - hit
            self.cache.touch(seq.job.path)
            self.running.append(seq)
            n = min(seq.prefill_left, budget)
            out.append((seq, n))
            budget -= n
        return out

    def _loop(self):
        env = self.env
        while True:
            if not self.waiting and not self.running:
                self._wake = env.event()
                yield self._wake
            batch = self._schedule()
            p_req = sum(1 for s, _ in batch if s.prefill_left > 0)
            p_tok = sum(n for s, n in batch if s.prefill_left > 0)
            d_req = len(batch) - p_req
            ctx = sum(s.computed + n if s.prefill_left > 0 else s.job.prompt_tokens + s.emitted
                      for s, n in batch)
            cost = self.model.mixed_step(p_tok, p_req, d_req, ctx)
            start = env.now
            yield env.timeout(cost.total_ms / 1e3)
            t = env.now
            for seq, n in batch:
                if seq.prefill_left > 0:
                    seq.prefill_left -= n
                    seq.computed += n
                    if seq.prefill_left > 0:
                        continue
                    self.cache.insert(seq.job.path)
                    seq.job.rec.first_token_s = t
                self._emit(seq, t)
            self.steps.append((
                "engine", self._step, start, cost.total_ms, p_req, p_tok, d_req, float(d_req),
                float(ctx), 0, math.nan, cost.moe, cost.attention, cost.indexer, cost.dense,
                cost.comm, cost.draft, cost.cpu, cost.sync, cost.straggler, cost.kv_stall))
            self._step += 1

    def _emit(self, seq: _Seq, t: float) -> None:
        rec = seq.job.rec
        seq.emitted += 1
        rec.output_tokens = seq.emitted
        rec.token_times_s.append(t)
        if seq.emitted >= seq.job.output_tokens:
            rec.finish_s = t
            self.running.remove(seq)
            inst = seq.job.inst
            self.cache.insert(inst.context_path(seq.job.spec.rid))
            seq.job.on_done(seq.job)


@dataclass
class ColocatedOutput:
    """Raw output of a colocated simulation: records, step rows, window (s)."""

    records: list[RequestRecord]
    steps: list[tuple]
    window_start_s: float
    window_end_s: float
    sim_s: float


def simulate_colocated(sessions: list[SessionGraph], replay: ReplaySpec, profile: Profile,
                       seed: int = 0, max_sim_s: float = 3600.0) -> ColocatedOutput:
    """Replay `sessions` on one simulated engine priced by `profile`; run until the window has
    passed and the requests in flight have finished (as the driver does)."""
    env = simpy.Environment()
    records: list[RequestRecord] = []
    steps: list[tuple] = []
    model = MeasuredStepModel.from_profile(profile)
    engine = ColocatedEngine(env, model, profile, steps)
    rp = ClosedLoopReplay(sessions, replay, seed)
    clients = AgentClients(env, rp, engine.submit, engine.warm, records)
    clients.start()
    while env.now < max_sim_s:
        env.run(until=env.now + 1.0)
        end = rp.window_end_s
        if end is not None and env.now >= end and clients.in_flight == 0:
            break
    clients.stopped = True
    ws = rp.window_start_s if rp.window_start_s is not None else env.now
    we = min(ws + replay.window_s, env.now)
    return ColocatedOutput(records, steps, ws, we, env.now)
