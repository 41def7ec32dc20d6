"""Weighted log-binned histograms: percentiles of inter-token latency without per-token events."""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import add

import numpy as np


class LatencyHistogram:
    """Token-weighted latency histogram over log-spaced bins (ms).

    A decode step of duration T emitting k tokens to a request adds weight k at T / k. Bins are
    1% wide (relative), from `lo_ms` to `hi_ms`; percentiles interpolate inside a bin, so they
    are exact to within 1%.
    """

    def __init__(self, lo_ms: float = 1e-3, hi_ms: float = 1e6, rel_width: float = 0.01):
        self.lo = lo_ms
        self.log_step = math.log1p(rel_width)
        self.n = int(math.ceil(math.log(hi_ms / lo_ms) / self.log_step)) + 1
        self._w = [0.0] * self.n  # a list: one scalar add per decode step is cheaper on it
        self._log_lo = math.log(lo_ms)

    @classmethod
    def merged(cls, hists: Iterable[LatencyHistogram]) -> LatencyHistogram:
        """One histogram holding the weights of `hists` (same bins), e.g. a fleet's from its
        decode instances'."""
        out = cls()
        for h in hists:
            out._w = list(map(add, out._w, h._w))
        return out

    @property
    def weights(self) -> np.ndarray:
        """Weight (tokens) per bin."""
        return np.array(self._w)

    def add(self, ms: float, weight: float = 1.0) -> None:
        """Add `weight` at `ms` (one call per decode step: its bin is computed inline)."""
        i = 0 if ms <= self.lo else min(int((math.log(ms) - self._log_lo) / self.log_step),
                                        self.n - 1)
        self._w[i] += weight

    def add_many(self, ms: np.ndarray, weights: np.ndarray | None = None) -> None:
        ms = np.asarray(ms, dtype=float)
        idx = np.clip(((np.log(np.maximum(ms, self.lo)) - self._log_lo) / self.log_step)
                      .astype(int), 0, self.n - 1)
        w = self.weights
        np.add.at(w, idx, 1.0 if weights is None else weights)
        self._w = w.tolist()

    @property
    def total(self) -> float:
        return float(self.weights.sum())

    def edges(self) -> np.ndarray:
        return np.exp(self._log_lo + self.log_step * np.arange(self.n + 1))

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100) in ms; NaN when empty."""
        w = self.weights
        total = float(w.sum())
        if total <= 0:
            return float("nan")
        cum = np.cumsum(w)
        target = q / 100.0 * total
        i = int(np.searchsorted(cum, target))
        i = min(i, self.n - 1)
        below = cum[i - 1] if i else 0.0
        frac = (target - below) / w[i] if w[i] > 0 else 0.0
        e = self.edges()
        return float(e[i] * (e[i + 1] / e[i]) ** frac)

    def mean(self) -> float:
        total = self.total
        if total <= 0:
            return float("nan")
        e = self.edges()
        mids = np.sqrt(e[:-1] * e[1:])
        return float((mids * self.weights).sum() / total)
