"""The graph's path cache gives every replay the paths computing them afresh would."""

from __future__ import annotations

from functools import lru_cache

from hypothesis import given, settings
from hypothesis import strategies as st

from rackSim.config import compose_scenario
from rackSim.workload.graph import RequestSpec, SessionGraph, SessionInstance
from rackSim.workload.sources import load_sessions


def _check(graphs: list[SessionGraph], key_bases: list[int]) -> None:
    for kb in key_bases:  # repeated bases and 0 read the cache the first base filled
        for g in graphs:
            inst = SessionInstance(g, key_base=kb)
            for r in g.requests:
                assert inst.prompt_path(r.rid) == inst._path(r.rid, r.prompt_tokens)
                assert inst.context_path(r.rid) == inst._path(r.rid, r.context_tokens)


def test_derived_paths_shift_with_the_key_base():
    cfg = compose_scenario(["experiment=smoke", "progress=false"])
    graphs = load_sessions(cfg.workload, cfg.seed)[:6]
    _check(graphs, [5 << 20, 0, (3 << 40) | (7 << 20), 5 << 20])


def test_explicit_paths_are_global():
    r0 = RequestSpec(rid=0, parent=None, prefix_tokens=0, new_tokens=1000, output_tokens=100,
                     path=((77, 15),))
    r1 = RequestSpec(rid=1, parent=0, prefix_tokens=1100, new_tokens=300, output_tokens=50,
                     after=(0,), path=((77, 17), (78, 4)))
    r2 = RequestSpec(rid=2, parent=1, prefix_tokens=640, new_tokens=200, output_tokens=10,
                     after=(1,))
    _check([SessionGraph("s", (r0, r1, r2))], [1 << 20, 0, 9 << 20])


def test_dependents_invert_the_dependency_edges():
    """The graph's cached `dependents` is exactly the inverse of every request's `after`, so a
    cursor built from it releases each request once all it waits on has finished."""
    from rackSim.workload.replay import SessionCursor

    cfg = compose_scenario(["experiment=smoke", "progress=false"])
    for g in load_sessions(cfg.workload, cfg.seed)[:6]:
        pairs = {(a, r.rid) for r in g.requests for a in r.after}
        assert {(a, c) for a, cs in enumerate(g.dependents) for c in cs} == pairs
        cursor = SessionCursor(SessionInstance(g, key_base=1 << 20))
        done: set[int] = set()
        ready = {s.rid for s in cursor.start()}
        for r in g.requests:  # topological order
            assert r.rid in ready and set(r.after) <= done
            done.add(r.rid)
            ready |= {s.rid for s in cursor.complete(r.rid)}
        assert cursor.done


@settings(max_examples=30, deadline=None)
@given(order=st.randoms(use_true_random=False))
def test_paths_shifted_from_the_last_equal_fresh_ones_in_any_order(order):
    """Sessions that branch every turn (the headline fit's workload: paths of tens of nodes)
    take a path's shifted nodes from the path shifted before it: asked in any order, across
    prompts and contexts, every path equals the one shifted afresh."""
    graphs = _branching_graphs()
    calls = [(g, r.rid, kind) for g in graphs for r in g.requests for kind in (0, 1)]
    order.shuffle(calls)
    insts = {id(g): SessionInstance(g, key_base=(3 << 40) | (9 << 20)) for g in graphs}
    for g, rid, kind in calls:
        inst, r = insts[id(g)], g.requests[rid]
        got = (inst.prompt_path, inst.context_path)[kind](rid)
        want = inst._path(rid, (r.prompt_tokens, r.context_tokens)[kind])
        assert got == want


@lru_cache(maxsize=1)
def _branching_graphs() -> list[SessionGraph]:
    cfg = compose_scenario(["workload=agentx_fitted", "workload.num_sessions=3",
                            "progress=false"])
    graphs = load_sessions(cfg.workload, cfg.seed)
    assert max(len(SessionInstance(g, 0).context_path(r.rid)) for g in graphs
               for r in g.requests) > 20
    return graphs
