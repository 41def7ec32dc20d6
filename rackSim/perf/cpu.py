"""CPU-side costs: step scheduling, prompt admission, and stragglers at rank synchronisation.

Scheduling and admission. With data-parallel attention every DP rank runs its own engine core
(scheduler) and worker, so the CPU work of a step - the per-step scheduling plus admitting the
requests placed on that rank (prompt-token copies (C2), per-request bookkeeping, per-block
allocation) - is per rank. vLLM's async scheduling prepares step k+1 on the CPU while the GPU
runs step k, so a rank's CPU work up to the GPU step is hidden and only the excess delays the
step; every layer synchronises the ranks (C3), so the instance waits for the rank with the
largest excess (`exposed_cpu_ms`).

Stragglers. Every synchronisation point of a step (each layer in eager prefill; the CUDA-graph
replay boundary in decode) waits for the slowest rank. Each rank arrives after a CPU jitter
X ~ Exponential(mean `jitter_ms`); a *lagged* rank's CPU is `lag_ms` late per sync point, but
its launch queue lets it run ahead of its GPU, so only the part of the lag beyond
`absorb` x (GPU time between sync points) shows (`exposed_lag_ms`). The delay a sync point adds
is max over ranks, and a step adds the sum over its sync points. The sum is drawn from a normal
with the exact mean and variance of that sum (CLT over sync points), so a step costs one random
draw whatever the rank count.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


def admission_ms(prompt_tokens: float, ns_per_token: float) -> float:
    """CPU time to admit prompts of `prompt_tokens` tokens in all (ms): buffer building and
    copying grow linearly with prompt length."""
    return max(prompt_tokens, 0.0) * ns_per_token * 1e-6


def rank_admission_ms(requests: int, prompt_tokens: float, blocks: int, ns_per_token: float,
                      us_per_request: float, us_per_block: float) -> float:
    """CPU time of one DP rank's scheduler to admit `requests` requests of `prompt_tokens`
    prompt tokens in all, taking over `blocks` received KV blocks (ms)."""
    return (admission_ms(prompt_tokens, ns_per_token)
            + (requests * us_per_request + blocks * us_per_block) * 1e-3)


def exposed_cpu_ms(step_ms: float, rank_admissions: Iterable[tuple[int, float, int]],
                   overlap_ms: float, ns_per_token: float, us_per_request: float,
                   us_per_block: float) -> float:
    """CPU time a step exposes (ms): `step_ms` of per-step scheduling that shows whatever the
    batch (the calibrated residual, fitted to steps without admissions) plus, over the DP
    ranks, the largest excess of a rank's admission work (one (requests, prompt tokens,
    blocks) entry per admitting rank) over the `overlap_ms` of GPU time async scheduling hides
    it behind::

        exposed = step_ms + max over ranks r of max(0, admission_r - overlap_ms)
    """
    if not rank_admissions:  # the usual decode step: nothing admitted
        return step_ms + max(0.0, 0.0 - overlap_ms)
    worst = max((rank_admission_ms(n, tokens, blocks, ns_per_token, us_per_request,
                                   us_per_block)
                 for n, tokens, blocks in rank_admissions), default=0.0)
    return step_ms + max(0.0, worst - overlap_ms)


def exposed_lag_ms(lag_ms: float, absorb: float, gpu_ms_per_sync: float) -> float:
    """Lag a lagged rank adds at a sync point once its run-ahead of `absorb` x the GPU time
    between sync points has hidden what it can (ms)."""
    return max(0.0, lag_ms - absorb * gpu_ms_per_sync)


def max_delay_moments(ranks: int, jitter_ms: float, lag_ms: float = 0.0,
                      lagged: int = 0) -> tuple[float, float]:
    """Mean and variance (ms, ms^2) of max over `ranks` arrival delays at one sync point.

    `ranks - lagged` ranks have X ~ Exp(jitter_ms); `lagged` ranks have lag_ms + X.
    Integrates the survival function of the maximum on a grid.
    """
    if ranks <= 1 and lagged == 0:
        return jitter_ms, jitter_ms ** 2
    mu = max(jitter_ms, 1e-9)
    top = lag_ms + mu * (math.log(max(ranks, 2)) + 40.0)
    t = np.linspace(0.0, top, 20001)
    cdf = (1.0 - np.exp(-t / mu)) ** (ranks - lagged)
    if lagged:
        shifted = np.clip(t - lag_ms, 0.0, None)
        cdf = cdf * np.where(t >= lag_ms, 1.0 - np.exp(-shifted / mu), 0.0) ** lagged
    surv = 1.0 - cdf
    mean = float(np.trapezoid(surv, t))
    second = float(np.trapezoid(2.0 * t * surv, t))
    return mean, max(second - mean * mean, 0.0)


@dataclass
class StragglerModel:
    """Seeded per-step straggler delay for one instance of `ranks` ranks.

    jitter_ms: mean CPU arrival jitter per rank per sync point (ms).
    sync_points: sync points per step.
    lag_ms / lagged: extra lag of each lagged rank per sync point, and how many are lagged.
    """

    ranks: int
    jitter_ms: float
    sync_points: int
    lag_ms: float = 0.0
    lagged: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        self._moments: dict[float, tuple[float, float]] = {}
        self.mean_ms, self.std_ms = self._step_moments(self.lag_ms)
        self._rng = random.Random(self.seed)

    def _step_moments(self, lag_ms: float) -> tuple[float, float]:
        """(mean, std) of a step's delay for a per-sync-point lag (cached by lag)."""
        # 4 significant digits: steps of similar length share one integration
        key = float(f"{lag_ms:.4g}") if self.lagged else 0.0
        got = self._moments.get(key)
        if got is None:
            m, v = max_delay_moments(self.ranks, self.jitter_ms, key, self.lagged)
            got = (self.sync_points * m, math.sqrt(self.sync_points * v))
            if len(self._moments) > 10_000:
                self._moments.clear()
            self._moments[key] = got
        return got

    def draw(self, lag_ms: float | None = None) -> tuple[float, float]:
        """(expected, sampled) straggler delay of one step (ms), from one moments lookup
        (none without lagged ranks: the moments are then those of every step)."""
        if self.lagged:
            mean, std = self._step_moments(self.lag_ms if lag_ms is None else lag_ms)
        else:
            mean, std = self.mean_ms, self.std_ms
        if std <= 0.0:
            return mean, mean
        return mean, max(0.0, self._rng.gauss(mean, std))
