"""Prefix caches over 64-token KV blocks, tracked per prefix-tree node (see workload.graph).

A node's residency is the number of its blocks resident counted from its first block. Paths
are root paths of one prefix tree: a node has one parent, and every path through a child
covers the same blocks of its parent (the branch point). Residency is then prefix-closed
along any path: a node is resident only while its parent holds the blocks its path covers,
so a lookup stops at the first node not resident far enough, found on deep paths by
galloping from the end, then bisection (O(log depth) reads, two where a turn extends a
resident one; an agent that re-sends part of each response branches every turn, and its
paths grow a node a turn).

Eviction is LRU over nodes as if each insert touched its path deepest node first: an
ancestor is always more recent than its descendants, and eviction removes leaves before the
prefixes they extend (vLLM frees a request's blocks in reverse order for the same reason).
An insert stamps only the deepest resident node of its path; a node's recency is the
newest stamp in its subtree, so only leaves of the resident tree can be least recent. They
wait in a heap keyed (stamp, -depth); an evicted leaf hands its stamp to its parent, which
joins the heap when its last resident child goes. Blocks of requests in flight are pinned
and never evicted.

Pins are counted per node only when something reads them: an eviction, or a `can_hold` that
must subtract the pinned blocks. Until then a pin and its unpin are a dictionary entry for the
path (O(1) however deep it is); a cache that never fills, as at the headline fit's operating
point, never counts them.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush
from itertools import islice, repeat
from operator import add, itemgetter

from rackSim.workload.graph import PromptPath

#: Paths up to this many nodes are walked; deeper ones bisected.
WALK_DEPTH = 8
#: Entries the heap of leaves may hold beyond four per live one before it is compacted.
LEAVES_SLACK = 4096
_node_key, _blocks = itemgetter(0), itemgetter(1)


class _Node:
    """A resident node's place in the LRU order and the tree."""

    __slots__ = ("stamp", "depth", "parent", "children", "queued")

    def __init__(self, depth: int, parent: int | None):
        self.stamp = 0  # exact for a leaf, a lower bound for an inner node
        self.depth = depth
        self.parent = parent  # None for a root
        self.children = 0  # resident ones
        self.queued: int | None = None  # the stamp of its entry in the heap of leaves


def _sum_blocks(path: PromptPath, stop: int | None = None) -> int:
    """Blocks of `path`'s first `stop` nodes (all of them by default)."""
    return sum(map(_blocks, path if stop is None else islice(path, stop)))


