"""Token ids and block hashes agree with the prefix tree."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies_workload import session_graphs
from token_support import token_block_hashes

from rackSim.workload.graph import BLOCK_TOKENS, RequestSpec, SessionGraph, SessionInstance
from rackSim.workload.tokens import (
    FIRST_TOKEN_ID,
    block_hashes,
    output_spans,
    prompt_token_ids,
)


@st.composite
def graph_and_two_requests(draw: st.DrawFn) -> tuple[SessionGraph, int, int]:
    """A session graph and two of its request ids (possibly the same)."""
    g = draw(session_graphs())
    rid = st.integers(0, len(g.requests) - 1)
    return g, draw(rid), draw(rid)


def _common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if len(diff) else n


def _tree_shared_tokens(g: SessionGraph, a: int, b: int) -> int:
    """Tokens two prompts share by construction: walk each to its owner chain, reference impl."""
    def owner(rid: int, pos: int) -> int:
        r = g.requests[rid]
        while pos < r.prefix_tokens:
            r = g.requests[r.parent]
        return r.rid
    ra, rb = g.requests[a], g.requests[b]
    n = min(ra.prompt_tokens, rb.prompt_tokens)
    for pos in range(n):
        if owner(a, pos) != owner(b, pos):
            return pos
    return n


@settings(max_examples=60, deadline=None)
@given(graph_and_two_requests())
def test_token_ids_share_exactly_the_tree_prefix(drawn: tuple[SessionGraph, int, int]) -> None:
    g, a, b = drawn
    inst = SessionInstance(g, key_base=5 << 20)
    ta, tb = prompt_token_ids(inst, a), prompt_token_ids(inst, b)
    assert len(ta) == g.requests[a].prompt_tokens
    assert ta.min(initial=FIRST_TOKEN_ID) >= FIRST_TOKEN_ID and ta.max(initial=0) < 32_000
    shared = _tree_shared_tokens(g, a, b)
    assert np.array_equal(ta[:shared], tb[:shared])
    # past the branch point the next token differs unless a 1/32000 id collision happens
    if shared < min(len(ta), len(tb)):
        assert _common(ta, tb) <= shared + 2


@settings(max_examples=60, deadline=None)
@given(graph_and_two_requests())
def test_block_hashes_match_token_content(drawn: tuple[SessionGraph, int, int]) -> None:
    g, a, b = drawn
    inst = SessionInstance(g, key_base=7 << 20)
    ha, hb = block_hashes(inst, a), block_hashes(inst, b)
    assert len(ha) == g.requests[a].prompt_tokens // BLOCK_TOKENS
    ca = token_block_hashes(prompt_token_ids(inst, a))
    cb = token_block_hashes(prompt_token_ids(inst, b))
    assert _common(ha, hb) == _common(ca, cb)


@settings(max_examples=30, deadline=None)
@given(session_graphs())
def test_different_sessions_never_share_hashes(g: SessionGraph) -> None:
    one, two = SessionInstance(g, key_base=1 << 20), SessionInstance(g, key_base=2 << 20)
    for r in g.requests:
        assert not set(block_hashes(one, r.rid)) & set(block_hashes(two, r.rid))


def test_long_prompt_is_vectorised_and_deterministic() -> None:
    reqs = (RequestSpec(0, None, 0, 100_000, 500),
            RequestSpec(1, 0, 100_500, 30_572, 10, after=(0,)))
    inst = SessionInstance(SessionGraph("long", reqs), key_base=3 << 20)
    ids = prompt_token_ids(inst, 1, vocab_size=129_280)
    assert len(ids) == 131_072
    assert np.array_equal(ids, prompt_token_ids(inst, 1, vocab_size=129_280))
    # first request's prompt is a prefix of the second one's
    assert np.array_equal(prompt_token_ids(inst, 0, vocab_size=129_280), ids[:100_000])
    # roughly uniform over the vocabulary
    assert abs(ids.mean() - (4 + 129_279) / 2) < 0.01 * 129_280


def test_explicit_path_tokens_follow_global_nodes() -> None:
    a = RequestSpec(0, None, 0, 1100, 5, path=((1 << 62, 8), (1 << 62 | 1, 9)))
    b = RequestSpec(0, None, 0, 600, 5, path=((1 << 62, 8), (1 << 62 | 2, 1)))
    ia = SessionInstance(SessionGraph("a", (a,)), key_base=1 << 20)
    ib = SessionInstance(SessionGraph("b", (b,)), key_base=2 << 20)
    ta, tb = prompt_token_ids(ia, 0), prompt_token_ids(ib, 0)
    assert _common(ta, tb) == 512
    assert _common(block_hashes(ia, 0), block_hashes(ib, 0)) == 8


@settings(max_examples=60, deadline=None)
@given(graph_and_two_requests())
def test_output_spans_are_exactly_the_ancestors_outputs(drawn: tuple[SessionGraph, int, int]
                                                         ) -> None:
    """Each prompt position belongs to an output span exactly when the request that owns it
    (walking up the prefix parents, reference `_owner_and_kind`) put it there as output."""
    g, rid, _ = drawn
    inst = SessionInstance(g, key_base=0)
    spans = output_spans(inst, rid)
    mark = {}
    for a, s, e in spans:
        assert 0 <= s < e <= g.requests[rid].prompt_tokens
        for pos in range(s, e):
            assert pos not in mark  # spans do not overlap
            mark[pos] = a
    for pos in range(g.requests[rid].prompt_tokens):
        assert mark.get(pos) == _output_owner(g, rid, pos)


def _output_owner(g: SessionGraph, rid: int, pos: int) -> int | None:
    """The request whose output token sits at `pos` of `rid`'s prompt, or None (an input
    token): walk up while the position lies inside the inherited prefix."""
    r = g.requests[rid]
    while pos < r.prefix_tokens:
        p = g.requests[r.parent]
        if pos >= p.prompt_tokens:
            return p.rid
        r = p
    return None


def test_output_spans_of_a_chain_and_a_fork() -> None:
    """A turn re-sends its predecessor's whole output; a fork that keeps only part of the
    parent's context gets only that part; an explicit path gets none."""
    r0 = RequestSpec(rid=0, parent=None, prefix_tokens=0, new_tokens=500, output_tokens=100)
    r1 = RequestSpec(rid=1, parent=0, prefix_tokens=600, new_tokens=50, output_tokens=20,
                     after=(0,))
    r2 = RequestSpec(rid=2, parent=1, prefix_tokens=560, new_tokens=10, output_tokens=5,
                     after=(1,))
    r3 = RequestSpec(rid=3, parent=1, prefix_tokens=670, new_tokens=10, output_tokens=5,
                     after=(1,))
    g = SessionGraph("s", (r0, r1, r2, r3))
    inst = SessionInstance(g, key_base=0)
    assert output_spans(inst, 0) == []
    assert output_spans(inst, 1) == [(0, 500, 600)]
    assert output_spans(inst, 2) == [(0, 500, 560)]
    assert output_spans(inst, 3) == [(1, 650, 670), (0, 500, 600)]
    traced = SessionGraph("t", (RequestSpec(rid=0, parent=None, prefix_tokens=0, new_tokens=128,
                                            output_tokens=1, path=((9, 2),)),))
    assert output_spans(SessionInstance(traced, 0), 0) == []
