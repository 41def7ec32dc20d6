"""Expert-parallel load balancing (EPLB): drifting expert popularity, placement, balancedness.

Popularity. Each (layer, expert) has a log-popularity g + x: g is shared by a contiguous group of
experts (group-limited routing makes neighbouring experts hot together; stationary, standard
deviation `sigma_group`, `groups` groups) and x is the expert's own part, an Ornstein-Uhlenbeck
process with standard deviation `sigma` and correlation time `drift_steps` decode steps;
popularity = exp(g + x) normalised per layer. It is advanced once per `epoch_steps` steps
(the skew drifts slowly relative to a step, so per-step updates would only cost time).

Placement. Without EPLB, expert e sits on rank e // (experts / ranks). With EPLB, every
`interval_steps` the state rebuilds the placement from the mean load of the last `window_steps`
steps (the loads of the epochs in that window; only those are kept, so a state holds no
history between windows): the `redundant` hottest experts get extra replicas (load split over
replicas), then replicas are packed greedily, hottest first, onto the least-loaded rank with
a free slot (each rank holds (experts + redundant) / ranks slots per layer).

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
    sorted_load = np.take_along_axis(slot_load, order, axis=1).T.copy()  # (slots, layers)
    cap = slots // ranks
    base = rows * ranks
    open_load = np.zeros((layers, ranks))  # load of each rank; +inf once it is full
    flat = open_load.reshape(-1)
    filled = np.zeros(layers * ranks, dtype=int)
    picked = np.empty((slots, layers), dtype=int)  # rank of the j-th hottest slot per layer
    # a rank's load gains +inf with its last free slot (0.0 before: its sums stay exact)
    closing = np.zeros(cap + 1)
    closing[cap] = np.inf
    argmin = open_load.argmin
    for j, slot_load in enumerate(sorted_load):  # one NumPy pass per slot, all layers at once
        r = picked[j] = argmin(axis=1)
        at = base + r
        count = filled[at] + 1
        filled[at] = count
        flat[at] = flat[at] + slot_load + closing[count]
    rank_of_slot = np.empty((layers, slots), dtype=int)
    np.put_along_axis(rank_of_slot, order, picked.T, axis=1)
    return expert_of_slot, rank_of_slot


def replica_counts(expert_of_slot: np.ndarray, experts: int) -> np.ndarray:
    """Replicas of each expert, (layers, experts)."""
    layers = expert_of_slot.shape[0]
    idx = (np.arange(layers)[:, None] * experts + expert_of_slot).ravel()
    return np.bincount(idx, minlength=layers * experts).reshape(layers, experts).astype(float)


class Placement:
    """Where every expert replica sits, with the index arrays its balancedness needs built
    once (a placement changes every few thousand steps; balancedness is read every epoch).

    A fleet holds one per EPLB state (252 in 14 full racks), so it keeps only what is read:
    the slots' experts and ranks in the smallest integer type that holds them (the next
    rearrangement compares them), the replica counts only when an expert has several."""

    __slots__ = ("expert_of_slot", "rank_of_slot", "ranks", "counts", "_gather", "_bins")

    def __init__(self, expert_of_slot: np.ndarray, rank_of_slot: np.ndarray, ranks: int,
                 experts: int):
        layers, slots = expert_of_slot.shape
        self.expert_of_slot = expert_of_slot.astype(np.min_scalar_type(max(experts - 1, 0)))
        self.rank_of_slot = rank_of_slot.astype(np.min_scalar_type(max(ranks - 1, 0)))
        self.ranks = ranks
        rows = np.arange(layers)[:, None]
        identity = slots == experts and bool((expert_of_slot == np.arange(experts)).all())
        # flat (layer, expert) index of each slot and replicas per expert; None when slot s
        # holds expert s
        self._gather = None if identity else (rows * experts + expert_of_slot).ravel()
        self.counts = None if identity else replica_counts(expert_of_slot, experts)
        self._bins = (rows * ranks + rank_of_slot).ravel()

    def balancedness(self, load: np.ndarray) -> float:
        """sum_l mean_r load / sum_l max_r load (replica load split evenly)."""
        if self._gather is None:  # one replica per expert, so counts are all 1
            slot_load = load.ravel()
        else:
            slot_load = (load / self.counts).ravel()[self._gather]
        layers = load.shape[0]
        per_rank = np.bincount(self._bins, weights=slot_load, minlength=layers * self.ranks)
        per_rank = per_rank.reshape(layers, self.ranks)
        return float(per_rank.mean(axis=1).sum() / per_rank.max(axis=1).sum())


class EplbState:
    """Expert load of one model (target or draft) on one instance, advanced with its steps."""

    def __init__(self, cfg: EplbConfig, seed: int = 0):
        self.cfg = cfg
        self._rng = np.random.default_rng(seed)
        shape = (cfg.layers, cfg.experts)
        self._x = self._rng.standard_normal(shape) * cfg.sigma
        g = self._rng.standard_normal((cfg.layers, cfg.groups)) * cfg.sigma_group
        # the group part, (layers, n, 1) against the expert part seen as (layers, n, experts
        # / n): the groups themselves (n = groups) when they are equal and contiguous, as
        # they are when the groups divide the experts, else expert by expert (n = experts);
        # the same sums as a (layers, experts) copy, which 252 states of a fleet would hold
        if cfg.experts % cfg.groups:
            g = g[:, np.arange(cfg.experts) * cfg.groups // cfg.experts]
        self._g = g[:, :, None]
        self._rho = math.exp(-cfg.epoch_steps / cfg.drift_steps) if cfg.drift_steps > 0 else 0.0
        # (epoch, load) of the epochs the next rearrangement averages, oldest first
        self._history: deque[tuple[int, np.ndarray]] = deque()
        self._window_epochs = max(1, cfg.window_steps // cfg.epoch_steps)
        # epochs between rearrangements: they fall on the epochs whose step is a multiple
        # of interval_steps
        self._period = (math.lcm(cfg.epoch_steps, cfg.interval_steps) // cfg.epoch_steps
                        if cfg.enabled else 0)
        self._epoch = 0
        self.rearrangements = 0
        self.last_rearrangement_step = -1
        self.last_moved_bytes = 0.0
        load = self.popularity()
        self._remember(0, load)
        if cfg.enabled:
            eos, ros = balanced_placement(load, cfg.ranks, cfg.redundant)
        else:
            eos = np.broadcast_to(np.arange(cfg.experts), shape).copy()
            ros = contiguous_placement(cfg.layers, cfg.experts, cfg.ranks)
        self._placement = Placement(eos, ros, cfg.ranks, cfg.experts)
        self._b = self._placement.balancedness(load)

    def popularity(self) -> np.ndarray:
        """Current expected share of routed tokens per (layer, expert); rows sum to 1."""
        g = self._g
        p = (self._x.reshape(g.shape[0], g.shape[1], -1) + g).reshape(self._x.shape)
        p -= p.max(axis=1, keepdims=True)
        np.exp(p, out=p)
        p /= p.sum(axis=1, keepdims=True)
        return p

    @property
    def balancedness(self) -> float:
        return self._b

    @property
    def next_epoch_step(self) -> int:
        """The first step index at which `advance` can change the state."""
        return (self._epoch + 1) * self.cfg.epoch_steps

    def advance(self, step_index: int) -> float:
        """Move the state to `step_index` (drift, rearrangements) and return balancedness."""
        target = step_index // self.cfg.epoch_steps
        while self._epoch < target:
            self._epoch += 1
            self._drift()
            load = self.popularity()
            self._remember(self._epoch, load)
            steps = self._epoch * self.cfg.epoch_steps
            if self.cfg.enabled and steps % self.cfg.interval_steps == 0:
                self._rearrange()
                self.last_rearrangement_step = steps
            self._b = self._placement.balancedness(load)
        return self._b

    def _next_rearrangement(self, epoch: int) -> int:
        """The first epoch at or after `epoch` (and after epoch 0) that rearranges."""
        p = self._period
        return max(p, -(-epoch // p) * p)

    def _remember(self, epoch: int, load: np.ndarray) -> None:
        """Keep `load` if the next rearrangement's window holds `epoch`, and forget what
        falls out of that window. The window is the last `window_steps // epoch_steps`
        epochs up to the rearrangement, so what is kept at a rearrangement is exactly those
        epochs' loads in order, and between windows nothing is held (keeping the last
        window's at every moment held 10 arrays of layers x experts per state)."""
        if not self._period:  # no rearrangement ever reads it
            return
        first = self._next_rearrangement(epoch) - self._window_epochs + 1
        history = self._history
        while history and history[0][0] < first:
            history.popleft()
        if epoch >= first:
            history.append((epoch, load))

    def _drift(self) -> None:
        c = self.cfg
        noise = self._rng.standard_normal(self._x.shape)
        noise *= math.sqrt(1.0 - self._rho ** 2) * c.sigma
        self._x *= self._rho
        self._x += noise

    def _rearrange(self) -> None:
        c = self.cfg
        window = np.mean(np.stack([load for _, load in self._history]), axis=0)
        eos, ros = balanced_placement(window, c.ranks, c.redundant)
        # Weights a rank must receive: slots whose expert or rank changed.
        old = self._placement
        changed = eos != old.expert_of_slot
        changed |= ros != old.rank_of_slot
        per_rank = np.bincount(ros[changed], minlength=c.ranks)
        self.last_moved_bytes = float(per_rank.max()) * c.expert_bytes
        self._placement = Placement(eos, ros, c.ranks, c.experts)
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
