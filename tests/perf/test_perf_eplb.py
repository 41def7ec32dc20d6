"""EPLB: placement, balancedness, rearrangement."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackSim.perf.eplb import (
    EplbConfig,
    EplbState,
    Placement,
    balanced_placement,
    contiguous_placement,
)


def _balancedness(load: np.ndarray, expert_of_slot: np.ndarray, rank_of_slot: np.ndarray,
                  ranks: int) -> float:
    return Placement(expert_of_slot, rank_of_slot, ranks, load.shape[1]).balancedness(load)


def test_balancedness_hand() -> None:
    # 4 experts on 2 ranks (contiguous): loads (0.4 + 0.3, 0.2 + 0.1) -> mean 0.5, max 0.7.
    load = np.array([[0.4, 0.3, 0.2, 0.1]])
    eos = np.arange(4)[None, :]
    assert _balancedness(load, eos, contiguous_placement(1, 4, 2), 2) == pytest.approx(0.5 / 0.7)
    # Greedy packing: 0.4 -> r0, 0.3 -> r1, 0.2 -> r1, 0.1 -> r0: loads 0.5 / 0.5 -> 1.
    e2, r2 = balanced_placement(load, 2)
    assert _balancedness(load, e2, r2, 2) == pytest.approx(1.0)


def test_redundant_expert_splits_hot_expert() -> None:
    load = np.array([[0.7, 0.1, 0.1, 0.1]])
    e0, r0 = balanced_placement(load, 2)
    e1, r1 = balanced_placement(load, 2, redundant=2)
    assert _balancedness(load, e1, r1, 2) > _balancedness(load, e0, r0, 2)
    assert list(e1[0]).count(0) >= 2  # the hot expert got a replica


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), ranks=st.sampled_from([2, 4, 8, 16]),
       sigma=st.floats(0.0, 3.0), enabled=st.booleans())
def test_balancedness_in_unit_interval(seed: int, ranks: int, sigma: float,
                                       enabled: bool) -> None:
    cfg = EplbConfig(layers=3, experts=32, ranks=ranks, sigma=sigma, sigma_group=sigma / 2,
                     groups=4, drift_steps=500, enabled=enabled, interval_steps=300,
                     window_steps=200)
    state = EplbState(cfg, seed=seed)
    for step in (0, 100, 300, 700):
        b = state.advance(step)
        assert 0.0 < b <= 1.0 + 1e-12


def test_eplb_rearranges_on_interval_and_helps() -> None:
    common = dict(layers=4, experts=64, ranks=8, sigma=0.3, sigma_group=1.0, groups=8,
                  drift_steps=30_000, interval_steps=1000, window_steps=500,
                  expert_bytes=1e6)
    on = EplbState(EplbConfig(enabled=True, **common), seed=1)
    off = EplbState(EplbConfig(enabled=False, **common), seed=1)
    on.advance(999)
    assert on.rearrangements == 0
    on.advance(1000)
    assert on.rearrangements == 1 and on.last_rearrangement_step == 1000
    off.advance(1000)
    assert on.balancedness > off.balancedness
    assert on.rebalance_ms(1e9) == pytest.approx(on.last_moved_bytes / 1e9)


def test_eplb_deterministic_per_seed() -> None:
    cfg = EplbConfig(layers=2, experts=32, ranks=4, sigma=0.5, drift_steps=1000)
    a, b, c = EplbState(cfg, seed=5), EplbState(cfg, seed=5), EplbState(cfg, seed=6)
    assert [a.advance(s) for s in range(0, 5000, 700)] == [b.advance(s) for s in
                                                         range(0, 5000, 700)]
    assert c.advance(4900) != a.balancedness


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), ranks=st.sampled_from([4, 8, 16, 32]),
       sigma=st.floats(0.0, 3.0))
def test_no_redundancy_bound(seed: int, ranks: int, sigma: float) -> None:
    """Without redundant experts no placement beats k x (contiguous balancedness), k = experts
    per rank: the hottest contiguous rank holds an expert of at least 1/k of its load, and
    that expert sits whole on some rank. (Why E2, 0.21 -> 0.89 at 4 experts/rank, cannot
    both hold: 4 x 0.21 = 0.84.)"""
    rng = np.random.default_rng(seed)
    load = np.exp(sigma * rng.standard_normal((3, 128)))
    k = 128 // ranks
    off = _balancedness(load, np.broadcast_to(np.arange(128), (3, 128)),
                          contiguous_placement(3, 128, ranks), ranks)
    eos, ros = balanced_placement(load, ranks)
    assert _balancedness(load, eos, ros, ranks) <= k * off + 1e-12


def _greedy_one_layer(slot_load: list[float], ranks: int) -> list[int]:
    """Reference packing of one layer, slot by slot: hottest first (stable), onto the
    least-loaded rank with a free slot (the lowest such rank on a tie)."""
    cap = len(slot_load) // ranks
    load, filled = [0.0] * ranks, [0] * ranks
    rank_of = [0] * len(slot_load)
    for s in sorted(range(len(slot_load)), key=lambda i: -slot_load[i]):
        r = min((r for r in range(ranks) if filled[r] < cap), key=lambda r: load[r])
        rank_of[s] = r
        load[r] += slot_load[s]
        filled[r] += 1
    return rank_of


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), layers=st.integers(1, 4),
       ranks_experts=st.sampled_from([(2, 4), (4, 16), (8, 32), (4, 8)]),
       redundant_per_rank=st.integers(0, 2), ties=st.booleans())
def test_packing_is_the_per_layer_greedy(seed, layers, ranks_experts, redundant_per_rank,
                                         ties) -> None:
    """The placement's packing (all layers at once, +inf on a full rank) is exactly the
    plain greedy run layer by layer, ties included (loads drawn from a few values)."""
    ranks, experts = ranks_experts
    rng = np.random.default_rng(seed)
    load = (rng.integers(1, 4, (layers, experts)).astype(float) if ties
            else np.exp(rng.standard_normal((layers, experts))))
    redundant = redundant_per_rank * ranks
    eos, ros = balanced_placement(load, ranks, redundant)
    counts = np.zeros((layers, experts))
    for layer in range(layers):
        np.add.at(counts[layer], eos[layer], 1.0)
        slot_load = [load[layer, e] / counts[layer, e] for e in eos[layer]]
        assert ros[layer].tolist() == _greedy_one_layer(slot_load, ranks)


class _KeepsEveryEpoch(EplbState):
    """Reference: remembers every epoch's load (the last `window_steps // epoch_steps`)."""

    def _remember(self, epoch: int, load: np.ndarray) -> None:
        self._history.append((epoch, load))
        while len(self._history) > self._window_epochs:
            self._history.popleft()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 1000), epoch_steps=st.sampled_from([1, 7, 50, 100]),
       interval=st.integers(1, 40), window=st.integers(1, 40))
