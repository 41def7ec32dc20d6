"""Instance speeds the screen reads, priced once per (hardware, role, width) by `perf/`.

* `DecodeSpeed`: the step time of a DEPn decode instance as a table over requests per DP
  rank (every count up to 8, then every 4th up to max_num_seqs_per_rank, linear between;
  the step is close to affine in the batch there), each request holding the demand's mean
  decode context;
  the mean over a run of steps (EPLB drift and stragglers sampled as the engine would), and
  the KV limit: requests per rank whose context fits the HBM left for KV. The ranks' loads
  spread about the mean (`RankLoads`): the busiest rank sets the per-rank parts, the
  least-loaded whether dual-batch overlap splits.
* `PrefillSpeed`: a DEPn prefill instance's full-budget chunked step for a given mix of
  cached / uncached tokens per request (the engine's scheduling: `max_num_batched_tokens` per
  rank per step, requests back to back) and a step's time as a line in its tokens.
* `ColocatedSpeed`: a colocated instance's mean and busy step over decode requests per rank,
  with the prefill its decoding requests brought mixed into the steps (`ColocatedTable`).

Step models come from `rackSim.perf.build_step_model`, so the screen prices with the same
(calibrated or roofline) model the engine simulates with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import poisson

from rackSim.config.specs import RunConfig, kv_bytes_per_gpu
from rackSim.perf import DecodeBatch, PrefillBatch, StepModel, build_step_model
from rackSim.perf.kv_transfer import push_transfer_ms

#: Passes over the occupancy grid whose steps are averaged (the DP ranks' loads, EPLB and
#: straggler sampling).
DECODE_TABLE_PASSES = 8
#: Step-index stride between table samples (steps): spreads samples over EPLB intervals.
STEP_INDEX_STRIDE = 97
#: Occupancy grid (requests per rank): every value up to this, then every `GRID_STRIDE`.
GRID_DENSE, GRID_STRIDE = 8, 4
#: Bisection steps of a first token's quantiles (2^-40 of the longest wait).
FIRST_TOKEN_BISECTION_STEPS = 40


@dataclass(frozen=True)
class DecodeSpeed:
    """A decode instance `ranks` wide: `step_ms[i]` = mean step at `per_rank[i]` requests per
    rank."""

    ranks: int
    per_rank: np.ndarray
    step_ms: np.ndarray
    max_per_rank: float
    accepted: float
    draft_tokens: int

    def step_at(self, per_rank: np.ndarray | float) -> np.ndarray:
        """Step time (ms) at (fractional) requests per rank, linear between grid points."""
        return np.interp(per_rank, self.per_rank, self.step_ms)


def occupancy_grid(top: int) -> np.ndarray:
    """Requests per rank a table is priced at: every count up to `GRID_DENSE`, then every
    `GRID_STRIDE`th, and `top`."""
    return np.unique(np.concatenate([np.arange(min(GRID_DENSE, top) + 1),
                                     np.arange(GRID_DENSE, top, GRID_STRIDE), [top]]))


class RankLoads:
    """Requests on each DP rank of an instance holding `per_rank` a rank on average, one
    draw per table pass: the ranks' counts independent Poisson (sessions reach ranks
    independently), from uniforms drawn once per instance (`seed`) so that every occupancy
    of the table sees the same draws and the table stays monotone in it. A rank holds at
    most `cap`: what a draw puts beyond it goes, one request at a time, to the first
    least-loaded rank with room (`fill_least_loaded`, the engine's placement), so the
    draws keep their mean up to a full instance (clipped alone, a DEP16 instance at 96 of
    96 a rank averaged 92: steps 2 % short). A TP instance (one rank) holds the mean.
    Measured against the engine (DeepSeek-V3 on GB200, DEP16, 10.65 requests a rank, 35.9K
    tokens each): steps of 54.6 ms mean and 57.9 ms P90 over such draws, the simulation's
    54.6 and 58.4; every rank at the mean, 47.9 ms. The spread sets the busiest rank's
    attention and whether dual-batch overlap splits (one rank under its threshold vetoes it;
    the engine's least-loaded placement keeps its least-loaded rank about one request
    higher than Poisson, so overlap splits somewhat more there)."""

    def __init__(self, ranks: int, cap: int, seed: int):
        self.ranks, self.cap = ranks, cap
        self._u = np.random.default_rng(seed).random((DECODE_TABLE_PASSES, ranks))
        self._by_mean: dict[float, list[list[int]]] = {}

    def draw(self, per_rank: float, k: int) -> list[int]:
        """Pass `k`'s requests per rank at `per_rank` on average."""
        if self.ranks == 1:
            return [int(round(per_rank))]
        got = self._by_mean.get(per_rank)
        if got is None:
            drawn = poisson.ppf(self._u, max(per_rank, 1e-12)).astype(int)
            held = np.minimum(drawn, self.cap)
            got = self._by_mean[per_rank] = [
                fill_least_loaded(row, int(beyond), self.cap).tolist()
                for row, beyond in zip(held, (drawn - held).sum(axis=1), strict=True)]
        return got[k]


def fill_least_loaded(loads: np.ndarray, extra: int, cap: int) -> np.ndarray:
    """`loads` (requests per rank) after `extra` more requests, each placed on the first
    least-loaded rank below `cap` (those beyond every rank's room are dropped): all ranks
    under a level L are raised to it, then the first ranks at L get one more."""
    out = np.array(loads, dtype=int)
    extra = min(extra, int((cap - out).sum()))
    if extra <= 0:
        return out
    lo, hi = int(out.min()), cap  # the highest level `extra` requests fill up to
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.maximum(mid - out, 0).sum()) <= extra:
            lo = mid
        else:
            hi = mid - 1
    rest = extra - int(np.maximum(lo - out, 0).sum())
    out = np.maximum(out, lo)
    out[np.flatnonzero(out == lo)[:rest]] += 1
    return out


