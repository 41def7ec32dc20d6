"""The per-node prefix cache: hits, LRU order, pinning, capacity, host tier."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from rackSim.engine.prefix_cache import LEAVES_SLACK, WALK_DEPTH, BlockCache, TieredPrefixCache


def test_lookup_counts_prefix_only():
    c = BlockCache(100)
    c.insert(((1, 10), (2, 5)))
    assert c.lookup(((1, 10), (2, 5))) == 15
    assert c.lookup(((1, 10), (2, 8), (3, 4))) == 15  # node 2 only 5 deep: stop there
    assert c.lookup(((1, 4),)) == 4
    assert c.lookup(((9, 4), (5, 10))) == 0  # a different root shares nothing
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


class LinearLru:
    """The oracle: every operation walks the whole path, and an insert touches the path's
    resident nodes deepest first in one LRU list (what BlockCache must match on paths of one
    prefix tree, whatever their depth)."""

    def __init__(self, capacity: int):
        self.capacity, self.used, self.pinned = capacity, 0, 0
        self.res: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.pins: dict[int, int] = {}

    def lookup(self, path) -> int:
        hit = 0
        for node, blocks in path:
            r = self.res.get(node, 0)
            if r < blocks:
                return hit + r
            hit += blocks
        return hit

    def can_hold(self, path) -> bool:
        need = sum(max(0, b - self.res.get(n, 0)) for n, b in path)
        unpinned = sum(self.res.get(n, 0) for n, _ in path if not self.pins.get(n))
        return (need <= self.capacity - self.used
                or need <= self.capacity - self.pinned - unpinned)

    def insert(self, path) -> list[tuple[int, int]]:
        need = sum(max(0, b - self.res.get(n, 0)) for n, b in path)
        out = []
        if need > self.capacity - self.used:
            keep, freed = {n for n, _ in path}, 0
            for node in list(self.lru):
                if freed >= need - (self.capacity - self.used):
                    break
                if node not in keep and not self.pins.get(node):
                    out.append((node, self.res[node]))
                    freed += self.res[node]
            for node, b in out:
                del self.res[node], self.lru[node]
                self.used -= b
        room = self.capacity - self.used
        for node, blocks in path:
            have = self.res.get(node, 0)
            add = min(blocks - have, room)
            if add > 0:
                self.res[node] = have + add
                self.used += add
                room -= add
                if self.pins.get(node):
                    self.pinned += add
            if have + max(add, 0) < blocks:
                break
        for node, _ in reversed(path):
            if node in self.res:
                self.lru[node] = None
                self.lru.move_to_end(node)
        return out

    def pin(self, path) -> None:
        for node, _ in path:
            if not self.pins.get(node):
                self.pinned += self.res.get(node, 0)
            self.pins[node] = self.pins.get(node, 0) + 1

    def unpin(self, path) -> None:
        for node, _ in path:
            self.pins[node] -= 1
            if not self.pins[node]:
                del self.pins[node]
                self.pinned -= self.res.get(node, 0)


@st.composite
def tree_workloads(draw):
    """A prefix tree (mostly long chains, as an agent that branches every turn makes) and
    operations on root paths of it: each node's parent and branch point are fixed."""
    n = draw(st.integers(1, 40))
    parent = [-1] + [draw(st.sampled_from([-1, i - 1, i - 1, i - 1, draw(st.integers(0, i - 1))]))
                     for i in range(1, n)]
    branch = [draw(st.integers(1, 6)) for _ in range(n)]  # blocks of a node its children cover

    def path(node: int, last: int):
        chain = [(node, last)]
        while parent[chain[-1][0]] >= 0:
            chain.append((parent[chain[-1][0]], branch[chain[-1][0]]))
        return tuple(reversed(chain))

    ops = draw(st.lists(st.tuples(st.sampled_from(["insert", "insert", "pin", "unpin", "hold"]),
                                  st.integers(0, n - 1), st.integers(0, 8)), max_size=60))
    # a trace's last node may cover no full block (a prompt ending inside its first block)
    return [(op, path(node, last)) for op, node, last in ops]


@settings(max_examples=150, deadline=None)
@given(work=tree_workloads(), cap=st.integers(0, 60))
def test_block_cache_matches_a_linear_lru_on_any_tree(work, cap):
    """Bisected lookups and the heap of leaves evict what a full walk and one LRU list would,
    in the same order, on paths deeper than the walked ones."""
    c, ref = BlockCache(cap), LinearLru(cap)
    pinned = []
    for op, path in work:
        if op == "insert":
            assert c.insert(path) == ref.insert(path)
        elif op == "pin":
            c.pin(path), ref.pin(path)
            pinned.append(path)
        elif op == "unpin" and pinned:
            done = pinned.pop(0)
            c.unpin(done), ref.unpin(done)
        assert c.can_hold(path) == ref.can_hold(path)
        assert c.lookup(path) == ref.lookup(path)
        assert c.missing(path) == sum(max(0, b - ref.res.get(n, 0)) for n, b in path)
        assert (c.used, c.pinned) == (ref.used, ref.pinned) and c.used <= cap
        assert {n: c.resident(n) for n in range(40)} == {n: ref.res.get(n, 0) for n in range(40)}


