"""Hypothesis strategies shared by the workload tests: random valid session graphs."""

from __future__ import annotations

from hypothesis import strategies as st

from rackSim.workload.graph import RequestSpec, SessionGraph


@st.composite
def session_graphs(draw: st.DrawFn, max_requests: int = 8, session_id: str = "s") -> SessionGraph:
    """Small graphs whose lengths straddle 64-token block boundaries often."""
    n = draw(st.integers(1, max_requests))
    reqs: list[RequestSpec] = []
    for rid in range(n):
        parent = draw(st.none() | st.integers(0, rid - 1)) if rid else None
        if parent is None:
            prefix = 0
            new = draw(st.integers(1, 300))
        else:
            prefix = draw(st.integers(0, reqs[parent].context_tokens))
            new = draw(st.integers(0 if prefix else 1, 300))
        extra = draw(st.sets(st.integers(0, rid - 1), max_size=2)) if rid else set()
        after = tuple(sorted(extra | ({parent} if parent is not None else set())))
        reqs.append(RequestSpec(rid, parent, prefix, new, draw(st.integers(1, 200)), after,
                                draw(st.floats(0, 10, allow_nan=False)), draw(st.integers(0, 3))))
    return SessionGraph(session_id, tuple(reqs))