def decode_speed(cfg: RunConfig, context_tokens: float) -> DecodeSpeed:
    """Tabulate `cfg`'s decode instance with every request holding `context_tokens`, each
    entry the mean step over its passes' rank loads (`RankLoads`)."""
    d = cfg.deployment.decode
    model = build_step_model(cfg, "decode", seed=cfg.seed)
    ranks = d.gpus if d.parallelism == "DEP" else 1
    spec = d.speculative
    top = d.max_num_seqs_per_rank
    grid = occupancy_grid(top)
    loads = RankLoads(ranks, top, cfg.seed)
    total = np.zeros(len(grid))
    step = 0
    for k in range(DECODE_TABLE_PASSES):
        for j, i in enumerate(grid):
            step += STEP_INDEX_STRIDE
            reqs = loads.draw(float(i), k)
            batch = DecodeBatch(reqs, [r * context_tokens for r in reqs],
                                spec.accepted_tokens_per_step, spec.num_draft_tokens, 0, 0,
                                step)
            total[j] += model.decode_step(batch).total_ms
    kv_tokens = kv_bytes_per_gpu(cfg, d.gpus) * (d.gpus / ranks) / cfg.model.kv_bytes_per_token
    return DecodeSpeed(ranks=ranks, per_rank=grid.astype(float),
                       step_ms=total / DECODE_TABLE_PASSES,
                       max_per_rank=float(min(d.max_num_seqs_per_rank,
                                              kv_tokens / context_tokens)),
                       accepted=spec.accepted_tokens_per_step, draft_tokens=spec.num_draft_tokens)


