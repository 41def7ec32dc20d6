"""TieredPrefixCache.lookup walks both tiers at once; check it against two separate walks."""

from __future__ import annotations

import random

from rackSim.engine.prefix_cache import TieredPrefixCache


def _reference(c: TieredPrefixCache, path) -> tuple[int, int]:
    gpu = c.gpu.lookup(path)
    hit = 0
    for node, blocks in path:
        r = max(c.gpu.resident(node), c.host.resident(node))
        if r < blocks:
            hit += r
            break
        hit += blocks
    return gpu, hit - gpu


def test_one_walk_equals_two():
    rng = random.Random(3)
    c = TieredPrefixCache(gpu_blocks=40, host_blocks=60)
    paths = []
    for _ in range(400):
        depth = rng.randint(1, 3)
        root = rng.randrange(6)
        path = tuple((root * 10 + d, rng.randint(1, 12)) for d in range(depth))
        paths.append(path)
        c.insert(path)
        for p in rng.sample(paths, min(5, len(paths))):
            assert c.lookup(p) == _reference(c, p)
    assert c.host.used > 0
