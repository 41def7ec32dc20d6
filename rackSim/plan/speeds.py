"""Instance speeds the screen reads, priced once per (hardware, role, width) by `perf/`.

* `DecodeSpeed`: the step time of a DEPn decode instance as a table over requests per DP
  rank (every count up to 8, then every 4th up to max_num_seqs_per_rank, linear between;
  the step is close to affine in the batch there), each request holding the demand's mean
  decode context;
  the mean over a run of steps (EPLB drift and stragglers sampled as the engine would), and
  the KV limit: requests per rank whose context fits the HBM left for KV.
* `PrefillSpeed`: a DEPn prefill instance's full-budget chunked step for a given mix of
  cached / uncached tokens per request (the engine's scheduling: `max_num_batched_tokens` per
  rank per step, requests back to back) and the time of one request's own chunks.

Step models come from `rackSim.perf.build_step_model`, so the screen prices with the same
(calibrated or roofline) model the engine simulates with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rackSim.config.specs import RunConfig, kv_bytes_per_gpu
from rackSim.perf import DecodeBatch, PrefillBatch, StepModel, build_step_model
from rackSim.perf.kv_transfer import push_transfer_ms

#: Passes over the occupancy grid whose steps are averaged (EPLB and straggler sampling).
DECODE_TABLE_PASSES = 4
#: Step-index stride between table samples (steps): spreads samples over EPLB intervals.
STEP_INDEX_STRIDE = 97
#: Occupancy grid (requests per rank): every value up to this, then every `GRID_STRIDE`.
GRID_DENSE, GRID_STRIDE = 8, 4


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


def decode_speed(cfg: RunConfig, context_tokens: float) -> DecodeSpeed:
    """Tabulate `cfg`'s decode instance with every request holding `context_tokens`."""
    d = cfg.deployment.decode
    model = build_step_model(cfg, "decode", seed=cfg.seed)
    ranks = d.gpus if d.parallelism == "DEP" else 1
    spec = d.speculative
    top = d.max_num_seqs_per_rank
    grid = np.unique(np.concatenate([np.arange(min(GRID_DENSE, top) + 1),
                                     np.arange(GRID_DENSE, top, GRID_STRIDE), [top]]))
    total = np.zeros(len(grid))
    step = 0
    for _ in range(DECODE_TABLE_PASSES):
        for j, i in enumerate(grid):
            step += STEP_INDEX_STRIDE
            batch = DecodeBatch([int(i)] * ranks, [float(i) * context_tokens] * ranks,
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

    def own_ms(self, prompt: float, uncached: float) -> float:
        """A request computed alone: its chunks one after another (ms)."""
        u = max(uncached, 1.0)
        chunks = math.ceil(u / self.budget)
        new = u / chunks
        cached = prompt - u
        return sum(self._step_ms(new, cached + new * (j + 1), 1, prompt if j == 0 else 0)
                   for j in range(chunks))

    def push_ms(self, prompt: float) -> float:
        """KV of a `prompt`-token request pushed to decode over NVLink (ms)."""
        return push_transfer_ms(prompt * self._kv_bytes_per_token, self._push_bytes_s,
                                self._push_latency_ms)