class PrefillSpeed:
    """A prefill instance of `cfg` (its width, token budget, cache, KV push link)."""

    def __init__(self, cfg: RunConfig):
        d, m, hw = cfg.deployment, cfg.model, cfg.hardware
        p = d.prefill
        self.gpus = p.gpus_per_instance
        self.budget = p.max_num_batched_tokens * p.gpus_per_instance
        self.max_seqs = p.max_num_seqs
        self.model: StepModel = build_step_model(cfg, "prefill", seed=cfg.seed)
        host = hw.host_mem_bytes_per_gpu if d.cache.host_offload else 0.0
        #: prefix-cache capacity of one instance, HBM + host tier (tokens)
        self.cache_tokens = (kv_bytes_per_gpu(cfg, self.gpus) + host) * self.gpus \
            / m.kv_bytes_per_token
        self._kv_bytes_per_token = m.kv_bytes_per_token
        t = d.kv_transfer
        self._push_bytes_s = t.efficiency * hw.nvlink_bw_bytes_s * self.gpus
        self._push_latency_ms = t.latency_ms
        self._memo: dict[tuple[int, int], tuple[float, float]] = {}

    def _step_ms(self, new: float, attended: float, requests: int, admitted: float) -> float:
        batch = PrefillBatch(new_tokens=int(new), attended_tokens=int(attended),
                             num_requests=requests, admitted_prompt_tokens=int(admitted),
                             ranks=self.gpus)
        return self.model.prefill_step(batch).total_ms

    def rate(self, prompt: float, uncached: float) -> tuple[float, float]:
        """(uncached tokens/s at a full budget, ms of one full step) for requests of `prompt`
        tokens of which `uncached` are computed."""
        key = (round(prompt, -2), round(max(uncached, 1.0), -1))
        got = self._memo.get(key)
        if got is None:
            u = max(uncached, 1.0)
            if u <= self.budget:
                k = min(self.budget / u, self.max_seqs)
                new = k * u
                ms = self._step_ms(new, k * prompt, max(1, round(k)), k * prompt)
            else:  # one request's chunk fills the step; its earlier chunks are context
                new = self.budget
                before = prompt - u + (u - new) / 2
                ms = self._step_ms(new, before + new, 1, prompt / math.ceil(u / new))
            got = self._memo[key] = (new / ms * 1e3, ms)
        return got

    def affine(self, prompt: float, uncached: float) -> tuple[float, float]:
        """(fixed ms, ms per uncached token) of a step as a line through two steps of the mix
        of `prompt`-token requests with `uncached` computed: the full-budget step (`rate`) and
        one request's chunk of at most half the budget. A prefill step is close to affine in
        its tokens at a given mix: at the mean step of GB300 DEP2 and DEP4 instances the line
        is within 1 % of a least-squares line through their simulated steps (docs/planner.md)."""
        per_s, full_ms = self.rate(prompt, uncached)
        full = per_s * full_ms / 1e3
        u = max(uncached, 1.0)
        x = min(u, self.budget / 2)
        one_ms = self._step_ms(x, prompt - u + x, 1, prompt)
        if full - x < 1.0:  # one request fills every step (max_num_seqs 1): no line
            return 0.0, full_ms / full
        per_token = (full_ms - one_ms) / (full - x)
        return one_ms - per_token * x, per_token

    def push_ms(self, prompt: float) -> float:
        """KV of a `prompt`-token request pushed to decode over NVLink (ms)."""
        return push_transfer_ms(prompt * self._kv_bytes_per_token, self._push_bytes_s,
                                self._push_latency_ms)


