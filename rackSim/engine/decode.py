"""The decode instance: DP attention ranks, continuous batching, speculative decoding.

Its loop reads like vLLM's: admit requests whose KV has arrived, run one step, emit tokens,
retire. Work per step does not grow with the batch: per-rank aggregates (requests, context
tokens) change on admit / retire, and each request's last step is fixed when it is admitted.

In a fleet several decode instances run side by side (each its own loop, step counter and
step rows under its own name); `free_slots` (slots left after running and placed requests)
lets the global router find one with room without scanning its ranks.

Admission: every DP rank runs its own scheduler, so the KV-load cap (K2) holds per rank and
per step, and the step hands the step model, for each rank that admits, (requests, prompt
tokens, KV blocks received): the admission work the model prices against the GPU step. In
pull mode the ranks read the admitted requests' KV synchronously inside the step; the stall
comes from the KV channel (priced in perf/kv_transfer.py) and every request in the step sees
it as part of its inter-token gap.

Token emission (forced acceptance): a request's first step emits 1 token; each later step
emits `a` = accepted_tokens_per_step, so N tokens need 1 + ceil((N - 1) / a) steps and the
last one emits the remainder (N - 1) - a (steps - 2), in (0, a]. Step rows and the
inter-token-latency histogram use these exact (fractional) means, so tokens are conserved per
request; with `trace_tokens` each token gets a time, the k-th later step emitting
floor(a k) - floor(a (k - 1)) whole tokens (3 or 4 for a = 3.25).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import add, mul

import simpy

from rackSim.engine.clock import wake_at
from rackSim.engine.prefix_cache import BlockCache
from rackSim.engine.request import Job
from rackSim.metrics.histogram import LatencyHistogram
from rackSim.perf.kv_transfer import kv_blocks
from rackSim.perf.step import DecodeBatch, StepModel


def decode_steps(output_tokens: int, a: float) -> int:
    """Decode steps needed to emit `output_tokens` (first step 1 token, then `a` per step)."""
    if output_tokens <= 1:
        return 1
    return 1 + math.ceil((output_tokens - 1) / a - 1e-9)


def emitted_after(later_steps: int, a: float) -> int:
    """Tokens emitted by a request's first `later_steps` steps after its first one."""
    return math.floor(a * later_steps + 1e-9)


