"""A prefix cache over 64-token blocks with exact block-level LRU, at O(depth) per prompt.

Used by workload statistics to measure reuse at a given capacity. Residency is kept per
prefix-tree node as a stack of segments `[(end_block, stamp), ...]` from the node's first block
on, stamps non-increasing towards the tail: a prompt always touches a prefix of each node on
its path, so within a node the least recently used blocks are at the tail. Across nodes, a
heap of tail stamps finds the globally least recently used block. Within one prompt, deeper
nodes get older stamps, so they are evicted before their ancestors (as vLLM frees a request's
blocks tail first), and what is resident stays a prefix-closed set.
"""

from __future__ import annotations

import heapq

from rackSim.workload.graph import PromptPath

Stamp = tuple[int, int]


class BlockLruCache:
    """Blocks resident per node; `capacity_blocks=None` = infinite (no eviction)."""

    def __init__(self, capacity_blocks: int | None = None):
        self.capacity = capacity_blocks
        self.used = 0
        self._segs: dict[int, list[tuple[int, Stamp]]] = {}
        self._heap: list[tuple[Stamp, int]] = []
        self._clock = 0

    def resident(self, node: int) -> int:
        segs = self._segs.get(node)
        return segs[-1][0] if segs else 0

    def hit_blocks(self, path: PromptPath) -> int:
        """Leading blocks of `path` already resident (a prefix match stops at the first gap)."""
        hit = 0
        for node, blocks in path:
            r = self.resident(node)
            if r < blocks:
                return hit + r
            hit += blocks
        return hit

    def access(self, path: PromptPath, max_hit_blocks: int | None = None) -> int:
        """Look `path` up, then make all its blocks resident and most recent; return hits."""
        hit = self.hit_blocks(path)
        if max_hit_blocks is not None:
            hit = min(hit, max_hit_blocks)
        self._clock += 1
        depth = len(path)
        for i, (node, blocks) in enumerate(path):
            if blocks > 0:
                self._touch(node, blocks, (self._clock, depth - i))
        if self.capacity is not None:
            self._evict()
        return hit

    def _touch(self, node: int, k: int, stamp: Stamp) -> None:
        segs = self._segs.get(node)
        old = segs[-1][0] if segs else 0
        if k >= old:  # the whole node becomes one most-recent segment
            self._segs[node] = [(k, stamp)]
            self.used += k - old
            if self.capacity is not None:
                heapq.heappush(self._heap, (stamp, node))
            return
        i = 0
        while segs[i][0] <= k:
            i += 1
        segs[:i] = [(k, stamp)]

    def _evict(self) -> None:
        while self.used > self.capacity:
            stamp, node = heapq.heappop(self._heap)
            segs = self._segs.get(node)
            if not segs or segs[-1][1] != stamp:
                continue  # stale entry
            end = segs[-1][0]
            start = segs[-2][0] if len(segs) > 1 else 0
            take = min(end - start, self.used - self.capacity)
            self.used -= take
            if take < end - start:
                segs[-1] = (end - take, stamp)
                heapq.heappush(self._heap, (stamp, node))
                continue
            segs.pop()
            if segs:
                heapq.heappush(self._heap, (segs[-1][1], node))
            else:
                del self._segs[node]
