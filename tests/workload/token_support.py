"""Test support: content hashes of token-id arrays, to check that the token ids the driver
sends agree with the prefix tree (equal block hashes <=> equal prefixes)."""

from __future__ import annotations

import numpy as np

from rackSim.workload.graph import BLOCK_TOKENS
from rackSim.workload.tokens import _GOLDEN, _mix


def token_block_hashes(token_ids: np.ndarray) -> np.ndarray:
    """Content hashes of the full 64-token blocks of a token-id array, prefix-dependent.

    Block i's hash depends on the tokens of blocks 0..i (a wrapping prefix sum of per-block
    mixes, then mixed with i), so equal values mean equal prefixes, like vLLM's chained block
    hashes. Used to check that token ids and the prefix tree agree.
    """
    n = len(token_ids) // BLOCK_TOKENS
    t = token_ids[: n * BLOCK_TOKENS].astype(np.uint64).reshape(n, BLOCK_TOKENS)
    cols = np.arange(BLOCK_TOKENS, dtype=np.uint64)
    with np.errstate(over="ignore"):
        per_block = _mix(np.bitwise_xor.reduce(_mix(t * _GOLDEN + cols), axis=1))
        prefix = np.cumsum(per_block, dtype=np.uint64)
        return _mix(prefix ^ (np.arange(n, dtype=np.uint64) * _GOLDEN))
