"""CPU-side costs: step scheduling, prompt admission, and stragglers at rank synchronisation.

Stragglers. Every synchronisation point of a step (each layer in eager prefill; the CUDA-graph
replay boundary in decode) waits for the slowest rank. Each rank arrives after a CPU jitter
X ~ Exponential(mean `jitter_ms`); a *lagged* rank arrives `lag_ms` later still. The delay a
sync point adds is max over ranks, and a step adds the sum over its sync points. The sum is
drawn from a normal with the exact mean and variance of that sum (CLT over sync points), so a
step costs one random draw whatever the rank count.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np


def admission_ms(prompt_tokens: float, ns_per_token: float) -> float:
    """CPU time to admit prompts of `prompt_tokens` tokens in all (ms): buffer building and
    copying grow linearly with prompt length."""
    return max(prompt_tokens, 0.0) * ns_per_token * 1e-6


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
        m, v = max_delay_moments(self.ranks, self.jitter_ms, self.lag_ms, self.lagged)
        self.mean_ms = self.sync_points * m
        self.std_ms = math.sqrt(self.sync_points * v)
        self._rng = random.Random(self.seed)

    def expected_ms(self) -> float:
        """Expected straggler delay per step (ms)."""
        return self.mean_ms

    def sample_ms(self) -> float:
        """One step's straggler delay (ms), never negative."""
        if self.std_ms <= 0.0:
            return self.mean_ms
        return max(0.0, self._rng.gauss(self.mean_ms, self.std_ms))
