"""Prefix caches over 64-token KV blocks, tracked per prefix-tree node (see workload.graph).

A node's residency is the number of its blocks resident counted from its first block, so a
lookup walks the prompt path and stops at the first node not resident far enough: O(depth).
Nodes are LRU-ordered; a path is touched deepest node first, so an ancestor is always more
recent than its descendants and eviction removes leaves before the prefixes they extend
(vLLM frees a request's blocks in reverse order for the same reason). Blocks of requests in
flight are pinned and never evicted.
"""

from __future__ import annotations

from collections import OrderedDict

from rackSim.workload.graph import PromptPath


class BlockCache:
    """One cache tier (GPU HBM or host memory) of one instance or rank, in blocks."""

    def __init__(self, capacity_blocks: int):
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self.capacity = capacity_blocks
        self.used = 0
        self.pinned = 0  # resident blocks of pinned nodes
        self._res: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._pins: dict[int, int] = {}

    def resident(self, node: int) -> int:
        return self._res.get(node, 0)

    def lookup(self, path: PromptPath) -> int:
        """Blocks of `path`'s prefix resident here."""
        hit = 0
        res = self._res
        for node, blocks in path:
            r = res.get(node, 0)
            if r < blocks:
                return hit + r
            hit += blocks
        return hit

    def missing(self, path: PromptPath) -> int:
        """Blocks `insert(path)` would add."""
        res = self._res
        need = 0
        for node, blocks in path:
            have = res.get(node, 0)
            if blocks > have:
                need += blocks - have
        return need

    def can_hold(self, path: PromptPath) -> bool:
        """Whether `path` fits after evicting every unpinned block not on it."""
        need = self.missing(path)
        if need <= self.capacity - self.used:
            return True
        return need <= self.capacity - self.pinned - self._on_path_unpinned(path)

    def _on_path_unpinned(self, path: PromptPath) -> int:
        pins, res = self._pins, self._res
        return sum(res.get(n, 0) for n, _ in path if not pins.get(n))

    def insert(self, path: PromptPath) -> list[tuple[int, int]]:
        """Make `path` resident (as far as capacity allows) and most recent.

        Returns the evicted (node, blocks), for demotion to a lower tier.
        """
        evicted: list[tuple[int, int]] = []
        res, lru = self._res, self._lru
        need = 0
        for node, blocks in path:
            have = res.get(node, 0)
            if blocks > have:
                need += blocks - have
        if need:  # otherwise every node is resident far enough: only the LRU order changes
            if need > self.capacity - self.used:
                evicted = self._evict(need - (self.capacity - self.used), {n for n, _ in path})
            room = self.capacity - self.used
            pins = self._pins
            for node, blocks in path:  # grow root first so residency stays prefix-closed
                have = res.get(node, 0)
                add = blocks - have
                if add > room:
                    add = room
                if add > 0:
                    res[node] = have + add
                    self.used += add
                    room -= add
                    if pins.get(node):
                        self.pinned += add
                if have + add < blocks:
                    break
        for node, _ in reversed(path):
            if node in res:
                if node in lru:
                    lru.move_to_end(node)
                else:
                    lru[node] = None
        return evicted

    def _evict(self, blocks: int, keep: set[int]) -> list[tuple[int, int]]:
        victims = []
        freed = 0
        for node in self._lru:  # least recent first
            if freed >= blocks:
                break
            if node in keep or self._pins.get(node):
                continue
            victims.append(node)
            freed += self._res[node]
        out = []
        for node in victims:
            n = self._res.pop(node)
            del self._lru[node]
            self.used -= n
            out.append((node, n))
        return out

    def pin(self, path: PromptPath) -> None:
        pins, res = self._pins, self._res
        for node, _ in path:
            c = pins.get(node, 0)
            if c == 0:
                self.pinned += res.get(node, 0)
            pins[node] = c + 1

    def unpin(self, path: PromptPath) -> None:
        pins, res = self._pins, self._res
        for node, _ in path:
            c = pins[node] - 1
            if c == 0:
                del pins[node]
                self.pinned -= res.get(node, 0)
            else:
                pins[node] = c

    def demote(self, nodes: list[tuple[int, int]]) -> None:
        """Accept blocks evicted from the tier above (each node from its first block)."""
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
        # one walk for both: the GPU prefix stops at or before the GPU-or-host prefix
        gres, hres = self.gpu._res, self.host._res
        gpu = hit = 0
        on_gpu = True
        for node, blocks in path:
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
