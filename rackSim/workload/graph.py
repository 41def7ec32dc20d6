"""Session graphs: agentic sessions as requests with prefix and dependency edges.

A request's prompt is the first `prefix_tokens` of its *prefix parent's* context (that parent's
prompt + output) followed by `new_tokens` of its own. The prompts of a session therefore form a
prefix tree: each request owns one node, covering the tokens of its context past the point where
it branched off its parent. KV blocks are 64 tokens, aligned to absolute positions; a block that
straddles a branch point holds the child's tokens, so it belongs to the child's node.

A turn that re-sends its parent's *whole* context continues the parent's token sequence, so a
chain of such turns (an agent's conversation) is one node, owned by the chain's first request:
the tree branches only where a subagent forks or a context is compacted, and paths are 1-3
nodes deep however many turns a session has. A turn that re-sends only part of its parent's
output branches, so such an agent's paths grow a node a turn.

A *prompt path* lists, root first, the nodes a prompt runs through and how many full blocks of
each it covers: `((node_key, blocks), ...)`. Caches track residency per node (blocks resident
from the node's first block), so a prefix lookup costs O(log depth), not O(blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

BLOCK_TOKENS = 64
#: Nominal latencies (no server): 1 s to the first token and 5 ms per output token, about the
#: published ~200 tokens/s per user (`stats.NominalTiming`, the replay's start points).
NOMINAL_TTFT_S, NOMINAL_TPOT_S = 1.0, 0.005

PromptPath = tuple[tuple[int, int], ...]
"""((node_key, full_blocks_covered), ...), root first."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One LLM call inside a session.

    rid: index within the session (requests are stored in topological order).
    parent: prefix parent (its context starts this prompt), or None for a fresh prompt.
    prefix_tokens: tokens taken from the parent's context (<= its prompt + output).
    new_tokens: new input tokens appended (tool results, user turn, instructions).
    output_tokens: tokens to generate (forced: ignore_eos).
    after: requests that must finish before this one is sent (chain predecessor, joins).
    delay_s: time between the last of `after` finishing and the send (tool / think time).
    agent: 0 for the main agent, i > 0 for the i-th subagent branch of the session.
    path: an explicit prompt path with global node keys (trace loaders); None = derived.
    """

    rid: int
    parent: int | None
    prefix_tokens: int
    new_tokens: int
    output_tokens: int
    after: tuple[int, ...] = ()
    delay_s: float = 0.0
    agent: int = 0
    path: PromptPath | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.prefix_tokens + self.new_tokens

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class SessionGraph:
    """A session: requests in topological order (every edge points to a lower rid)."""

    session_id: str
    requests: tuple[RequestSpec, ...]
    start_s: float | None = None  # open-loop arrival offset (timestamped traces); None = closed

    @cached_property
    def dependents(self) -> tuple[tuple[int, ...], ...]:
        """rid -> requests that wait on it (computed once per graph)."""
        out: list[list[int]] = [[] for _ in self.requests]
        for r in self.requests:
            for a in r.after:
                out[a].append(r.rid)
        return tuple(tuple(c) for c in out)

    @cached_property
    def chain_heads(self) -> tuple[int, ...]:
        """rid -> first request of its chain (the prefix-tree node that owns its tokens).

        A request continues its parent's chain when its prefix is the parent's whole context
        and no earlier request already continued it; otherwise it starts a node of its own.
        """
        heads: list[int] = []
        continued: set[int] = set()
        for r in self.requests:
            p = r.parent
            if (p is not None and p not in continued and r.path is None
                    and r.prefix_tokens == self.requests[p].context_tokens):
                continued.add(p)
                heads.append(heads[p])
            else:
                heads.append(r.rid)
        return tuple(heads)

    def nominal_times(self, ttft_s: float = NOMINAL_TTFT_S, tpot_s: float = NOMINAL_TPOT_S,
                      start_s: float = 0.0) -> tuple[list[float], list[float]]:
        """(send, finish) times of each request (s) if the session starts at `start_s` and
        every request takes `ttft_s` plus `tpot_s` per output token (no server: statistics
        and the replay's start points)."""
        send: list[float] = []
        finish: list[float] = []
        for r in self.requests:
            s = max((finish[a] for a in r.after), default=start_s) + r.delay_s
            send.append(s)
            finish.append(s + ttft_s + r.output_tokens * tpot_s)
        return send, finish

    @cached_property
    def path_cache(self) -> tuple[dict[int, PromptPath], dict[int, PromptPath]]:
        """(prompt, context) paths per rid with node keys relative to the replay's key base;
        filled on first use and shared by every replay of this graph."""
        return {}, {}


@dataclass(slots=True)
class SessionInstance:
    """One replay of a session graph; `key_base` makes its prefix-tree nodes unique."""

    graph: SessionGraph
    key_base: int
    lane: int = 0
    #: (key-base-0 path, shifted path) last shifted: the next one shares its prefix
    _last: tuple[PromptPath, PromptPath] = field(default=((), ()), init=False, repr=False,
                                                 compare=False)

    def prompt_path(self, rid: int) -> PromptPath:
        """Nodes and full blocks covered by request `rid`'s prompt, root first."""
        return self._cached(rid, self.graph.path_cache[0], self.graph.requests[rid].prompt_tokens)

    def context_path(self, rid: int) -> PromptPath:
        """Like `prompt_path` but through the generated output too (what decode holds after)."""
        return self._cached(rid, self.graph.path_cache[1],
                            self.graph.requests[rid].context_tokens)

    def path_through(self, rid: int, end_tokens: int) -> PromptPath:
        """The path through the first `end_tokens` of request `rid`'s context (not cached:
        for a request that generates less than its spec, such as a lane's one-token primer)."""
        return self._path(rid, end_tokens)

    def _cached(self, rid: int, cache: dict[int, PromptPath], end_tokens: int) -> PromptPath:
        """The path from the graph's cache (computed at key base 0), shifted to this replay's
        key base; explicit paths (trace loaders) carry global keys and are not shifted."""
        path = cache.get(rid)
        if path is None:
            path = cache[rid] = SessionInstance(self.graph, 0)._path(rid, end_tokens)
        kb = self.key_base
        if kb == 0 or self.graph.requests[rid].path is not None:
            return path
        if len(path) == 1:  # most paths are one chain deep
            (k, b), = path
            return ((k + kb, b),)
        # A turn's path extends its last turn's (an agent that branches every turn: ~50-300
        # nodes), so its shifted nodes are taken from the path shifted last, up to where the
        # two part (on root paths of one tree, nodes that differ once differ after).
        last, shifted = self._last
        n = min(len(last), len(path))
        at, step = n - 1, 1  # gallop from the end for a shared node (the two part near it)
        while at >= 0 and last[at] != path[at]:
            at, step = at - step, 2 * step
        # nodes up to `at` are shared; the one probed before it, at + step // 2, is not
        lo, hi = max(at, -1) + 1, at + step // 2
        while lo < hi:  # the length of the common prefix
            mid = (lo + hi) >> 1
            if last[mid] == path[mid]:
                lo = mid + 1
            else:
                hi = mid
        out = shifted[:lo] + tuple([(k + kb, b) for k, b in path[lo:]])
        self._last = (path, out)
        return out

    def segments(self, rid: int, end_tokens: int | None = None) -> list[tuple[int, int, int]]:
        """Token ownership of request `rid`'s prompt (or its first `end_tokens` of context):
        [(node_key, start, end)] in absolute token positions, root first.

        A node owns its chain's tokens from the chain head's `prefix_tokens` on. Explicit paths
        (trace loaders) give each node its blocks, the tail after the last full block belonging
        to the last node.
        """
        reqs = self.graph.requests
        r = reqs[rid]
        end = r.prompt_tokens if end_tokens is None else end_tokens
        if r.path is not None:
            out, pos = [], 0
            for key, blocks in r.path:
                out.append((key, pos, pos + blocks * BLOCK_TOKENS))
                pos += blocks * BLOCK_TOKENS
            if pos < end:
                key, start, _ = out[-1]
                out[-1] = (key, start, end)
            return out
        heads = self.graph.chain_heads
        h = reqs[heads[rid]]
        out = [(self.key_base + h.rid, h.prefix_tokens, end)]
        pos, p = h.prefix_tokens, h.parent
        while p is not None:
            q = reqs[heads[p]]
            if pos > q.prefix_tokens:
                out.append((self.key_base + q.rid, q.prefix_tokens, pos))
                pos = q.prefix_tokens
            p = q.parent
        out.reverse()
        return [s for s in out if s[2] > s[1]]

    def _path(self, rid: int, end_tokens: int) -> PromptPath:
        r = self.graph.requests[rid]
        if r.path is not None:
            if end_tokens == r.prompt_tokens:
                return r.path
            extra = end_tokens // BLOCK_TOKENS - r.prompt_tokens // BLOCK_TOKENS
            *head, (node, blocks) = r.path
            return (*head, (node, blocks + extra))
        path = []
        for key, start, end in self.segments(rid, end_tokens):
            blocks = end // BLOCK_TOKENS - start // BLOCK_TOKENS
            if blocks > 0:
                path.append((key, blocks))
        return tuple(path)


def path_blocks(path: PromptPath) -> int:
    """Blocks (64 tokens) a prompt path covers."""
    return sum(b for _, b in path)


def computed_path(path: PromptPath, tokens: int) -> PromptPath:
    """The blocks of a `tokens`-long context whose KV is computed when its request ends: all
    but the last token's (sampled, never fed back), so `path` less its last block when
    `tokens` fill that block exactly."""
    if tokens % BLOCK_TOKENS or not path:
        return path
    key, blocks = path[-1]
    return path[:-1] + ((key, blocks - 1),) if blocks > 1 else path[:-1]
