"""Loaders for public timestamped traces: Mooncake JSONL and Azure LLM-inference CSV.

Each trace request becomes a one-request `SessionGraph` with `start_s` (open-loop arrival,
seconds from the trace start) and an explicit prompt `path` whose node keys live in a global
namespace at or above `TRACE_KEY_BASE` = 2**62, so they never collide with session-scoped keys
(`key_base + rid`, below 2**60).

Mooncake: every `hash_ids` entry names a 512-token block of the prompt; equal ids mean equal
content *and* equal prefix. Each id becomes one prefix-tree node covering eight 64-token
blocks (the last id: the full 64-token blocks of its remainder), key `TRACE_KEY_BASE + id`;
runs of ids that always occur together are merged into one node keyed by the run's first id
(the same cache behaviour with far shorter paths).
Timestamps (ms) of the conversation trace are quantised to 3-second buckets: arrivals are
spread uniformly inside their bucket with a seeded jitter.

Azure: no prefix information, so every prompt is fresh: one node of its own, key
`TRACE_KEY_BASE + 2**60 + row`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from rackSim.workload.graph import BLOCK_TOKENS, RequestSpec, SessionGraph
from rackSim.workload.jsonl import TraceFormatError

TRACE_KEY_BASE = 1 << 62
AZURE_KEY_BASE = TRACE_KEY_BASE + (1 << 60)
MOONCAKE_BLOCK_TOKENS = 512
MOONCAKE_BUCKET_S = 3.0
_SUB = MOONCAKE_BLOCK_TOKENS // BLOCK_TOKENS
_QUANTISED_SHARE = 0.99  # share of timestamps within 5 ms of a bucket edge => quantised trace


def load_mooncake(path: str | Path, seed: int = 0, jitter_s: float | None = None,
                  compress: bool = True) -> list[SessionGraph]:
    """Requests of a Mooncake trace in arrival order (jittered `start_s`, seconds).

    jitter_s: width of the uniform jitter added to each timestamp; None = `MOONCAKE_BUCKET_S`
    if the timestamps are quantised to 3-second buckets (then snapped to the bucket start
    first), else 0.
    compress: merge runs of hash ids that always occur together (radix-tree compression):
    same reuse, ~8x shorter prompt paths (conversation trace: 24 -> 3.1 nodes per request).
    """
    rows = []
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, 1):
            if text.strip():
                rows.append((line, _mooncake_row(path, line, text)))
    if not rows:
        raise TraceFormatError(path, 1, "timestamp", "empty trace")
    t_ms = np.array([r[1][0] for r in rows], dtype=np.float64)
    bucket_ms = MOONCAKE_BUCKET_S * 1e3
    snapped = np.round(t_ms / bucket_ms)
    quantised = np.mean(np.abs(t_ms - snapped * bucket_ms) <= 5) >= _QUANTISED_SHARE
    if jitter_s is None:
        jitter_s = MOONCAKE_BUCKET_S if quantised else 0.0
    t = t_ms / 1e3
    if jitter_s > 0:
        if quantised:
            t = snapped * MOONCAKE_BUCKET_S
        t = t + np.random.default_rng(seed).uniform(0.0, jitter_s, len(t))
    order = np.argsort(t, kind="stable")
    joined = _always_joined([r[1][3] for r in rows]) if compress else set()
    graphs = []
    for i in order:
        line, (_, prompt, out, hashes) = rows[i]
        path_: list[tuple[int, int]] = []
        for k, h in enumerate(hashes):
            b = min(_SUB, (prompt - MOONCAKE_BLOCK_TOKENS * k) // BLOCK_TOKENS)
            if k and hashes[k - 1] in joined:
                path_[-1] = (path_[-1][0], path_[-1][1] + b)
            else:
                path_.append((TRACE_KEY_BASE + h, b))
        req = RequestSpec(0, None, 0, prompt, out, path=tuple(path_))
        graphs.append(SessionGraph(f"mooncake-{line:06d}", (req,), float(t[i])))
    return graphs


def _always_joined(paths: list[list[int]]) -> set[int]:
    """Ids always followed by the same id, which occurs exactly as often: one node together."""
    count: dict[int, int] = {}
    nxt: dict[int, int | None] = {}
    mixed = -1
    for ids in paths:
        for k, h in enumerate(ids):
            count[h] = count.get(h, 0) + 1
            n = ids[k + 1] if k + 1 < len(ids) else None
            if nxt.setdefault(h, n) != n:
                nxt[h] = mixed
    return {h for h, n in nxt.items()
            if n is not None and n != mixed and count[n] == count[h]}


def _mooncake_row(path: str | Path, line: int, text: str) -> tuple[float, int, int, list[int]]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(path, line, "<json>", f"not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise TraceFormatError(path, line, "<json>", "expected a JSON object")
    vals = []
    for fld in ("timestamp", "input_length", "output_length"):
        v = row.get(fld)
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or v != v:
            raise TraceFormatError(path, line, fld, f"must be a number >= 0, got {v!r}")
        vals.append(v)
    ts, prompt, out = vals
    if int(prompt) != prompt or prompt < 1:
        raise TraceFormatError(path, line, "input_length", f"must be an integer >= 1, got "
                                                              f"{prompt!r}")
    if int(out) != out or out < 1:
        raise TraceFormatError(path, line, "output_length", f"must be an integer >= 1, got "
                                                               f"{out!r}")
    hashes = row.get("hash_ids")
    if not isinstance(hashes, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 1 << 60 for h in hashes):
        raise TraceFormatError(path, line, "hash_ids", "must be a list of integers in "
                                                          "[0, 2**60)")
    want = -(-int(prompt) // MOONCAKE_BLOCK_TOKENS)
    if len(hashes) != want:
        raise TraceFormatError(path, line, "hash_ids", f"{len(hashes)} ids, an input of "
                                  f"{prompt} tokens has {want} blocks of 512")
    return float(ts), int(prompt), int(out), hashes


_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def load_azure(path: str | Path) -> list[SessionGraph]:
    """Requests of an Azure LLM-inference trace CSV (`start_s` from the first row, seconds)."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    for col in _AZURE_COLUMNS:
        if col not in df.columns:
            raise TraceFormatError(path, 1, col, f"missing column (have {list(df.columns)})")
    if df.empty:
        raise TraceFormatError(path, 2, "TIMESTAMP", "empty trace")
    ts = pd.to_datetime(df["TIMESTAMP"], format="ISO8601", errors="coerce")
    _first_bad(path, ts.isna().to_numpy(), "TIMESTAMP", df["TIMESTAMP"], "not a timestamp")
    lengths = {}
    for col in _AZURE_COLUMNS[1:]:
        v = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(v) | (v < 1) | (v != np.round(v))
        _first_bad(path, bad, col, df[col], "must be an integer >= 1")
        lengths[col] = v.astype(np.int64)
    t = (ts - ts.min()).dt.total_seconds().to_numpy()
    order = np.argsort(t, kind="stable")
    prompt, out = lengths["ContextTokens"], lengths["GeneratedTokens"]
    return [SessionGraph(
        f"azure-{i + 2:06d}",
        (RequestSpec(0, None, 0, int(prompt[i]), int(out[i]),
                     path=((AZURE_KEY_BASE + int(i), int(prompt[i]) // BLOCK_TOKENS),)),),
        float(t[i])) for i in order]


def _first_bad(path: str | Path, bad: np.ndarray, col: str, values: pd.Series,
               what: str) -> None:
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceFormatError(path, i + 2, col, f"{what}, got {values.iloc[i]!r}")