class BlockCache:
    """One cache tier (GPU HBM or host memory) of one instance or rank, in blocks."""

    def __init__(self, capacity_blocks: int):
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self.capacity = capacity_blocks
        self.used = 0
        self._pinned = 0  # resident blocks of nodes pinned by the counted pins
        self._res: dict[int, int] = {}
        self._pins: dict[int, int] = {}  # node -> counted pins of paths through it
        self._uncounted: dict[int, list] = {}  # id(path) -> [path, pins not counted yet]
        self._node: dict[int, _Node] = {}  # per resident node
        self._leaves: list[tuple[int, int, int]] = []  # (stamp, -depth, node), some stale
        self._leaves_limit = LEAVES_SLACK  # compact the heap past this many entries
        self._stamp = 0

    def resident(self, node: int) -> int:
        return self._res.get(node, 0)

    @property
    def pinned(self) -> int:
        """Resident blocks of pinned nodes."""
        if self._uncounted:
            self._count_pins()
        return self._pinned

    def _short_at(self, path: PromptPath) -> int:
        """Index of the first node of `path` not resident as far as the path covers it
        (len(path) if every node is)."""
        res = self._res
        n = len(path)
        if n <= WALK_DEPTH:
            for i, (node, blocks) in enumerate(path):
                if res.get(node, 0) < blocks:
                    return i
            return n
        # A trace's last node may cover no full block: any cache holds that much of it, so
        # it says nothing of the nodes above it.
        end = n
        while end > 1 and path[end - 1][1] == 0:
            end -= 1
        node, blocks = path[end - 1]
        if res.get(node, 0) >= blocks:
            return n
        # Gallop from the end for a node resident as far as the path covers it (a turn's
        # path is its last turn's, resident, and a new node: found in one step), then bisect
        # between it and the short node above.
        hi, step = end - 1, 1  # path[hi] is short
        lo = hi - 1
        while lo >= 0:
            node, blocks = path[lo]
            if res.get(node, 0) >= blocks:
                break
            hi, step = lo, 2 * step
            lo = hi - step
        lo = lo + 1 if lo >= 0 else 0
        while lo < hi:
            mid = (lo + hi) >> 1
            node, blocks = path[mid]
            if res.get(node, 0) >= blocks:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def lookup(self, path: PromptPath) -> int:
        """Blocks of `path`'s prefix resident here."""
        res = self._res
        if len(path) <= WALK_DEPTH:
            hit = 0
            for node, blocks in path:
                r = res.get(node, 0)
                if r < blocks:
                    return hit + r
                hit += blocks
            return hit
        i = self._short_at(path)
        if i == len(path):
            return _sum_blocks(path)
        return _sum_blocks(path, i) + res.get(path[i][0], 0)

    def missing(self, path: PromptPath) -> int:
        """Blocks `insert(path)` would add."""
        if len(path) > WALK_DEPTH:
            return self._missing_from(path, self._short_at(path))
        res = self._res
        need = 0
        for node, blocks in path:
            have = res.get(node, 0)
            if blocks > have:
                need += blocks - have
        return need

    def _missing_from(self, path: PromptPath, first: int) -> int:
        """Blocks `path` misses, given the index of its first short node: that node's
        missing blocks and all of the nodes after it (residency is prefix-closed)."""
        if first == len(path):
            return 0
        return _sum_blocks(islice(path, first, None)) - self._res.get(path[first][0], 0)

    def can_hold(self, path: PromptPath) -> bool:
        """Whether `path` fits after evicting every unpinned block not on it."""
        need = self.missing(path)
        if need <= self.capacity - self.used:
            return True
        pinned = self.pinned  # counts the pins `_on_path_unpinned` reads
        return need <= self.capacity - pinned - self._on_path_unpinned(path)

    def _on_path_unpinned(self, path: PromptPath) -> int:
        pins, res = self._pins, self._res
        return sum(res.get(n, 0) for n, _ in path if not pins.get(n))

    def insert(self, path: PromptPath) -> list[tuple[int, int]]:
        """Make `path` resident (as far as capacity allows) and most recent.

        Returns the evicted (node, blocks), least recent first, for demotion to a lower tier.
        """
        evicted: list[tuple[int, int]] = []
        res, nodes = self._res, self._node
        n = len(path)
        if n <= WALK_DEPTH:
            first, need, i = n, 0, 0
            for node, blocks in path:
                have = res.get(node, 0)
                if blocks > have:
                    need += blocks - have
                    if first == n:
                        first = i
                i += 1
        else:
            first = self._short_at(path)
            need = self._missing_from(path, first)
        deepest = first - 1  # the deepest node resident after the insert
        if need:
            if need > self.capacity - self.used:
                evicted = self._evict(need - (self.capacity - self.used), path)
            room = self.capacity - self.used
            pins = self._pins
            for j in range(first, n):  # grow root first so residency stays prefix-closed
                node, blocks = path[j]
                have = res.get(node, 0)
                add = blocks - have
                if add > room:
                    add = room
                if add > 0:
                    res[node] = have + add
                    self.used += add
                    room -= add
                    if pins.get(node):
                        self._pinned += add
                    if not have:
                        parent = path[j - 1][0] if j else None
                        nodes[node] = _Node(j, parent)
                        if parent is not None:
                            p = nodes.get(parent)
                            if p is not None:
                                p.children += 1
                if have + add > 0:
                    deepest = j
                if have + add < blocks:
                    break
        while deepest >= 0 and path[deepest][0] not in nodes:  # a last node of no blocks
            deepest -= 1
        if deepest >= 0:
            self._stamp += 1
            entry = nodes[path[deepest][0]]
            entry.stamp = self._stamp
            if not entry.children and entry.queued is None:  # else re-keyed when popped
                self._queue(path[deepest][0], entry)
        return evicted

    def _queue(self, node: int, entry: _Node) -> None:
        entry.queued = entry.stamp
        leaves = self._leaves
        heappush(leaves, (entry.stamp, -entry.depth, node))
        if len(leaves) > self._leaves_limit:
            self._compact()

    def _compact(self) -> None:
        """Drop the heap entries of nodes evicted or no longer leaves."""
        nodes = self._node
        live = []
        for item in self._leaves:
            e = nodes.get(item[2])
            if e is not None and e.queued == item[0]:
                if e.children:
                    e.queued = None
                else:
                    live.append(item)
        heapify(live)
        self._leaves = live
        self._leaves_limit = 4 * len(live) + LEAVES_SLACK

    def _evict(self, blocks: int, path: PromptPath) -> list[tuple[int, int]]:
        """Free at least `blocks` (if unpinned blocks off `path` allow), least recent first."""
        if self._uncounted:
            self._count_pins()
        leaves, nodes, res, pins = self._leaves, self._node, self._res, self._pins
        n = len(path)
        freed = 0
        out: list[tuple[int, int]] = []
        skipped = []
        while freed < blocks and leaves:
            item = heappop(leaves)
            stamp, neg_depth, node = item
            e = nodes.get(node)
            if e is None or e.queued != stamp:
                continue  # an entry of a node since evicted
            if e.children:  # no longer a leaf
                e.queued = None
                continue
            if e.stamp != stamp:  # touched since it was queued: re-key
                e.queued = e.stamp
                heappush(leaves, (e.stamp, neg_depth, node))
                continue
            if pins.get(node) or (-neg_depth < n and path[-neg_depth][0] == node):
                skipped.append(item)
                continue
            held = res.pop(node)
            del nodes[node]
            self.used -= held
            freed += held
            out.append((node, held))
            parent = e.parent
            if parent is not None:
                p = nodes.get(parent)
                if p is not None:
                    p.children -= 1
                    if stamp > p.stamp:
                        p.stamp = stamp
                    if not p.children and p.queued is None:
                        p.queued = p.stamp
                        heappush(leaves, (p.stamp, -p.depth, parent))
        for item in skipped:
            heappush(leaves, item)
        return out

    def _pinned_at_least(self, path: PromptPath, count: int) -> int:
        """How many of `path`'s first nodes are pinned `count` times or more (a prefix: a
        path pinned through a node is pinned through its parent)."""
        pins = self._pins
        lo, hi = 0, len(path)
        while lo < hi:
            mid = (lo + hi) >> 1
            if pins.get(path[mid][0], 0) >= count:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def pin(self, path: PromptPath) -> None:
        """Pin every node of `path` (counted per node when first read: `_count_pins`)."""
        entry = self._uncounted.get(id(path))
        if entry is None:
            self._uncounted[id(path)] = [path, 1]
        else:
            entry[1] += 1

    def unpin(self, path: PromptPath) -> None:
        """Drop one pin of `path` (the same object that was pinned)."""
        key = id(path)
        entry = self._uncounted.get(key)
        if entry is None:
            self._pin_nodes(path, -1)
        elif entry[1] == 1:
            del self._uncounted[key]
        else:
            entry[1] -= 1

    def _count_pins(self) -> None:
        """Count the pins not counted yet on their paths' nodes."""
        uncounted, self._uncounted = self._uncounted, {}
        for path, times in uncounted.values():
            for _ in range(times):
                self._pin_nodes(path, 1)

    def _pin_nodes(self, path: PromptPath, delta: int) -> None:
        """Add `delta` (1 or -1) to the pin count of every node of `path`, keeping `_pinned`.
        Counts never rise from a node to its child, so the nodes whose count leaves or
        reaches 0 are a suffix (found by bisection); the whole path is updated by C-level
        dict calls."""
        pins, res = self._pins, self._res
        first = self._pinned_at_least(path, 1 if delta > 0 else 2)
        keys = list(map(_node_key, path))
        edge = keys[first:]
        blocks = sum(map(res.get, edge, repeat(0)))
        if delta > 0:
            pins.update(dict.fromkeys(edge, 1))
            self._pinned += blocks
        else:
            deque(map(pins.pop, edge), maxlen=0)
            self._pinned -= blocks
        if first:
            held = keys[:first]
            counts = map(add, map(pins.__getitem__, held), repeat(delta))
            pins.update(zip(held, counts, strict=True))

    def demote(self, nodes: list[tuple[int, int]]) -> None:
        """Accept blocks evicted from the tier above (each node from its first block, as a
        root of its own here)."""
        for node, blocks in nodes:
            self.insert(((node, blocks),))


