"""Expert-parallel load balancing (EPLB): drifting expert popularity, placement, balancedness.

Popularity. Each (layer, expert) has a log-popularity g + x: g is shared by a contiguous group of
experts (group-limited routing makes neighbouring experts hot together; stationary, standard
deviation `sigma_group`, `groups` groups) and x is the expert's own part, an Ornstein-Uhlenbeck
process with standard deviation `sigma` and correlation time `drift_steps` decode steps;
popularity = exp(g + x) normalised per layer. It is advanced once per `epoch_steps` steps
(the skew drifts slowly relative to a step, so per-step updates would only cost time).

Placement. Without EPLB, expert e sits on rank e // (experts / ranks). With EPLB, every
`interval_steps` the state rebuilds the placement from the mean load of the last `window_steps`
steps: the `redundant` hottest experts get extra replicas (load split over replicas), then
replicas are packed greedily, hottest first, onto the least-loaded rank with a free slot
(each rank holds (experts + redundant) / ranks slots per layer).

Balancedness = sum over layers of mean rank load / sum over layers of max rank load (vLLM's
definition), in (0, 1]. It is of *expected* loads under the current popularity.

Rearrangement cost: the rank receiving most new expert weights copies them over NVLink while
decode continues; its duration is `moved_bytes / nvlink_bytes_ms`, and the copies' HBM traffic
(read + write) is charged to the MoE time of the steps it overlaps.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class EplbConfig:
    layers: int
    experts: int
    ranks: int
    sigma: float
    drift_steps: float
    sigma_group: float = 0.0
    groups: int = 1
    enabled: bool = True
    redundant: int = 0
    interval_steps: int = 3000
    window_steps: int = 1000
    epoch_steps: int = 100
    expert_bytes: float = 0.0


def contiguous_placement(layers: int, experts: int, ranks: int) -> np.ndarray:
    """rank of each expert, (layers, experts): expert e on rank e // (experts / ranks)."""
    per = experts // ranks
    return np.broadcast_to(np.arange(experts) // per, (layers, experts)).copy()


def balanced_placement(load: np.ndarray, ranks: int, redundant: int = 0
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Replicate hot experts and pack replicas onto ranks.

    load: (layers, experts) expected load. Returns (expert_of_slot, rank_of_slot), both
    (layers, experts + redundant).
    """
    layers, experts = load.shape
    slots = experts + redundant
    if slots % ranks:
        raise ValueError(f"{slots} expert slots cannot be spread evenly over {ranks} ranks")
    rows = np.arange(layers)
    replicas = np.ones((layers, experts))
    for _ in range(redundant):
        hot = np.argmax(load / replicas, axis=1)
        replicas[rows, hot] += 1
    expert_of_slot = np.concatenate(
        [np.repeat(np.arange(experts)[None, :], 1, 0).repeat(layers, 0),
         np.zeros((layers, redundant), dtype=int)], axis=1)
    if redundant:
        for layer in range(layers):
            extra = np.repeat(np.arange(experts), (replicas[layer] - 1).astype(int))
            expert_of_slot[layer, experts:] = extra
    slot_load = np.take_along_axis(load / replicas, expert_of_slot, axis=1)
    order = np.argsort(-slot_load, axis=1, kind="stable")
    cap = slots // ranks
    rank_load = np.zeros((layers, ranks))
    rank_free = np.full((layers, ranks), cap)
    rank_of_slot = np.zeros((layers, slots), dtype=int)
    for j in range(slots):
        s = order[:, j]
        masked = np.where(rank_free > 0, rank_load, np.inf)
        r = np.argmin(masked, axis=1)
        rank_of_slot[rows, s] = r
        rank_load[rows, r] += slot_load[rows, s]
        rank_free[rows, r] -= 1
    return expert_of_slot, rank_of_slot


def replica_counts(expert_of_slot: np.ndarray, experts: int) -> np.ndarray:
    """Replicas of each expert, (layers, experts)."""
    layers = expert_of_slot.shape[0]
    idx = (np.arange(layers)[:, None] * experts + expert_of_slot).ravel()
    return np.bincount(idx, minlength=layers * experts).reshape(layers, experts).astype(float)


def balancedness_of(load: np.ndarray, expert_of_slot: np.ndarray, rank_of_slot: np.ndarray,
                    ranks: int, counts: np.ndarray | None = None) -> float:
    """sum_l mean_r load / sum_l max_r load for a placement (replica load split evenly)."""
    layers, experts = load.shape
    if counts is None:
        counts = replica_counts(expert_of_slot, experts)
    slot_load = np.take_along_axis(load / counts, expert_of_slot, axis=1)
    idx = (np.arange(layers)[:, None] * ranks + rank_of_slot).ravel()
    per_rank = np.bincount(idx, weights=slot_load.ravel(), minlength=layers * ranks)
    per_rank = per_rank.reshape(layers, ranks)
    return float(per_rank.mean(axis=1).sum() / per_rank.max(axis=1).sum())


class EplbState:
    """Expert load of one model (target or draft) on one instance, advanced with its steps."""

    def __init__(self, cfg: EplbConfig, seed: int = 0):
        self.cfg = cfg
        self._rng = np.random.default_rng(seed)
        shape = (cfg.layers, cfg.experts)
        self._x = self._rng.standard_normal(shape) * cfg.sigma
        group = np.arange(cfg.experts) * cfg.groups // cfg.experts
        self._g = (self._rng.standard_normal((cfg.layers, cfg.groups)) * cfg.sigma_group
                   )[:, group]
        self._rho = math.exp(-cfg.epoch_steps / cfg.drift_steps) if cfg.drift_steps > 0 else 0.0
        self._history: deque[np.ndarray] = deque(
            maxlen=max(1, cfg.window_steps // cfg.epoch_steps))
        self._epoch = 0
        self.rearrangements = 0
        self.last_rearrangement_step = -1
        self.last_rebalance_ms = 0.0
        self.last_moved_bytes = 0.0
        load = self.popularity()
        self._history.append(load)
        if cfg.enabled:
            self._eos, self._ros = balanced_placement(load, cfg.ranks, cfg.redundant)
        else:
            self._eos = np.broadcast_to(np.arange(cfg.experts), shape).copy()
            self._ros = contiguous_placement(cfg.layers, cfg.experts, cfg.ranks)
        self._counts = replica_counts(self._eos, cfg.experts)
        self._b = balancedness_of(load, self._eos, self._ros, cfg.ranks, self._counts)

    def popularity(self) -> np.ndarray:
        """Current expected share of routed tokens per (layer, expert); rows sum to 1."""
        x = self._x + self._g
        p = np.exp(x - x.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)

    @property
    def balancedness(self) -> float:
        return self._b

    def advance(self, step_index: int) -> float:
        """Move the state to `step_index` (drift, rearrangements) and return balancedness."""
        target = step_index // self.cfg.epoch_steps
        while self._epoch < target:
            self._epoch += 1
            self._drift()
            load = self.popularity()
            self._history.append(load)
            steps = self._epoch * self.cfg.epoch_steps
            if self.cfg.enabled and steps % self.cfg.interval_steps == 0:
                self._rearrange()
                self.last_rearrangement_step = steps
            self._b = balancedness_of(load, self._eos, self._ros, self.cfg.ranks,
                                      self._counts)
        return self._b

    def _drift(self) -> None:
        c = self.cfg
        noise = self._rng.standard_normal(self._x.shape)
        self._x = self._rho * self._x + math.sqrt(1.0 - self._rho ** 2) * c.sigma * noise

    def _rearrange(self) -> None:
        c = self.cfg
        window = np.mean(np.stack(list(self._history)), axis=0)
        eos, ros = balanced_placement(window, c.ranks, c.redundant)
        # Weights a rank must receive: slots whose expert or rank changed.
        changed = eos != self._eos
        changed |= ros != self._ros
        per_rank = np.bincount(ros[changed], minlength=c.ranks)
        self.last_moved_bytes = float(per_rank.max()) * c.expert_bytes
        self._eos, self._ros = eos, ros
        self._counts = replica_counts(eos, c.experts)
        self.rearrangements += 1

    def rebalance_ms(self, nvlink_bytes_ms: float) -> float:
        """Duration of the last rearrangement's weight copies on the busiest rank (ms)."""
        return self.last_moved_bytes / nvlink_bytes_ms if nvlink_bytes_ms > 0 else 0.0


def mean_balancedness(cfg: EplbConfig, steps: int, seed: int = 0, warmup_steps: int = 0
                      ) -> float:
    """Average balancedness over `steps` steps after `warmup_steps` (one value per epoch)."""
    state = EplbState(cfg, seed=seed)
    state.advance(warmup_steps)
    values = []
    for s in range(warmup_steps + cfg.epoch_steps, warmup_steps + steps + 1, cfg.epoch_steps):
        values.append(state.advance(s))
    return float(np.mean(values)) if values else state.balancedness
