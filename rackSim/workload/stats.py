"""Workload statistics: requests, tokens by kind, prefix reuse, the token mix, session shape
(turns, context growth, delays, fan-out), in-flight over time.

Time is *nominal*: no server is simulated. Each request takes `ttft_s + output_tokens x tpot_s`
(defaults: 1 s + 5 ms per token, about the published ~200 tokens/s per user; 0 and 0 give
zero service time). Closed-loop sessions (no `start_s`) run on `concurrency` lanes, each lane
starting its next session when the previous one ends (None = every session starts at 0);
timestamped sessions start at `start_s / speedup`. Prefix reuse replays the prompts in send
order through a block-LRU prefix cache (`prefix_cache`), prompt blocks inserted at send (the
prefill instance's view: generated tokens are not cached until a later prompt carries them).
As in vLLM, the last prompt token is always computed, so a hit covers at most
`(prompt_tokens - 1) // 64` blocks.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rackSim.workload.graph import (
    BLOCK_TOKENS,
    NOMINAL_TPOT_S,
    NOMINAL_TTFT_S,
    SessionGraph,
    SessionInstance,
    computed_path,
)
from rackSim.workload.prefix_cache import BlockLruCache


@dataclass(frozen=True)
class NominalTiming:
    """Service-time model and session start policy for statistics (not a simulation)."""

    ttft_s: float = NOMINAL_TTFT_S
    tpot_s: float = NOMINAL_TPOT_S
    concurrency: int | None = None
    speedup: float = 1.0


@dataclass
class WorkloadStats:
    """What `describe` measured: `summary` (flat numbers) and one row per request."""

    summary: dict[str, float | int | str]
    requests: pd.DataFrame
    inflight: pd.DataFrame = field(repr=False)


def timeline(graphs: Sequence[SessionGraph], timing: NominalTiming = NominalTiming()
             ) -> pd.DataFrame:
    """One row per request: session, rid, agent, send_s, finish_s and its token counts."""
    lanes = [0.0] * timing.concurrency if timing.concurrency else None
    cols: dict[str, list] = {k: [] for k in ("session", "rid", "agent", "send_s", "finish_s",
                                              "prompt", "new", "prefix", "output")}
    for j, g in enumerate(graphs):
        if g.start_s is not None:
            start = g.start_s / timing.speedup
        elif lanes is not None:
            start = heapq.heappop(lanes)
        else:
            start = 0.0
        send, finish = g.nominal_times(timing.ttft_s, timing.tpot_s, start)
        for r, s, f in zip(g.requests, send, finish, strict=True):
            for k, v in zip(cols, (j, r.rid, r.agent, s, f, r.prompt_tokens,
                                   r.new_tokens, r.prefix_tokens, r.output_tokens), strict=True):
                cols[k].append(v)
        if g.start_s is None and lanes is not None:
            heapq.heappush(lanes, max(finish))
    return pd.DataFrame(cols)


def prefix_hits(graphs: Sequence[SessionGraph], table: pd.DataFrame,
                capacities_tokens: Sequence[float | None], outputs_kept: bool = False
                ) -> list[np.ndarray]:
    """Cached prompt tokens per row of `table`, requests in send order through one LRU
    prefix cache of each capacity (tokens; None = infinite); the block paths are built once
    for all capacities.

    A request makes its prompt resident, or with `outputs_kept` its whole computed context
    (prompt and output less the last token, as a colocated instance that decoded it keeps
    it): then a later prompt that carries the output hits it too."""
    insts = [SessionInstance(g, key_base=(j + 1) << 20) for j, g in enumerate(graphs)]
    order = np.lexsort((table["rid"].to_numpy(), table["session"].to_numpy(),
                        table["send_s"].to_numpy()))
    sess, rid, prompt = (table[c].to_numpy() for c in ("session", "rid", "prompt"))
    if outputs_kept:
        paths = [computed_path(insts[sess[i]].context_path(int(rid[i])),
                               graphs[sess[i]].requests[int(rid[i])].context_tokens)
                 for i in order]
    else:
        paths = [insts[sess[i]].prompt_path(int(rid[i])) for i in order]
    most = [(int(prompt[i]) - 1) // BLOCK_TOKENS for i in order]  # the last block recomputes
    out = []
    for capacity in capacities_tokens:
        access = BlockLruCache(None if capacity is None
                               else int(capacity // BLOCK_TOKENS)).access
        hits = np.zeros(len(table), dtype=np.int64)
        hits[order] = [access(p, m) for p, m in zip(paths, most, strict=True)]
        out.append(hits * BLOCK_TOKENS)
    return out


def inflight(table: pd.DataFrame) -> pd.DataFrame:
    """In-flight requests as a step function: columns t_s, inflight (value from t_s on)."""
    t = np.concatenate([table["send_s"].to_numpy(), table["finish_s"].to_numpy()])
    d = np.concatenate([np.ones(len(table)), -np.ones(len(table))])
    order = np.lexsort((d, t))  # finishes before sends at equal times
    t, level = t[order], np.cumsum(d[order])
    last = np.append(t[1:] != t[:-1], True)
    return pd.DataFrame({"t_s": t[last], "inflight": level[last].astype(np.int64)})


def shape(graphs: Sequence[SessionGraph]) -> dict[str, float | int]:
    """Per-session structure: main-agent turns, context growth per turn (prompt tokens over
    the previous turn of the same agent; compactions make it negative), peak and first
    prompts, tool delays (s, requests that wait on another), forks and subagents per fork."""
    turns, peaks, firsts, growth, delays, fanout = [], [], [], [], [], []
    for g in graphs:
        reqs = g.requests
        turns.append(sum(1 for r in reqs if r.agent == 0))
        peaks.append(max(r.prompt_tokens for r in reqs))
        firsts.append(reqs[0].prompt_tokens)
        heads: dict[int, int] = {}
        for r in reqs:
            if r.after:
                delays.append(r.delay_s)
            if r.parent is None:
                continue
            if reqs[r.parent].agent == r.agent:
                growth.append(r.prompt_tokens - reqs[r.parent].prompt_tokens)
            else:
                heads[r.parent] = heads.get(r.parent, 0) + 1
        fanout += heads.values()
    med = {name: float(np.median(v)) if v else float("nan")
           for name, v in (("growth", growth), ("delay", delays))}
    return {
        "turns_per_session_mean": float(np.mean(turns)),
        "turns_per_session_p50": float(np.median(turns)),
        "first_prompt_tokens_p50": float(np.median(firsts)),
        "peak_prompt_tokens_p50": float(np.median(peaks)),
        "context_growth_tokens_per_turn_mean": float(np.mean(growth)) if growth else float("nan"),
        "context_growth_tokens_per_turn_p50": med["growth"],
        "delay_s_mean": float(np.mean(delays)) if delays else float("nan"),
        "delay_s_p50": med["delay"],
        "delay_s_p90": float(np.quantile(delays, 0.9)) if delays else float("nan"),
        "forks_per_session_mean": len(fanout) / len(graphs),
        "subagents_per_fork_mean": float(np.mean(fanout)) if fanout else 0.0,
    }


def context_growth_curve(graphs: Sequence[SessionGraph]) -> pd.DataFrame:
    """Main-agent prompt tokens by turn: columns turn (0 = first), sessions, prompt_p50,
    prompt_mean."""
    rows = [(k, r.prompt_tokens) for g in graphs
            for k, r in enumerate(r for r in g.requests if r.agent == 0)]
    df = pd.DataFrame(rows, columns=["turn", "prompt"])
    return df.groupby("turn")["prompt"].agg(sessions="size", prompt_p50="median",
                                            prompt_mean="mean").reset_index()


def reuse_curve(graphs: Sequence[SessionGraph], capacities_tokens: Sequence[float | None],
                timing: NominalTiming = NominalTiming()) -> pd.DataFrame:
    """Prefix reuse (cached / prompt tokens) per LRU capacity (tokens; None = infinite)."""
    tab = timeline(graphs, timing)
    total = tab["prompt"].sum()
    return pd.DataFrame({"capacity_tokens": [np.inf if c is None else c
                                             for c in capacities_tokens],
                         "reuse": [h.sum() / total
                                   for h in prefix_hits(graphs, tab, capacities_tokens)]})


def describe(graphs: Sequence[SessionGraph], timing: NominalTiming = NominalTiming(),
             cache_tokens: Sequence[float] = (1 << 20,), source: str = "") -> WorkloadStats:
    """Statistics of a workload; `cache_tokens` lists finite LRU capacities (tokens)."""
    if not graphs:
        raise ValueError("empty workload")
    tab = timeline(graphs, timing)
    hits = prefix_hits(graphs, tab, [None, *cache_tokens])
    tab["cached_inf"] = hits[0]
    for cap, h in zip(cache_tokens, hits[1:], strict=True):
        tab[f"cached_{int(cap)}"] = h
    flight = inflight(tab)
    dt = np.diff(flight["t_s"].to_numpy())
    span = flight["t_s"].iloc[-1] - flight["t_s"].iloc[0]
    branches = np.array([max(r.agent for r in g.requests) for g in graphs])
    per_session = tab.groupby("session").size().to_numpy()
    s: dict[str, float | int | str] = {
        "source": source, "sessions": len(graphs), "requests": len(tab),
        "requests_per_session_mean": float(per_session.mean()),
        "prompt_tokens": int(tab["prompt"].sum()), "new_tokens": int(tab["new"].sum()),
        "prefix_tokens": int(tab["prefix"].sum()), "output_tokens": int(tab["output"].sum()),
        "prompt_tokens_mean": float(tab["prompt"].mean()),
        "prompt_tokens_p50": float(tab["prompt"].median()),
        "prompt_tokens_p99": float(tab["prompt"].quantile(0.99)),
        "prompt_tokens_max": int(tab["prompt"].max()),
        "output_tokens_mean": float(tab["output"].mean()),
        "structural_prefix_share": float(tab["prefix"].sum() / tab["prompt"].sum()),
        "cached_tokens_inf": int(tab["cached_inf"].sum()),
        "reuse_inf": float(tab["cached_inf"].sum() / tab["prompt"].sum()),
    }
    tokens = tab["prompt"].sum() + tab["output"].sum()
    s.update({  # the token mix the pool implies when every reusable prefix is cached
        "mix_cached_inf": float(tab["cached_inf"].sum() / tokens),
        "mix_uncached_inf": float((tab["prompt"].sum() - tab["cached_inf"].sum()) / tokens),
        "mix_output": float(tab["output"].sum() / tokens),
    })
    s.update(shape(graphs))
    for cap in cache_tokens:
        col = f"cached_{int(cap)}"
        s[f"reuse_lru_{int(cap)}"] = float(tab[col].sum() / tab["prompt"].sum())
    s.update({
        "sessions_with_subagents": int((branches > 0).sum()),
        "subagents_per_session_mean": float(branches.mean()),
        "subagents_per_session_max": int(branches.max()),
        "duration_s": float(span),
        "inflight_peak": int(flight["inflight"].max()),
        "inflight_mean": float((flight["inflight"].to_numpy()[:-1] * dt).sum() / span)
        if span > 0 else float(flight["inflight"].max()),
        "ttft_s": timing.ttft_s, "tpot_s": timing.tpot_s,
        "concurrency": timing.concurrency or 0, "speedup": timing.speedup,
    })
    return WorkloadStats(s, tab, flight)