class TieredPrefixCache:
    """GPU blocks backed by an optional host-memory tier holding what the GPU evicted."""

    def __init__(self, gpu_blocks: int, host_blocks: int = 0):
        self.gpu = BlockCache(gpu_blocks)
        self.host = BlockCache(host_blocks) if host_blocks > 0 else None

    def lookup(self, path: PromptPath) -> tuple[int, int]:
        """(blocks hit in GPU memory, further blocks hit in host memory) along `path`."""
        if self.host is None or self.host.used == 0:
            return self.gpu.lookup(path), 0
        # The GPU's prefix ends at its first short node; from there on, one walk for both
        # (the GPU or host prefix ends at or after it).
        gres, hres = self.gpu._res, self.host._res
        first = self.gpu._short_at(path) if len(path) > WALK_DEPTH else 0
        gpu = hit = _sum_blocks(path, first) if first else 0
        on_gpu = True
        for node, blocks in islice(path, first, None):
            g = gres.get(node, 0)
            if on_gpu:
                if g < blocks:
                    gpu += g
                    on_gpu = False
                else:
                    gpu += blocks
            h = hres.get(node, 0)
            r = g if g > h else h
            if r < blocks:
                hit += r
                break
            hit += blocks
        return gpu, hit - gpu

    def insert(self, path: PromptPath) -> None:
        evicted = self.gpu.insert(path)
        if evicted and self.host is not None:
            self.host.demote(evicted)
