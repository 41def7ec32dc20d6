"""A colocated instance: prefill and decode on the same GPUs, as vLLM serves by default.

Each DP rank runs its own scheduler (vLLM's data-parallel engine cores): a request is placed on
one rank when it arrives (the rank that served its session last while that rank still holds
its prefix and has a free slot, else the least-loaded rank) and stays there. Every step, each
rank's scheduler spends its token budget (`max_num_batched_tokens`) on its decoding requests
first (1 + draft tokens each), then on the chunk of its request still prefilling, then admits
waiting requests in arrival order while the budget, `max_num_seqs_per_rank` and the rank's KV
cache allow. (vLLM v1 serves its running list in admission order; since a request is only
admitted when the one before it finished its prompt, the decoding requests always come
first and at most one prompt is part-way through, so this is the same order.)

A request admitted on a rank looks up the rank's prefix cache: whole KV blocks of the
server's size (`block_tokens`), at most prompt - 1 tokens (the last prompt token is always
computed); blocks found in host memory are promoted and priced. Its whole context (prompt and
output) is reserved in the rank's GPU cache at admission and stays pinned until it retires;
what later prompts can hit is that context less its last token, whose KV is never computed
(the request ends when it is sampled), so a context that ends on a block boundary leaves its
last block out (matched on a real vLLM server request by request, docs/validate.md).
The step that computes a prompt's last chunk emits its first token; from the next step on the
request decodes as on a decode instance (`DecodeInstance`: `a` tokens per step, the same
emission and inter-token-latency accounting). The ranks' steps are synchronised (the MoE
all-to-all): one step model call prices the step of the whole instance (`mixed_step`), with
the busiest rank's prefill tokens.

Work per step grows with the ranks that have prompts to compute and the chunks scheduled,
never with the decoding batch (its aggregates are kept on admit / retire, as on a decode
instance).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace

import simpy

from rackSim.engine.decode import DecodeInstance
from rackSim.engine.prefix_cache import TieredPrefixCache
from rackSim.engine.request import Job
from rackSim.metrics.histogram import LatencyHistogram
from rackSim.perf.step import DecodeBatch, PrefillBatch, StepModel
from rackSim.workload.graph import BLOCK_TOKENS, computed_path


class ColocatedInstance(DecodeInstance):
    """`ranks` DP ranks (one for TP) that prefill and decode; see the module docstring.

    token_budget: tokens per rank per step; block_tokens: the server's KV block size, the
    granularity of prefix hits (a multiple of the simulator's 64-token blocks);
    api_delay_s: front-end time before a request reaches the scheduler (s); output_delay_s:
    front-end time per output token (s; a step's n outputs reach their clients (n + 1) / 2 x
    this after it ends); intake_stall_ms, intake_stall_per_token_ms: host time (ms, and ms
    per prompt token) a request's intake takes from a decode-only step in progress when it
    arrives, which ends that much later; a step that computes a prompt absorbs it (a measured
    server's front-end shares the engine core's CPU, docs/validate.md; 0 on a simulated
    rack); on_prefilled: called when a request's prompt is computed;
    reuse_outputs: whether later prompts carry a request's output as the tokens it generated
    (an agent: the blocks its output filled are prefix hits for the next turn), or as other
    tokens (the validated mode's driver re-sends the workload's own token ids, not what the
    server generated), so that only its prompt's blocks stay reusable."""

    def __init__(self, env: simpy.Environment, index: int, ranks: int, token_budget: int,
                 max_seqs_per_rank: int, accepted: float, draft_tokens: int,
                 caches: list[TieredPrefixCache], model: StepModel, kv_bytes_per_token: float,
                 itl: LatencyHistogram, in_window: Callable[[float], bool], trace_tokens: bool,
                 on_prefilled: Callable[[Job], None],
                 step_writer: Callable[[str, StepModel], Callable[..., None]],
                 rack: int = 0, block_tokens: int = BLOCK_TOKENS, api_delay_s: float = 0.0,
                 output_delay_s: float = 0.0, reuse_outputs: bool = True,
                 intake_stall_ms: float = 0.0, intake_stall_per_token_ms: float = 0.0):
        if block_tokens % BLOCK_TOKENS:
            raise ValueError(f"block_tokens={block_tokens}: must be a multiple of "
                             f"{BLOCK_TOKENS}, the simulator's KV block")
        super().__init__(env, ranks, max_seqs_per_rank, None, accepted, draft_tokens,
                         [c.gpu for c in caches], model, kv_bytes_per_token, None, itl,
                         in_window, trace_tokens, step_writer, name=f"colocated-{index}",
                         index=index, rack=rack)
        self.tiers = caches
        self.budget, self.block = token_budget, block_tokens
        self.api_delay_s, self.output_delay_s = api_delay_s, output_delay_s
        self.intake_stall_ms, self.intake_stall_per_token_ms = (intake_stall_ms,
                                                                intake_stall_per_token_ms)
        self._stallable = False  # a decode-only step is in progress: an intake stalls it
        self._stall_ms = 0.0     # intake time the step in progress has still to take
        self.on_prefilled = on_prefilled
        self.reuse_outputs = reuse_outputs
        self.waiting: list[deque[Job]] = [deque() for _ in range(ranks)]
        self.prefilling: list[list[Job]] = [[] for _ in range(ranks)]
        self._busy: set[int] = set()  # ranks with a prompt waiting or part-way
        #: prompt tokens still to compute, as estimated at submission (the routers' load)
        self.queued_tokens = 0

    # -- arrival ---------------------------------------------------------------------------
    def _uncached(self, job: Job, rank: int) -> int:
        gpu, host = self.tiers[rank].lookup(job.path)
        return job.prompt_tokens - self._cached_tokens(job, gpu + host)

    def _cached_tokens(self, job: Job, blocks: int) -> int:
        """Prompt tokens a hit of `blocks` 64-token blocks saves: whole server blocks, at most
        prompt - 1 tokens."""
        b = self.block
        return min(blocks * BLOCK_TOKENS // b * b, (job.prompt_tokens - 1) // b * b)

    @property
    def requests_held(self) -> int:
        """Requests submitted here and not retired: waiting, prefilling or decoding."""
        return self.ranks * self.max_seqs - self.free_slots

    def estimated_uncached(self, job: Job) -> int:
        """Prompt tokens this instance would compute for `job` if it arrived now."""
        return self._uncached(job, self.pick_rank(job)[0])

    def submit(self, job: Job, uncached: int | None = None) -> None:
        """Place `job` on a rank and queue it there (after the front-end delay)."""
        rank, _ = self.choose_rank(job)
        job.decode, job.decode_rank = self, rank
        rec = job.rec
        rec.prefill_instance = rec.decode_instance = self.index
        rec.decode_rack = self.rack
        if uncached is None:
            uncached = self._uncached(job, rank)
        job.computed = job.prompt_tokens - uncached  # refined at _start
        self.queued_tokens += uncached
        if self._stallable:
            self._stall_ms += (self.intake_stall_ms
                               + self.intake_stall_per_token_ms * job.prompt_tokens)
        if self.api_delay_s > 0:
            self.env.timeout(self.api_delay_s).callbacks.append(lambda _e: self._enqueue(job))
        else:
            self._enqueue(job)

    def _enqueue(self, job: Job) -> None:
        r = job.decode_rank
        self.waiting[r].append(job)
        self._busy.add(r)
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def warm(self, job: Job, rank: int) -> None:
        """Primer: `job`'s prompt is resident on `rank`, which served its session last."""
        self.tiers[rank].insert(job.path)
        self._affinity[job.inst.key_base] = rank

    # -- scheduling --------------------------------------------------------------------------
    def _start(self, job: Job, r: int) -> bool:
        """Admit `job` on rank `r` if the rank's GPU cache can reserve its whole context."""
        tier = self.tiers[r]
        spec, inst = job.spec, job.inst
        full = inst.context_path(spec.rid) \
            if spec.context_tokens == inst.graph.requests[spec.rid].context_tokens \
            else inst.path_through(spec.rid, spec.context_tokens)  # a primer: one token out
        if not tier.gpu.can_hold(full):
            return False
        gpu, host = tier.lookup(job.path)
        cached = self._cached_tokens(job, gpu + host)
        job.host_blocks = max(0, min(host, cached // BLOCK_TOKENS - gpu))
        rec = job.rec
        rec.cached_tokens = cached
        rec.prefill_start_s = self.env.now
        self.queued_tokens -= cached - job.computed  # correct the estimate made at submit
        job.computed = cached
        kept = computed_path(full, spec.context_tokens) if self.reuse_outputs else job.path
        tier.insert(kept)
        tier.gpu.pin(kept)
        job.path = kept
        return True

    def _schedule(self, q: int) -> tuple[list[tuple[Job, int]], PrefillBatch]:
        """This step's prefill chunks over every rank with prompts, and their batch."""
        chunks: list[tuple[Job, int]] = []
        new = admitted = busiest = 0
        host_bytes = 0.0
        per_token = self.kv_bytes_per_token
        for r in list(self._busy):
            room = left = self.budget - self.n_req[r] * q
            prefilling, waiting = self.prefilling[r], self.waiting[r]
            for job in prefilling:  # the prompt part-way first
                if left <= 0:
                    break
                n = min(job.prompt_tokens - job.computed, left)
                chunks.append((job, n))
                left -= n
            while waiting and left > 0 and \
                    self.n_req[r] + len(prefilling) < self.max_seqs:
                job = waiting[0]
                if not self._start(job, r):
                    break
                waiting.popleft()
                prefilling.append(job)
                admitted += job.prompt_tokens
                host_bytes += job.host_blocks * BLOCK_TOKENS * per_token
                n = min(job.prompt_tokens - job.computed, left)
                chunks.append((job, n))
                left -= n
            rank_new = max(room - left, 0)
            new += rank_new
            busiest = max(busiest, rank_new)
        attended = sum(job.computed + n for job, n in chunks)
        batch = PrefillBatch(new_tokens=new, attended_tokens=attended, num_requests=len(chunks),
                             admitted_prompt_tokens=admitted, ranks=self.ranks,
                             host_loaded_bytes=host_bytes, busiest_rank_tokens=busiest)
        return chunks, batch

    def _prefilled(self, chunks: list[tuple[Job, int]], step: int, now: float) -> list[Job]:
        """Advance this step's chunks; the requests whose prompt is now computed start
        decoding at this step (their first token ends it)."""
        done: list[Job] = []
        for job, n in chunks:
            job.computed += n
            self.queued_tokens -= n
            if job.computed >= job.prompt_tokens:
                done.append(job)
        for job in done:
            r = job.decode_rank
            self.prefilling[r].remove(job)
            if not self.prefilling[r] and not self.waiting[r]:
                self._busy.discard(r)
            job.rec.prefill_end_s = job.rec.kv_ready_s = now
            self.on_prefilled(job)
            self._enter(job, r, step, now)
        return done

    # -- the step loop -------------------------------------------------------------------------
    def _loop(self):
        env, model, write_step = self.env, self.model, self.write_step
        a, draft_tokens, running = self.a, self.draft_tokens, self.running
        q = 1 + draft_tokens
        while True:
            if not running and not self._busy:
                self._wake = env.event()
                yield self._wake
            chunks, prefill = self._schedule(q)
            if not chunks and not running:  # every waiting request is blocked on KV room
                self._wake = env.event()
                yield self._wake
                continue
            step = self.step
            decode = DecodeBatch(self.n_req, self.ctx, a, draft_tokens, 0, 0, step)
            n_decoding = len(running)
            cost = model.mixed_step(prefill, decode)
            start = env.now
            self._stallable = not chunks
            yield env.timeout(cost.total_ms / 1e3)
            while self._stall_ms > 0:  # requests arrived during the step: it ends later
                stall, self._stall_ms = self._stall_ms, 0.0
                cost = replace(cost, cpu=cost.cpu + stall)
                yield env.timeout(stall / 1e3)
            self._stallable = False
            total_ms = cost.total_ms
            dur = total_ms / 1e3
            end = env.now
            entered = self._prefilled(chunks, step, end)
            emitted, retiring = self._emit(step, entered, dur, end)
            write_step(step, start, cost, total_ms, prefill.num_requests, prefill.new_tokens,
                       n_decoding, emitted - len(entered),
                       sum(self.ctx) + prefill.attended_tokens, len(entered))
            self._advance(end, retiring)

