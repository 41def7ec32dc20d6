"""AgentX-style generator: valid, acyclic, deterministic, window-bounded, hash-consistent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from token_support import token_block_hashes

from rackSim.workload.agentx import AgentXSpec, Dist, generate_agentx
from rackSim.workload.graph import BLOCK_TOKENS, SessionGraph, SessionInstance
from rackSim.workload.jsonl import load_jsonl, save_jsonl
from rackSim.workload.tokens import block_hashes, prompt_token_ids


def _ancestors(g: SessionGraph, rid: int) -> set[int]:
    seen, todo = set(), list(g.requests[rid].after)
    while todo:
        x = todo.pop()
        if x not in seen:
            seen.add(x)
            todo.extend(g.requests[x].after)
    return seen


def _check_graph(g: SessionGraph, window: int) -> None:
    for r in g.requests:
        assert all(a < r.rid for a in r.after)  # topological => acyclic
        assert r.new_tokens >= 0 and r.output_tokens >= 1 and r.prompt_tokens >= 1
        assert r.context_tokens <= window
        if r.parent is not None:
            assert r.parent in _ancestors(g, r.rid)
            assert r.prefix_tokens <= g.requests[r.parent].context_tokens
        else:
            assert r.prefix_tokens == 0


specs = st.builds(
    AgentXSpec,
    num_sessions=st.integers(1, 4),
    context_window=st.sampled_from([32_768, 65_536, 131_072]),
    compact_at=st.floats(0.6, 0.7),
    subagent_prob=st.floats(0, 0.2),
    subagent_max_depth=st.integers(0, 2),
    subagent_prefix=st.sampled_from(["system", "context"]),
    resent_output_share=st.sampled_from([1.0, 0.3]),
    turns=st.builds(Dist, kind=st.just("lognormal"), median=st.floats(1, 40),
                    sigma=st.floats(0, 1), min=st.just(1.0), max=st.just(80.0)),
    system_tokens=st.just(Dist(kind="uniform", low=1000, high=8000)),
    summary_tokens=st.just(Dist(kind="constant", value=2000, max=2000)),
)


@settings(max_examples=40, deadline=None)
@given(specs, st.integers(0, 2**32 - 1))
def test_generated_graphs_are_valid_and_deterministic(spec: AgentXSpec, seed: int) -> None:
    graphs = generate_agentx(spec, seed)
    assert len(graphs) == spec.num_sessions
    assert graphs == generate_agentx(spec, seed)
    for g in graphs:
        _check_graph(g, spec.context_window)
        assert max(r.agent for r in g.requests) <= len(g.requests)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**32 - 1))
def test_token_ids_and_hashes_agree_on_generated_sessions(tmp_path: Path, seed: int) -> None:
    spec = AgentXSpec(subagent_prob=0.3, turns=Dist(kind="constant", value=6),
                      system_tokens=Dist(kind="constant", value=3000),
                      task_tokens=Dist(kind="constant", value=500))
    (g,) = generate_agentx(spec, seed, num_sessions=1)
    inst = SessionInstance(g, key_base=9 << 20)
    last = g.requests[-1]
    content = token_block_hashes(prompt_token_ids(inst, last.rid))
    for r in g.requests[:-1]:
        mine = token_block_hashes(prompt_token_ids(inst, r.rid))
        n = min(len(mine), len(content))
        same_content = int(np.argmin(np.append(mine[:n] == content[:n], False)))
        hb, hl = block_hashes(inst, r.rid), block_hashes(inst, last.rid)
        same_hash = int(np.argmin(np.append(hb[:n] == hl[:n], False)))
        assert same_hash == same_content
    # every session's system prompt is shared by all its agents' prompts
    sys_blocks = 3000 // BLOCK_TOKENS
    heads = {block_hashes(inst, r.rid)[:sys_blocks].tobytes() for r in g.requests}
    assert len(heads) == 1
    # another replay of the same session (other key_base) shares no block with this one
    other = SessionInstance(g, key_base=10 << 20)
    assert not set(block_hashes(other, last.rid)) & set(block_hashes(inst, last.rid))
    # hashes written to a file pass the loader's prefix-consistency check
    save_jsonl([g], tmp_path / "g.jsonl", with_hashes=True)
    assert load_jsonl(tmp_path / "g.jsonl") == [g]


def test_default_pool_has_the_documented_shape() -> None:
    spec = AgentXSpec()
    graphs = generate_agentx(spec, seed=0)
    assert len(graphs) == 393
    reqs = [r for g in graphs for r in g.requests]
    first = np.array([g.requests[0].prompt_tokens for g in graphs])
    peak = np.array([max(r.prompt_tokens for r in g.requests) for g in graphs])
    out = np.array([r.output_tokens for r in reqs])
    delay = np.array([r.delay_s for r in reqs if r.after])
    main_turns = np.array([sum(r.agent == 0 for r in g.requests) for g in graphs])
    forked = np.mean([any(r.agent for r in g.requests) for g in graphs])
    assert 14_000 <= np.median(first) <= 20_000          # ~15-30K first prompts
    assert np.percentile(peak, 75) >= 80_000             # long sessions grow to ~100K
    assert peak.max() <= spec.context_window
    assert 20 <= np.median(main_turns) <= 40             # tens of turns
    assert 250 <= out.mean() <= 450                      # a few hundred output tokens
    assert 1.0 <= np.median(delay) <= 2.5 and 2.0 <= delay.mean() <= 5.0
    assert 0.3 <= forked <= 0.7                          # occasional fan-out
    assert generate_agentx(spec, seed=1) != graphs
    assert generate_agentx(spec, seed=0, num_sessions=5) == graphs[:5]


def test_join_waits_for_every_subagent_and_reads_their_answers() -> None:
    spec = AgentXSpec(subagent_prob=1.0, fanout=Dist(kind="constant", value=3),
                      turns=Dist(kind="constant", value=2),
                      subagent_turns=Dist(kind="constant", value=2))
    (g,) = generate_agentx(spec, seed=3, num_sessions=1)
    main = [r for r in g.requests if r.agent == 0]
    assert len(main) == 2 and len(g.requests) == 2 + 3 * 2
    ends = [max(r.rid for r in g.requests if r.agent == a) for a in (1, 2, 3)]
    join = main[1]
    assert set(join.after) == {main[0].rid, *ends}
    answers = sum(g.requests[e].output_tokens + spec.join_overhead_tokens for e in ends)
    assert join.new_tokens >= answers
    heads = [min(r.rid for r in g.requests if r.agent == a) for a in (1, 2, 3)]
    assert all(g.requests[h].after == (main[0].rid,) for h in heads)


def test_reasoning_dropped_between_turns() -> None:
    """With resent_output_share s, a turn continues the previous *prompt* and re-sends
    round(s x previous output) as new tokens; the draws are those of s = 1, so only the
    prompts change."""
    base = dict(subagent_prob=0.0, turns=Dist(kind="constant", value=12))
    (full,) = generate_agentx(AgentXSpec(**base), seed=5, num_sessions=1)
    (part,) = generate_agentx(AgentXSpec(resent_output_share=0.25, **base), seed=5,
                              num_sessions=1)
    for a, b in zip(full.requests[1:], part.requests[1:], strict=True):
        prev_a, prev_b = full.requests[a.parent], part.requests[b.parent]
        assert a.prefix_tokens == prev_a.context_tokens  # the whole response re-sent
        assert b.prefix_tokens == prev_b.prompt_tokens   # reasoning dropped
        tool = a.new_tokens
        assert b.new_tokens == tool + round(0.25 * prev_b.output_tokens)
        assert b.output_tokens == a.output_tokens
    assert part.requests[-1].prompt_tokens < full.requests[-1].prompt_tokens


def test_nested_fan_out_is_bounded() -> None:
    spec = AgentXSpec(subagent_prob=1.0, subagent_max_depth=5, max_fork_requests=300,
                      turns=Dist(kind="constant", value=10))
    (g,) = generate_agentx(spec, seed=0, num_sessions=1)
    _check_graph(g, spec.context_window)
    assert 300 <= len(g.requests) < 300 + 5 * 5 * 60


def test_long_sessions_compact_instead_of_overflowing() -> None:
    spec = AgentXSpec(context_window=32_768, turns=Dist(kind="constant", value=60),
                      system_tokens=Dist(kind="constant", value=3000),
                      subagent_prob=0.0, summary_tokens=Dist(kind="constant", value=2000))
    (g,) = generate_agentx(spec, seed=0, num_sessions=1)
    _check_graph(g, 32_768)
    restarts = [r for r in g.requests if r.parent is not None
                and r.prefix_tokens < g.requests[r.parent].context_tokens]
    assert restarts, "a 60-turn session must compact in a 32K window"
    for r in restarts:  # continue from the system prompt + the summary
        assert r.new_tokens >= g.requests[r.parent].output_tokens == 2000


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"compact_at": 0.99}, "compact_at=0.99"),
    ({"num_sessions": 0}, "num_sessions"),
    ({"turns": {"kind": "lognormal", "median": 5}}, "exactly ['median', 'sigma']"),
    ({"turns": {"kind": "uniform", "low": 5, "high": 1}}, "low=5.0 exceeds"),
    ({"fanout": {"kind": "constant", "value": 2, "mean": 3}}, "exactly ['value']"),
    ({"bogus": 1}, "bogus"),
    ({"subagent_max_depth": 1.5}, "subagent_max_depth"),
])
def test_spec_errors_name_the_field(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        AgentXSpec.model_validate(kwargs)
