"""TieredPrefixCache.lookup walks both tiers at once (from the GPU's first short node on deep
paths); check it against two separate walks of every node."""

from __future__ import annotations

import random

from rackSim.engine.prefix_cache import WALK_DEPTH, TieredPrefixCache


def _walk(path, resident) -> int:
    hit = 0
    for node, blocks in path:
        r = resident(node)
        if r < blocks:
            return hit + r
        hit += blocks
    return hit


def _reference(c: TieredPrefixCache, path) -> tuple[int, int]:
    gpu = _walk(path, c.gpu.resident)
    both = _walk(path, lambda n: max(c.gpu.resident(n), c.host.resident(n)))
    return gpu, both - gpu


def test_one_walk_equals_two():
    rng = random.Random(3)
    c = TieredPrefixCache(gpu_blocks=60, host_blocks=90)
    paths = []
    for _ in range(600):
        # chains of one prefix tree: node root*100 + d at depth d, its children covering
        # the same blocks of it (its branch point); the last node any number of blocks
        depth = rng.randint(1, 3 * WALK_DEPTH)
        root = rng.randrange(6)
        path = tuple((root * 100 + d, 1 + (root + d) % 3) for d in range(depth - 1))
        path += ((root * 100 + depth - 1, rng.randint(0, 12)),)
        paths.append(path)
        c.insert(path)
        for p in rng.sample(paths, min(5, len(paths))):
            assert c.lookup(p) == _reference(c, p)
    assert c.host.used > 0 and max(map(len, paths)) > WALK_DEPTH