def busy_share(chunks_per_step: float, idle_ms: float, busy_ms: float) -> float:
    """The share p of a colocated instance's steps that carry prefill, when `chunks_per_step`
    prompt chunks arrive per step on average (Little over the decode steps: fixed whatever
    the steps last) and arrive in time, during a step, for the next one.

    Arrivals come at Lambda = x / T per ms (x chunks per step, T = p b + (1 - p) i the mean
    step), so a step follows a busy one with prefill with probability A = 1 - exp(-Lambda b)
    and an idle one with B = 1 - exp(-Lambda i); the chain's stationary share p = B / (1 - A
    + B) (solved for p by bisection: the right side falls as p rises). Steps of one length
    give 1 - exp(-x), the steps' count independent; a busy step ~8x an idle one (a colocated
    instance's long prompts) makes busy steps follow busy steps and carry several arrivals,
    so fewer steps are busy (GB200 DEP8, x = 0.096: 0.085 where independence says 0.091;
    the simulation, 0.082)."""
    if chunks_per_step <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(50):
        p = (lo + hi) / 2
        rate = chunks_per_step / (p * busy_ms + (1 - p) * idle_ms)
        a, b = -math.expm1(-rate * busy_ms), -math.expm1(-rate * idle_ms)
        lo, hi = (p, hi) if b / (1 - a + b) > p else (lo, p)
    return (lo + hi) / 2


@dataclass(frozen=True)
class ColocatedTable:
    """A colocated instance's steps at one prefill load, at `per_rank[i]` decode requests per
    rank: `idle_ms[i]` a step without prefill, `busy_ms[i]` one whose busiest rank computes a
    chunk of `chunk[i]` tokens (the mean request's, at most the free budget), `small_ms[i]`
    one whose chunk is a single token; `busy_share[i]` the share of steps that carry prefill.
    The step is close to affine in the chunk between the two (the DeepSeek-V4.1 GB200 DEP8
    step at 1.25 requests a rank and 41K-token prompts, a request of that many uncached
    tokens: 14.2 ms at 1, 34.7 at 1,000, 59.1 at 2,288, 166 at 8,000; idle 7.1)."""

    per_rank: np.ndarray
    idle_ms: np.ndarray
    busy_ms: np.ndarray
    small_ms: np.ndarray
    chunk: np.ndarray
    busy_share: np.ndarray

    def step_at(self, per_rank: np.ndarray | float) -> np.ndarray:
        """The mean step (ms): busy and idle steps by their share."""
        share = self.share_at(per_rank)
        return share * self.busy_at(per_rank) + (1 - share) * self.idle_at(per_rank)

    def idle_at(self, per_rank: np.ndarray | float) -> np.ndarray:
        return np.interp(per_rank, self.per_rank, self.idle_ms)

    def busy_at(self, per_rank: np.ndarray | float, chunk: np.ndarray | None = None
                ) -> np.ndarray:
        """A step carrying prefill (ms): the mean request's chunk, or a `chunk`-token one
        (affine between a single token and the mean chunk)."""
        busy = np.interp(per_rank, self.per_rank, self.busy_ms)
        if chunk is None:
            return busy
        small = np.interp(per_rank, self.per_rank, self.small_ms)
        mean_chunk = np.interp(per_rank, self.per_rank, self.chunk)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.where(mean_chunk > 1, (busy - small) / (mean_chunk - 1), 0.0)
        return small + slope * (np.maximum(chunk, 1.0) - 1)

    def share_at(self, per_rank: np.ndarray | float) -> np.ndarray:
        return np.interp(per_rank, self.per_rank, self.busy_share)

    def first_token_ms(self, per_rank: np.ndarray, prompts: np.ndarray, free: np.ndarray,
                       quantiles: Sequence[float] = ()) -> list[np.ndarray]:
        """The mean time (ms) from a prompt's arrival at a rank with no other prompt to its
        first token, then its `quantiles`: the rest of the step in progress, then the
        prompt's own chunks' steps.

        Row i at `per_rank[i]` requests per rank; `prompts[i]` are equally likely uncached
        prompts, each computed in chunks of at most `free[i]` tokens (full ones, then the
        rest), one step each; a busy step's chunk is drawn by the steps the prompts take,
        and a share `share_at` of the steps is busy, the others idle. The step in progress
        is length-biased: its rest R has P(R > r) = E[(T - r)+] / E[T] (mean E[T^2] /
        2 E[T]), independent of the prompt's own steps O, so P(R + O > t) is the prompts'
        mean of P(R > t - O)."""
        n, room = np.asarray(per_rank, dtype=float), np.maximum(np.asarray(free), 1.0)
        steps = np.ceil(np.maximum(prompts, 1.0) / room[:, None])   # (rows, prompts)
        rest = self.busy_at(n[:, None], prompts - (steps - 1) * room[:, None])
        full = self.busy_at(n, room)[:, None]
        own = (steps - 1) * full + rest
        chunk_steps = steps.sum(axis=1)                   # each of them equally likely busy
        s, idle = self.share_at(n), self.idle_at(n)
        mean_t = s * own.sum(axis=1) / chunk_steps + (1 - s) * idle
        busy_sq = ((steps - 1) * full ** 2 + rest ** 2).sum(axis=1) / chunk_steps
        out = [(s * busy_sq + (1 - s) * idle ** 2) / (2 * mean_t) + own.mean(axis=1)]
        if not quantiles:
            return out
        st3, per3 = steps[:, None, :], chunk_steps[:, None]
        s2, idle2, mean2 = s[:, None], idle[:, None], mean_t[:, None]

        def beyond(t: np.ndarray) -> np.ndarray:
            """P(R + O > t) per row."""
            r = t[:, None] - own                              # (rows, prompts)
            x = np.maximum(r, 0.0)[:, :, None]
            busy = ((st3 - 1) * np.maximum(full[:, :, None] - x, 0.0)
                    + np.maximum(rest[:, None, :] - x, 0.0)).sum(axis=2) / per3
            tail = (s2 * busy + (1 - s2) * np.maximum(idle2 - x[:, :, 0], 0.0)) / mean2
            return np.where(r < 0, 1.0, tail).mean(axis=1)

        top = own.max(axis=1) + np.maximum(np.maximum(rest.max(axis=1), full[:, 0]), idle)
        for q in quantiles:
            lo, hi = np.zeros(len(n)), top
            for _ in range(FIRST_TOKEN_BISECTION_STEPS):
                t = (lo + hi) / 2
                past = beyond(t) > 1 - q
                lo, hi = np.where(past, t, lo), np.where(past, hi, t)
            out.append((lo + hi) / 2)
        return out