@settings(max_examples=150, deadline=None)
@given(trunk=st.integers(1, 4 * WALK_DEPTH),
       forks=st.lists(st.tuples(st.integers(0, 4 * WALK_DEPTH), st.integers(1, 12)),
                      min_size=1, max_size=6),
       ops=st.lists(st.tuples(st.sampled_from(["pin", "unpin", "read", "insert"]),
                              st.integers(0, 6)), max_size=50),
       cap=st.integers(0, 120))
def test_pins_of_paths_sharing_a_prefix_count_every_path(trunk, forks, ops, cap):
    """Agents that branch every turn pin many deep paths through one shared prefix at once
    (parallel sub-agents, turns in flight): each pin and unpin counts on every node of its
    path, so a prefix stays pinned until the last path through it is unpinned. Pins are
    counted only when read, so pins and unpins come in runs with no read between them (a
    pin undone before it is counted, a path pinned twice, an unpin of a counted pin); at
    every read the pinned blocks, and what an insert evicts around them, match a plain walk."""
    spine = [(n, 1) for n in range(trunk)]
    paths = [tuple(spine)]
    for k, (at, length) in enumerate(forks):  # a branch off the trunk at depth `at`
        at = min(at, trunk - 1)
        paths.append(tuple(spine[:at]) + tuple((1000 * (k + 1) + j, 1) for j in range(length)))
    c, ref = BlockCache(cap), LinearLru(cap)
    for path in paths:
        assert c.insert(path) == ref.insert(path)
    held: list = []
    for turn, (op, which) in enumerate(ops):
        path = paths[which % len(paths)]
        if op == "pin":
            c.pin(path), ref.pin(path)
            held.append(path)
        elif op == "unpin" and held:
            done = held.pop(which % len(held))
            c.unpin(done), ref.unpin(done)
        elif op == "read":  # can_hold first: it may be what counts the pins
            big = path + ((20_000 + turn, which * 10),)
            assert c.can_hold(big) == ref.can_hold(big)
            assert (c.used, c.pinned) == (ref.used, ref.pinned)
            assert c._pins == ref.pins
        elif op == "insert":  # evicts around the pins alike
            fresh = tuple((10_000 + 10 * turn + j, 3) for j in range(3))
            assert c.insert(fresh) == ref.insert(fresh)
            assert c._res == ref.res
    for done in held:
        c.unpin(done), ref.unpin(done)
    assert (c.pinned, ref.pinned, c._pins, ref.pins) == (0, 0, {}, {})


def test_deep_chains_are_bisected_and_evicted_leaf_first():
    """A session that branches every turn: a path grows a node a turn, far past the walked
    depth; evicting the oldest session takes its deepest nodes first."""
    c, ref = BlockCache(400), LinearLru(400)
    sessions = {s: [] for s in range(3)}
    for turn in range(60):
        for s, chain in sessions.items():
            chain.append((1000 * s + turn, 2))
            path = tuple(chain[:-1]) + ((chain[-1][0], 3),)
            if s < 2 or turn % 3 == 0:
                assert c.insert(path) == ref.insert(path)
            assert c.lookup(path) == ref.lookup(path)
    assert max(len(p) for p in sessions.values()) > 4 * WALK_DEPTH
    assert c.used == ref.used > 390 and c._res == ref.res
    # the session extended least recently lost its deepest turns, and only those
    kept = [t for t in range(60) if c.resident(2000 + t)]
    assert kept == list(range(len(kept))) and 0 < len(kept) < 57
    assert all(c.resident(1000 * s + t) for s in (0, 1) for t in range(60))


def test_stale_heap_entries_are_compacted():
    """A leaf that gains a child leaves its heap entry behind; past `LEAVES_SLACK` of them the
    heap is compacted, and eviction still follows the LRU order."""
    cap = 300 * 15 + 40
    c, ref = BlockCache(cap), LinearLru(cap)
    for turn in range(15):  # 300 sessions growing a node a turn: 4,200 stale entries
        for s in range(300):
            p = tuple((100 * s + t, 1) for t in range(turn + 1))
            assert c.insert(p) == ref.insert(p)
    assert 300 * 15 > LEAVES_SLACK and len(c._leaves) < 1000  # compacted once
    for s in range(300, 320):  # new sessions evict the least recent turns, deepest first
        p = tuple((100 * s + t, 1) for t in range(12))
        assert c.insert(p) == ref.insert(p)
    assert c._res == ref.res and c.used == ref.used == cap