def test_history_kept_only_for_rearrangements(seed: int, epoch_steps: int, interval: int,
                                              window: int) -> None:
    """Keeping only the epochs a rearrangement averages gives the placements and
    balancedness of keeping every epoch (windows shorter than, equal to and longer than the
    interval; intervals that are not multiples of the epoch), and holds at most one window."""
    cfg = EplbConfig(layers=2, experts=16, ranks=4, sigma=1.0, sigma_group=0.5, groups=4,
                     drift_steps=20 * epoch_steps, interval_steps=interval * epoch_steps // 3
                     or 1, window_steps=window * epoch_steps // 2 or 1, epoch_steps=epoch_steps)
    lean, every = EplbState(cfg, seed=seed), _KeepsEveryEpoch(cfg, seed=seed)
    for step in range(0, 120 * epoch_steps, 3 * epoch_steps):
        assert lean.advance(step) == every.advance(step)
        assert np.array_equal(lean._placement.rank_of_slot, every._placement.rank_of_slot)
        assert len(lean._history) <= lean._window_epochs
    assert lean.rearrangements == every.rearrangements


def test_history_empty_between_windows() -> None:
    """Interval 3000, window 1000, epoch 100 (the reference): the loads of epochs 1-20 after
    a rearrangement are not kept; 21-30 are, and averaged at epoch 30."""
    cfg = EplbConfig(layers=2, experts=16, ranks=4, sigma=1.0, drift_steps=3000,
                     interval_steps=3000, window_steps=1000, epoch_steps=100)
    state = EplbState(cfg, seed=3)
    state.advance(2000)
    assert not state._history
    state.advance(2500)
    assert [e for e, _ in state._history] == [21, 22, 23, 24, 25]
    state.advance(3000)
    assert [e for e, _ in state._history] == list(range(21, 31))
    assert state.rearrangements == 1
    state.advance(3100)
    assert not state._history


@pytest.mark.parametrize(("experts", "groups"), [(384, 8), (10, 3), (6, 1), (12, 12)])
def test_popularity_adds_each_expert_its_group_s_part(experts: int, groups: int) -> None:
    """The group part is held per group (broadcast) when the groups divide the experts, per
    expert otherwise; either way each expert's log-popularity is its own part plus its
    group's (group = expert * groups // experts), as a full (layers, experts) copy gives."""
    cfg = EplbConfig(layers=3, experts=experts, ranks=2 if experts % 2 == 0 else 1,
                     sigma=0.7, drift_steps=1000.0, sigma_group=0.9, groups=groups)
    state = EplbState(cfg, seed=5)
    rng = np.random.default_rng(5)
    rng.standard_normal((3, experts))  # the expert parts, drawn first
    g = (rng.standard_normal((3, groups)) * 0.9)[:, np.arange(experts) * groups // experts]
    p = state._x + g
    p = np.exp(p - p.max(axis=1, keepdims=True))
    assert np.array_equal(state.popularity(), p / p.sum(axis=1, keepdims=True))
    assert state._g.size == 3 * (groups if experts % groups == 0 else experts)


def test_a_placement_keeps_compact_slots_and_counts_only_for_replicas() -> None:
    load = np.random.default_rng(0).random((4, 16))
    plain = Placement(*balanced_placement(load, 4), 4, 16)
    assert plain.counts is None and plain.expert_of_slot.dtype == np.uint8
    assert plain.rank_of_slot.dtype == np.uint8
    replicated = Placement(*balanced_placement(load, 4, redundant=4), 4, 16)
    assert replicated.counts is not None and replicated.counts.sum() == 4 * 20
    assert plain.balancedness(load) < replicated.balancedness(load) <= 1.0