class ColocatedSpeed:
    """A colocated instance of `cfg` (`deployment.colocated`), each decoding request holding
    `context_tokens` and staying `decode_steps` steps.

    At n decoding requests per rank, prefill arrives at p = n E[u] / decode_steps tokens per
    rank per step (each request brings E[u] uncached tokens once). A rank computes prompts in
    chunks of at most `free(n) = budget - n (1 + draft tokens)` tokens, so a rank with prefill
    work puts a chunk of c = min(E[u], free) into a step, s = p / c chunks per rank per step;
    a step carries prefill when any rank's does, a share `busy_share` of ranks x s chunks a
    step (busy steps last longer, so more arrive during them), and then its busiest rank's
    chunk sets the per-rank parts (`StepModel.mixed_step`). The decode
    requests per rank are drawn as a decode instance's (`RankLoads`). Steps are tabulated
    idle, with the mean request's chunk and with a one-token request's (`ColocatedTable`)."""

    def __init__(self, cfg: RunConfig, context_tokens: float, decode_steps: float):
        d, m, hw = cfg.deployment, cfg.model, cfg.hardware
        col = d.colocated
        self.gpus = col.gpus
        self.ranks = col.gpus if col.parallelism == "DEP" else 1
        spec = col.speculative
        self.accepted, self.draft_tokens = spec.accepted_tokens_per_step, spec.num_draft_tokens
        self.budget = col.max_num_batched_tokens
        self.model: StepModel = build_step_model(cfg, "colocated", seed=cfg.seed)
        host = hw.host_mem_bytes_per_gpu if d.cache.host_offload else 0.0
        kv = kv_bytes_per_gpu(cfg, col.gpus)
        #: prefix-cache capacity of one instance over its ranks, HBM + host tier (tokens)
        self.cache_tokens = (kv + host) * col.gpus / m.kv_bytes_per_token
        kv_rank = kv * (col.gpus / self.ranks) / m.kv_bytes_per_token
        q = 1 + self.draft_tokens
        #: decoding requests per rank at most: a slot stays for the prompt being computed, the
        #: KV holds every context, the budget leaves room for prefill
        self.max_per_rank = float(min(col.max_num_seqs_per_rank - 1, kv_rank / context_tokens,
                                      (self.budget - 1) / q))
        self.context, self.decode_steps = context_tokens, decode_steps
        self._tables: dict[tuple[int, int], ColocatedTable] = {}
        self._loads = RankLoads(self.ranks, col.max_num_seqs_per_rank, cfg.seed)

    def free(self, per_rank: np.ndarray | float) -> np.ndarray:
        """Prefill tokens a rank's step has room for beside its decode tokens."""
        return self.budget - np.asarray(per_rank) * (1 + self.draft_tokens)

    def _step_ms(self, n: float, tokens: float, busiest: float, requests: int, prompt: float,
                 uncached: float, step: int, k: int) -> float:
        """A step at `n` decode requests per rank on average (pass `k`'s rank loads) with
        `tokens` prefill tokens, `busiest` of them on one rank (ms)."""
        cached = max(prompt - uncached, 0.0)
        prefill = PrefillBatch(new_tokens=int(tokens), attended_tokens=int(tokens + requests
                                                                           * cached),
                               num_requests=requests,
                               admitted_prompt_tokens=int(requests * prompt
                                                          * min(busiest / uncached, 1.0)),
                               ranks=self.ranks, busiest_rank_tokens=int(busiest))
        reqs = self._loads.draw(n, k)
        decode = DecodeBatch(reqs, [r * self.context for r in reqs], self.accepted,
                             self.draft_tokens, 0, 0, step)
        return self.model.mixed_step(prefill, decode).total_ms

    def table(self, prompt: float, uncached: float) -> ColocatedTable:
        """The steps at requests of `prompt` tokens of which `uncached` are computed."""
        key = (round(prompt, -2), round(max(uncached, 1.0), -1))
        got = self._tables.get(key)
        if got is not None:
            return got
        u = max(uncached, 1.0)
        top = max(int(self.max_per_rank), 1)
        grid = occupancy_grid(top)
        idle, busy, small, chunks, arrivals = (np.zeros(len(grid)) for _ in range(5))
        step = 0
        for j, n in enumerate(grid.astype(float)):
            chunk = float(min(u, self.free(n)))
            s = min(n * u / self.decode_steps / chunk, 1.0)
            # the prefill tokens a busy step carries: ranks with a chunk, counted independently
            any_busy = 1.0 - (1.0 - s) ** self.ranks
            tokens = max(self.ranks * s * chunk / any_busy, chunk) if any_busy > 0 else 0.0
            requests = max(1, round(tokens / chunk)) if tokens else 0
            for k in range(DECODE_TABLE_PASSES):
                step += STEP_INDEX_STRIDE
                busy[j] += self._step_ms(n, tokens or chunk, chunk, max(requests, 1), prompt, u,
                                         step, k)
                small[j] += self._step_ms(n, 1, 1, 1, prompt, 1.0, step, k)
                idle[j] += self._step_ms(n, 0, 0, 0, prompt, u, step, k)
            chunks[j], arrivals[j] = chunk, self.ranks * s
        idle, busy, small = (x / DECODE_TABLE_PASSES for x in (idle, busy, small))
        share = np.array([busy_share(x, i, b) for x, i, b in zip(arrivals, idle, busy,
                                                                  strict=True)])
        got = self._tables[key] = ColocatedTable(grid.astype(float), idle, busy, small, chunks,
                                                 share)
        return got