class DecodeInstance:
    def __init__(self, env: simpy.Environment, ranks: int, max_seqs_per_rank: int,
                 load_cap: int | None, accepted: float, draft_tokens: int,
                 caches: list[BlockCache], model: StepModel, kv_bytes_per_token: float,
                 read_stall_ms: Callable[[Iterable[tuple[int, float, int, float]]], float] | None,
                 itl: LatencyHistogram, in_window: Callable[[float], bool],
                 trace_tokens: bool,
                 step_writer: Callable[[str, StepModel], Callable[..., None]],
                 name: str = "decode",
                 index: int = 0, rack: int = 0, rank_offset: int = 0):
        self.env, self.ranks = env, ranks
        #: its name in step rows, its number and its rack's in the fleet, and the fleet-wide
        #: number of its rank 0 (the KV channel numbers decode ranks across the fleet)
        self.name, self.index, self.rack, self.rank_offset = name, index, rack, rank_offset
        self.max_seqs, self.load_cap = max_seqs_per_rank, load_cap
        self.a, self.draft_tokens = accepted, draft_tokens
        self.caches, self.model = caches, model
        self.kv_bytes_per_token = kv_bytes_per_token
        #: pull mode: the stall (ms) of a step whose ranks read (KV blocks, bytes, remote KV
        #: blocks, remote bytes) each
        self.read_stall_ms = read_stall_ms
        self.itl, self.in_window = itl, in_window
        self.trace_tokens = trace_tokens
        self.write_step = step_writer(name, model)  # StepLog.writer
        #: per rank, its requests whose KV has arrived, in order of arrival (delivery
        #: number, job)
        self.ready: list[deque[tuple[int, Job]]] = [deque() for _ in range(ranks)]
        self._waiting: set[int] = set()  # ranks with ready requests
        self._delivered = 0
        self.n_req = [0] * ranks
        self.pending = [0] * ranks  # placed on the rank, KV not admitted yet
        self.load = [0] * ranks     # n_req + pending, kept up to date (rank choice)
        self.free_slots = ranks * max_seqs_per_rank  # minus sum(load), kept up to date
        self.ctx = [0.0] * ranks
        self._active: set[int] = set()  # ranks with running requests (ctx 0.0 elsewhere)
        self.running: dict[int, Job] = {}
        self._finish: dict[int, list[Job]] = {}
        #: a request retired since the last step was priced: the next one is priced afresh
        #: (`decode_step`), not as a repeat of the last batch (`decode_repeat`)
        self._regrouped = False
        self.step = 0
        self._wake: simpy.Event | None = None
        self._affinity: dict[int, int] = {}  # session key base -> rank it last used
        #: front-end time per output token (s; 0 on a simulated rack): a step's n outputs
        #: reach their clients (n + 1) / 2 x this after the step ends (`_seen`)
        self.output_delay_s = 0.0
        self._seen = 0.0
        env.process(self._loop())

    # -- placement ------------------------------------------------------------------------
    def choose_rank(self, job: Job) -> tuple[int, int]:
        """DP rank for a request and how many of its prompt blocks that rank already holds.

        The rank that served the session last while it still holds the session's prefix and
        has a free slot (its KV need not move again); otherwise the least-loaded rank.
        """
        rank, hit = self.pick_rank(job)
        self.pending[rank] += 1
        self.load[rank] += 1
        self.free_slots -= 1
        return rank, hit

    def pick_rank(self, job: Job) -> tuple[int, int]:
        """`choose_rank`'s choice, without placing the request there."""
        load = self.load
        prev = self._affinity.get(job.inst.key_base)
        hit = 0
        if prev is not None and load[prev] < self.max_seqs:
            hit = self.caches[prev].lookup(job.path)
        if hit:
            return prev, hit
        rank = load.index(min(load))  # the first least-loaded rank
        return rank, self.caches[rank].lookup(job.path)

    def deliver(self, job: Job) -> None:
        """KV of `job` is on its rank (push) or readable (pull): it may be admitted."""
        job.rec.kv_ready_s = self.env.now
        self._delivered += 1
        self.ready[job.decode_rank].append((self._delivered, job))
        self._waiting.add(job.decode_rank)
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    # -- the step loop ---------------------------------------------------------------------
    def _admit(self, now: float
               ) -> tuple[list[Job], float, int, tuple[tuple[int, int, int], ...]]:
        """Admit ready requests to the step starting at `now` (s). Each DP rank's scheduler
        takes its own ready requests in order, as many as it has free slots and at most
        `load_cap` new KV loads a step; one whose context its KV cache cannot hold waits, and
        so do the rank's later ones. With a cap, the instance admits at most `load_cap` x
        ranks a step, the earliest delivered first. Returns (admitted jobs in delivery order,
        pull stall in ms, their prompt tokens, per admitting rank (requests, prompt tokens,
        KV blocks received))."""
        cap, max_seqs, n_req, ready = self.load_cap, self.max_seqs, self.n_req, self.ready
        taken: list[tuple[int, Job]] = []
        emptied: list[int] = []
        for r in self._waiting:
            queue = ready[r]
            room = max_seqs - n_req[r]
            if cap is not None and cap < room:
                room = cap
            if room >= len(queue):
                taken.extend(queue)
                queue.clear()
                emptied.append(r)
            else:
                for _ in range(room):
                    taken.append(queue.popleft())
        if not taken:
            return [], 0.0, 0, ()
        if len(taken) > 1:
            taken.sort()
        if cap is not None and len(taken) > cap * self.ranks:  # beyond the instance's cap
            for seq_job in reversed(taken[cap * self.ranks:]):
                ready[seq_job[1].decode_rank].appendleft(seq_job)
            del taken[cap * self.ranks:]
        admitted: list[Job] = []
        # rank -> [requests, prompt tokens, blocks, bytes, remote blocks, remote bytes]
        by_rank: dict[int, list] = {}
        held: dict[int, list[tuple[int, Job]]] = {}  # ranks whose cache is full: their rest
        prompt_tokens = 0
        per_token = self.kv_bytes_per_token
        caches, enter, step = self.caches, self._enter, self.step
        for seq_job in taken:
            job = seq_job[1]
            r = job.decode_rank
            wait = held.get(r)
            if wait is None:
                full = job.inst.context_path(job.spec.rid)
                cache = caches[r]
                if cache.can_hold(full):
                    cache.insert(full)
                    cache.pin(full)
                    job.path = full
                else:
                    wait = held[r] = []
            if wait is not None:
                wait.append(seq_job)
                continue
            enter(job, r, step, now)
            rec = job.rec
            prompt_tokens += job.prompt_tokens
            nbytes = rec.kv_bytes_moved
            blocks = kv_blocks(round(nbytes / per_token))
            acc = by_rank.get(r)
            if acc is None:
                acc = by_rank[r] = [1, job.prompt_tokens, 0, 0.0, 0, 0.0]
            else:
                acc[0] += 1
                acc[1] += job.prompt_tokens
            if job.remote:
                acc[4] += blocks
                acc[5] += nbytes
            else:
                acc[2] += blocks
                acc[3] += nbytes
            admitted.append(job)
        for r, wait in held.items():
            ready[r].extendleft(reversed(wait))
        waiting = self._waiting
        for r in emptied:
            if not ready[r]:
                waiting.discard(r)
        accs = by_rank.values()
        stall = (self.read_stall_ms((acc[2], acc[3], acc[4], acc[5]) for acc in accs)
                 if self.read_stall_ms else 0.0)
        return admitted, stall, prompt_tokens, tuple((acc[0], acc[1], acc[2]) for acc in accs)

    def _enter(self, job: Job, r: int, step: int, now: float) -> None:
        """`job` starts decoding on rank `r` at `step`: it emits its first token at the end of
        that step and retires at the end of its last."""
        steps = decode_steps(job.output_tokens, self.a)
        job.steps, job.admit_step = steps, step
        last = job.finish_step = step + steps - 1
        retiring = self._finish.get(last)
        if retiring is None:
            self._finish[last] = [job]
        else:
            retiring.append(job)
        if not self.n_req[r]:
            self._active.add(r)
        self.n_req[r] += 1
        self.pending[r] -= 1
        self.ctx[r] += job.prompt_tokens
        self.running[id(job)] = job
        rec = job.rec
        rec.decode_start_s = now
        rec.decode_rank = r

    def _emit(self, step: int, entered: list[Job], dur: float, end: float
              ) -> tuple[float, Iterable[Job]]:
        """Tokens of step `step` (`dur` s, ending at `end`): `entered` (which started this
        step) emit their first, the others `a` each or their remainder; the inter-token gaps
        go to the ITL histogram in the window. Returns the tokens emitted and the requests
        whose last step this is (for `_advance`)."""
        a = self.a
        n_running = len(self.running)
        retiring = self._finish.pop(step, ())
        seen = self._seen = (end + self.output_delay_s * (n_running + 1) / 2
                             if self.output_delay_s else end)
        for job in entered:
            job.rec.first_token_s = seen
        mid = n_running - len(entered)
        emitted = float(len(entered))
        window = self.in_window(end)
        itl_add = self.itl.add
        for job in retiring:
            if job.steps == 1:
                continue
            mid -= 1
            last = job.output_tokens - 1 - a * (job.steps - 2)  # in (0, a]
            emitted += last
            if window:
                itl_add(dur * 1e3 / last, last)
        emitted += a * mid
        if window and mid > 0:
            itl_add(dur * 1e3 / a, a * mid)
        if self.trace_tokens:
            self._trace(seen)
        return emitted, retiring

    def _advance(self, end: float, retiring: Iterable[Job]) -> None:
        """After a step's row is written: contexts grow by `a` per running request, and the
        requests at their last step (`retiring`, from `_emit`) retire."""
        active, a = self._active, self.a
        if 2 * len(active) < self.ranks:  # few busy ranks (light load): only theirs grow
            ctx, n_req = self.ctx, self.n_req
            for r in active:
                ctx[r] += a * n_req[r]
        else:
            self.ctx = list(map(add, self.ctx, map(mul, repeat(a), self.n_req)))
        for job in retiring:
            self._retire(job, end)
        self.step += 1

    def _loop(self):
        """The step loop. A step yields to SimPy only when something else could happen
        before it ends (the next event in the queue is due by then) or when it retires
        requests (their completion releases other work at its end); otherwise its end is
        handled at once and the next step starts from it (`clock`), without an event. Every
        step thus sees what it would have seen as its own timeout, to the bit: nothing else
        runs in between, and its start is the previous end."""
        env, a, draft_tokens = self.env, self.a, self.draft_tokens
        write_step, price, again = (self.write_step, self.model.decode_step,
                                    self.model.decode_repeat)
        running, n_req, finish = self.running, self.n_req, self._finish
        peek, emit, advance = env.peek, self._emit, self._advance
        no_jobs: list[Job] = []
        no_ranks: tuple[tuple[int, int, int], ...] = ()
        clock = env.now
        while True:
            if not running and not self._waiting:
                self._wake = env.event()
                yield self._wake
                clock = env.now
            if self._waiting:
                admitted, stall_ms, prompt_tokens, by_rank = self._admit(clock)
            else:
                admitted, stall_ms, prompt_tokens, by_rank = no_jobs, 0.0, 0, no_ranks
            if not running:  # every ready request is blocked: wait for a change
                self._wake = env.event()
                yield self._wake
                clock = env.now
                continue
            step = self.step
            n_admitted = len(admitted)
            batch = DecodeBatch(n_req, self.ctx, a, draft_tokens, n_admitted, prompt_tokens,
                                step, by_rank)
            if admitted or self._regrouped:
                self._regrouped = False
                cost = price(batch)
            else:  # the same requests as the last step: only their contexts grew
                cost = again(batch)
            if stall_ms > 0:
                cost = cost.with_kv_stall(stall_ms)
            total_ms = cost.total_ms
            dur = total_ms / 1e3
            end = clock + dur
            if end >= peek() or step in finish:
                yield wake_at(env, end)
            n_running = len(running)
            emitted, retiring = emit(step, admitted, dur, end)
            write_step(step, clock, cost, total_ms, 0, 0, n_running, emitted, sum(self.ctx),
                       n_admitted)
            advance(end, retiring)
            clock = end

    def _trace(self, end: float) -> None:
        """Every running request's token times (tests and small runs only: O(batch))."""
        for job in self.running.values():
            k = self.step - job.admit_step  # steps after the first
            n = 1 if k == 0 else emitted_after(k, self.a) - emitted_after(k - 1, self.a)
            times = job.rec.token_times_s
            times.extend([end] * min(n, job.output_tokens - len(times)))

    def _retire(self, job: Job, end: float) -> None:
        r = job.decode_rank
        n_req, ctx = self.n_req, self.ctx
        n_req[r] -= 1
        self.load[r] -= 1
        self.free_slots += 1
        if n_req[r] == 0:
            ctx[r] = 0.0
            self._active.discard(r)
        else:
            ctx[r] -= job.prompt_tokens + self.a * job.steps
        del self.running[id(job)]
        self._regrouped = True
        self.caches[r].unpin(job.path)
        self._affinity[job.inst.key_base] = r
        rec = job.rec
        rec.output_tokens = job.output_tokens
        if self.output_delay_s:  # its client sees the last token (and goes on) at `_seen`
            rec.finish_s = self._seen
            self.env.timeout(self._seen - end).callbacks.append(lambda _e: job.on_done(job))
        else:
            rec.finish_s = end
            job.on_done(job)
