"""Deterministic synthetic token ids and 64-token block hashes for prompts.

Every token of a session's prefix tree is owned by one node (see `graph`), so a token id is a
counter-based hash of (node key, absolute position). Two prompts that share a prefix-tree prefix
therefore share exactly those token ids, and a real server's prefix cache sees the same sharing
the simulator models. A block hash is a hash of (owning node key, block index): equal for two
prompts exactly when their paths share that block's node. Everything here is vectorised numpy
(O(depth) Python work per prompt) and is meant for the validated mode and for checks, not for
the engine's hot path.
"""

from __future__ import annotations

import numpy as np

from rackSim.workload.graph import SessionInstance

FIRST_TOKEN_ID = 4  # ids 0..3 are left to the tokenizer's special tokens (bos, eos, pad, unk)
DEFAULT_VOCAB_SIZE = 32_000  # inside every common tokenizer's ordinary range

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_BLOCK_SALT = np.uint64(0xD6E8FEB86659FD93)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _hash(keys: np.ndarray, counters: np.ndarray, salt: np.uint64) -> np.ndarray:
    with np.errstate(over="ignore"):
        k = _mix(keys.astype(np.uint64) * _GOLDEN ^ salt)
        return _mix(k ^ (counters.astype(np.uint64) * _GOLDEN))


def segments(inst: SessionInstance, rid: int) -> list[tuple[int, int, int]]:
    """Token ownership of request `rid`'s prompt: [(node_key, start, end)] in token positions
    (see `SessionInstance.segments`)."""
    return inst.segments(rid)


def prompt_token_ids(inst: SessionInstance, rid: int,
                     vocab_size: int = DEFAULT_VOCAB_SIZE) -> np.ndarray:
    """Token ids (int64, in [4, vocab_size)) of request `rid`'s prompt, one per prompt token."""
    if vocab_size <= FIRST_TOKEN_ID:
        raise ValueError(f"vocab_size={vocab_size} must exceed {FIRST_TOKEN_ID}")
    segs = segments(inst, rid)
    lengths = np.array([e - s for _, s, e in segs], dtype=np.int64)
    keys = np.repeat(np.array([k for k, _, _ in segs], dtype=np.uint64), lengths)
    starts = np.repeat(np.array([s for _, s, _ in segs], dtype=np.int64), lengths)
    offsets = np.arange(int(lengths.sum()), dtype=np.int64)
    offsets -= np.repeat(np.cumsum(lengths) - lengths, lengths)
    h = _hash(keys, starts + offsets, np.uint64(0))
    span = np.uint64(vocab_size - FIRST_TOKEN_ID)
    return (h % span).astype(np.int64) + FIRST_TOKEN_ID


def output_spans(inst: SessionInstance, rid: int) -> list[tuple[int, int, int]]:
    """Where request `rid`'s prompt re-sends earlier requests' outputs: [(rid of the request
    that generated them, start, end)] in absolute token positions, nearest ancestor first.

    A prompt starts with the first `prefix_tokens` of its parent's context (the parent's
    prompt, then its output), so the parent's output fills [parent prompt, parent context)
    cut at the prefix, and so on up the chain of prefix parents. Empty for an explicit path
    (trace loaders), whose tokens are not split into prompts and outputs.
    """
    reqs = inst.graph.requests
    r = reqs[rid]
    if r.path is not None:
        return []
    out: list[tuple[int, int, int]] = []
    limit, a = r.prefix_tokens, r.parent
    while a is not None:
        p = reqs[a]
        if p.path is not None:
            break
        end = min(p.context_tokens, limit)
        if end > p.prompt_tokens:
            out.append((a, p.prompt_tokens, end))
        limit, a = min(limit, p.prefix_tokens), p.parent
    return out


def block_hashes(inst: SessionInstance, rid: int) -> np.ndarray:
    """Hashes (uint64) of the full 64-token blocks of request `rid`'s prompt, in order.

    Block i hashes (owning node key, i), the owning node being the path entry that covers it.
    """
    path = inst.prompt_path(rid)
    blocks = np.array([b for _, b in path], dtype=np.int64)
    keys = np.repeat(np.array([k for k, _ in path], dtype=np.uint64), blocks)
    return _hash(keys, np.arange(int(blocks.sum()), dtype=np.int64), _BLOCK_SALT)
