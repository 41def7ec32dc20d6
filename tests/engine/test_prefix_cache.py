"""The per-node prefix cache: hits, LRU order, pinning, capacity, host tier."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rackSim.engine.prefix_cache import BlockCache, TieredPrefixCache


def test_lookup_counts_prefix_only():
    c = BlockCache(100)
    c.insert(((1, 10), (2, 5)))
    assert c.lookup(((1, 10), (2, 5))) == 15
    assert c.lookup(((1, 10), (2, 8), (3, 4))) == 15  # node 2 only 5 deep: stop there
    assert c.lookup(((1, 4),)) == 4
    assert c.lookup(((9, 4), (1, 10))) == 0  # a different root shares nothing
    assert c.used == 15


def test_lru_evicts_leaves_before_their_prefix():
    c = BlockCache(30)
    c.insert(((1, 10), (2, 10)))   # session A: root 1, turn 2
    c.insert(((3, 10),))           # session B
    c.insert(((4, 10),))           # needs 10 blocks: evicts A's leaf (2), not its root (1)
    assert c.resident(2) == 0 and c.resident(1) == 10
    assert c.resident(3) == 10 and c.resident(4) == 10


def test_pinned_blocks_are_never_evicted():
    c = BlockCache(20)
    c.insert(((1, 10),))
    c.pin(((1, 10),))
    c.insert(((2, 10),))
    c.insert(((3, 10),))            # must evict 2, not pinned 1
    assert c.resident(1) == 10 and c.resident(2) == 0 and c.resident(3) == 10
    assert not c.can_hold(((4, 15),))  # 20 - 10 pinned = 10 < 15
    c.unpin(((1, 10),))
    assert c.can_hold(((4, 15),)) and c.pinned == 0


def test_insert_beyond_capacity_keeps_a_prefix():
    c = BlockCache(8)
    c.insert(((1, 5), (2, 5)))
    assert c.resident(1) == 5 and c.resident(2) == 3 and c.used == 8


def test_host_tier_holds_what_gpu_evicted():
    t = TieredPrefixCache(gpu_blocks=10, host_blocks=100)
    t.insert(((1, 10),))
    t.insert(((2, 10),))            # evicts node 1 from GPU into host
    assert t.lookup(((1, 10),)) == (0, 10)
    assert t.lookup(((2, 10),)) == (10, 0)


paths = st.lists(st.lists(st.tuples(st.integers(0, 12), st.integers(1, 9)), min_size=1,
                          max_size=4), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(ops=paths, cap=st.integers(0, 40))
def test_capacity_and_accounting_hold(ops, cap):
    c = BlockCache(cap)
    for raw in ops:
        seen, path = set(), []
        for n, b in raw:  # a path visits each node once
            if n not in seen:
                seen.add(n)
                path.append((n, b))
        path = tuple(path)
        c.insert(path)
        assert c.used <= cap
        assert c.used == sum(c.resident(n) for n in range(13))
        assert 0 <= c.lookup(path) <= sum(b for _, b in path)
