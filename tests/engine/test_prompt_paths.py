"""Prompt paths over the per-session prefix tree (hand-built sessions)."""

from __future__ import annotations

from rackSim.workload.graph import RequestSpec, SessionGraph, SessionInstance


def _session():
    r0 = RequestSpec(rid=0, parent=None, prefix_tokens=0, new_tokens=1000, output_tokens=100)
    # turn 2 re-sends turn 1's whole context (1100 tokens) + 300 new
    r1 = RequestSpec(rid=1, parent=0, prefix_tokens=1100, new_tokens=300, output_tokens=50,
                     after=(0,))
    # a subagent sharing only the first 640 tokens (the system prompt) of turn 1
    r2 = RequestSpec(rid=2, parent=1, prefix_tokens=640, new_tokens=200, output_tokens=10,
                     after=(1,))
    return SessionInstance(SessionGraph("s", (r0, r1, r2)), key_base=1000)


def test_paths_cover_full_blocks_only():
    s = _session()
    assert s.prompt_path(0) == ((1000, 15),)                # 1000 // 64
    # turn 2 re-sends turn 1's whole context: it continues turn 1's node (one chain)
    assert s.prompt_path(1) == ((1000, 21),)                # 1400 // 64
    assert s.context_path(1) == ((1000, 22),)               # 1450 // 64
    assert s.graph.chain_heads == (0, 0, 2)
    # the subagent branches off the chain at token 640: a node of its own
    assert s.prompt_path(2) == ((1000, 10), (1002, 3))      # 840 // 64 - 640 // 64
    assert s.segments(2) == [(1000, 0, 640), (1002, 640, 840)]


def test_second_full_continuation_branches():
    r0 = RequestSpec(rid=0, parent=None, prefix_tokens=0, new_tokens=128, output_tokens=64)
    a = RequestSpec(rid=1, parent=0, prefix_tokens=192, new_tokens=64, output_tokens=1)
    b = RequestSpec(rid=2, parent=0, prefix_tokens=192, new_tokens=64, output_tokens=1)
    s = SessionInstance(SessionGraph("s", (r0, a, b)), key_base=0)
    assert s.graph.chain_heads == (0, 0, 2)  # only the first continuation joins the chain
    assert s.prompt_path(1) == ((0, 4),)
    assert s.prompt_path(2) == ((0, 3), (2, 1))


def test_paths_of_different_replays_do_not_share_nodes():
    a, b = _session(), SessionInstance(_session().graph, key_base=2000)
    nodes_a = {n for n, _ in a.prompt_path(1)}
    nodes_b = {n for n, _ in b.prompt_path(1)}
    assert not nodes_a & nodes_b
