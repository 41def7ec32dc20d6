"""Importing agent session logs: structure, token conservation, round trip, anonymisation."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rackSim.workload.agent_logs import import_sessions
from rackSim.workload.agentx import AgentXSpec, Dist, generate_agentx
from rackSim.workload.claude_code_logs import read_claude_code
from rackSim.workload.command import main
from rackSim.workload.jsonl import load_jsonl, save_jsonl
from rackSim.workload.openai_logs import read_openai
from rackSim.workload.stats import NominalTiming, timeline

FIXTURES = Path(__file__).parent / "fixtures" / "agent_logs"
CLAUDE, OPENAI = FIXTURES / "claude_code", FIXTURES / "openai"


def _claude():
    return import_sessions(read_claude_code(CLAUDE), "claude-code transcripts")


def _openai():
    return import_sessions(read_openai(OPENAI), "openai request logs")


def _shape(graph):
    return [(r.parent, r.prefix_tokens, r.new_tokens, r.output_tokens, r.after,
             round(r.delay_s, 3), r.agent) for r in graph.requests]


def test_claude_session_with_subagents_compaction_and_streamed_duplicates():
    graphs, report = _claude()
    assert report.sessions_read == 2 and not report.skipped
    assert report.duplicate_entries == 3       # two streamed calls in the main file, one in B
    forked = next(g for g in graphs if len(g.requests) == 11)
    # main chain 0,1,2 -> two subagents fork at 2 -> join at 8 -> compaction -> 9, 10
    assert _shape(forked) == [
        (None, 0, 18003, 180, (), 0.0, 0),
        (0, 18003, 1505, 250, (0,), 0.3, 0),
        (1, 19508, 704, 320, (1,), 3.0, 0),       # sent at the tool result, 14.0 - 11.0 s
        (2, 11000, 2503, 150, (2,), 0.5, 1),      # subagent a: system prompt read from cache
        (2, 11000, 1803, 200, (2,), 0.9, 2),      # subagent b, concurrent with a
        (3, 13653, 902, 90, (3,), 1.2, 1),
        (4, 12803, 602, 110, (4,), 0.7, 2),       # b's first call was streamed twice
        (6, 13405, 302, 75, (6,), 2.0, 2),
        (2, 20212, 2006, 200, (2, 5, 7), 1.0, 0),  # join: waits for both subagents' last calls
        (8, 11000, 3010, 120, (8,), 32.1, 0),     # after the compaction: only the system cached
        (9, 14010, 402, 60, (9,), 4.0, 0),
    ]
    assert report.root_cached_tokens == 12000 + 12000 and report.clipped_cached_tokens == 0


def _claude_calls() -> list[tuple[int, int, int]]:
    """(prompt, cache read, output) per API call, read straight from the fixture files."""
    calls: dict[str, tuple[int, int, int]] = {}
    for f in CLAUDE.rglob("*.jsonl"):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e.get("type") != "assistant" or e["message"]["model"] == "<synthetic>":
                continue
            u = e["message"]["usage"]
            prompt = u["input_tokens"] + u["cache_creation_input_tokens"] + \
                u["cache_read_input_tokens"]
            old = calls.get(e["requestId"], (0, 0, 0))
            calls[e["requestId"]] = (prompt, u["cache_read_input_tokens"],
                                     max(old[2], u["output_tokens"]))
    return list(calls.values())


def test_claude_tokens_preserved_per_call():
    graphs, report = _claude()
    raw = _claude_calls()
    got = [(r.prompt_tokens, r.output_tokens) for g in graphs for r in g.requests]
    assert Counter(got) == Counter((p, o) for p, _, o in raw)
    cached = sum(c for _, c, _ in raw)
    assert cached == sum(r.prefix_tokens for g in graphs for r in g.requests) + \
        report.root_cached_tokens + report.clipped_cached_tokens


def test_openai_log_of_the_same_session_gives_the_same_graph():
    claude = {len(g.requests): g for g in _claude()[0]}
    graphs, report = _openai()
    assert report.duplicate_entries == 1 and not report.skipped
    assert _shape(graphs[0]) == _shape(claude[11])
    raw = [json.loads(line) for line in (OPENAI / "requests-2026-11-20.jsonl").read_text()
           .splitlines()]
    unique = {r["id"]: r for r in raw}.values()
    assert Counter((r.prompt_tokens, r.output_tokens) for g in graphs for r in g.requests) == \
        Counter((r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]) for r in unique)


def test_openai_unlabelled_fork_keeps_the_full_context_child_on_the_main_chain():
    g = _openai()[0][1]
    assert _shape(g) == [
        (None, 0, 14004, 90, (), 0.0, 0),
        (0, 14004, 803, 400, (0,), 0.4, 0),
        (1, 12000, 600, 80, (1,), 0.5, 1),         # small cache read: a subagent
        (1, 14807, 583, 40, (1, 2), 2.0, 0),       # re-sends the whole prompt: main; joins it
    ]


def test_round_trip_import_jsonl_graphs(tmp_path):
    for graphs, report in (_claude(), _openai()):
        path = tmp_path / "pool.jsonl"
        save_jsonl(graphs, path, meta=report.meta())
        assert load_jsonl(path) == graphs


def test_command_writes_an_anonymised_pool(tmp_path, capsys):
    for logs in (CLAUDE, OPENAI):
        out = tmp_path / f"{logs.name}.jsonl"
        assert main(["import", str(logs), "--out", str(out)]) == 0
        text = out.read_text()
        assert load_jsonl(out)
        header = json.loads(text.splitlines()[0])
        assert header["meta"]["sessions_skipped"] == 0
        secrets = ["alice", "acme", "ledger", "payments", "5f0c2e1a", "0b6d9e44", "req_011",
                   "msg_01", "resp_", "conv_", "explorer", "a3f9c2d1", "2026-11", "1795685",
                   "toolu", "Grep", "round_half_even", "deepseek", "sonnet", "/home"]
        assert [s for s in secrets if s.lower() in text.lower()] == []
    assert "2 of 2 sessions imported" in capsys.readouterr().out


_SPEC = AgentXSpec(
    context_window=24_576,
    system_tokens=Dist(kind="lognormal", median=3000, sigma=0.3, min=500, max=6000),
    task_tokens=Dist(kind="lognormal", median=800, sigma=0.8, min=20, max=4000),
    turns=Dist(kind="lognormal", median=8, sigma=0.6, min=1, max=40),
    new_tokens=Dist(kind="lognormal", median=700, sigma=1.0, min=5, max=6000),
    summary_tokens=Dist(kind="lognormal", median=900, sigma=0.3, min=200, max=2000),
    subagent_prob=0.3, subagent_turns=Dist(kind="lognormal", median=3, sigma=0.5, min=1, max=9))


def _as_openai_log(graphs, path: Path) -> list[list[int]]:
    """Write `graphs` as an OpenAI request log (nominal times); return, per session, the rids
    in the order the importer will number them (by send time)."""
    tab = timeline(graphs, NominalTiming(ttft_s=0.7, tpot_s=0.004))
    orders = []
    with open(path, "w") as f:
        for j, g in enumerate(graphs):
            rows = tab[tab["session"] == j].set_index("rid")
            for r in g.requests:
                f.write(json.dumps({
                    "id": f"c{j}-{r.rid}", "conversation_id": f"conv-{j}",
                    "previous_response_id": None if r.parent is None else f"c{j}-{r.parent}",
                    "agent_id": f"agent-{r.agent}",
                    "created": 1.7e9 + rows.at[r.rid, "send_s"],
                    "completed_at": 1.7e9 + rows.at[r.rid, "finish_s"],
                    "usage": {"prompt_tokens": r.prompt_tokens,
                              "completion_tokens": r.output_tokens,
                              "prompt_tokens_details": {"cached_tokens": r.prefix_tokens}}})
                        + "\n")
            orders.append(sorted(range(len(g.requests)), key=lambda i, rows=rows: (
                rows.at[i, "send_s"], rows.at[i, "finish_s"], i)))
    return orders


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_generated_sessions_survive_a_log_round_trip(tmp_path_factory, seed):
    """Sessions logged call by call (ids, links, agent labels, times) import back to the same
    graphs: every token count, edge, delay and agent branch."""
    graphs = generate_agentx(_SPEC, seed, num_sessions=4)
    path = tmp_path_factory.mktemp("log") / "calls.jsonl"
    orders = _as_openai_log(graphs, path)
    got, report = import_sessions(read_openai(path), "openai request logs", strict=True)
    assert report.root_cached_tokens == 0 and report.clipped_cached_tokens == 0
    for g, h, order in zip(graphs, got, orders, strict=True):
        new_rid = {old: i for i, old in enumerate(order)}
        for old, r in zip(order, h.requests, strict=True):
            o = g.requests[old]
            assert (r.prefix_tokens, r.new_tokens, r.output_tokens) == \
                (o.prefix_tokens, o.new_tokens, o.output_tokens)
            assert r.parent == (None if o.parent is None else new_rid[o.parent])
            assert set(r.after) == {new_rid[a] for a in o.after}
            assert abs(r.delay_s - o.delay_s) < 1e-5
        # agents are numbered by first send; the branches themselves match
        branches = {frozenset(new_rid[r.rid] for r in g.requests if r.agent == a)
                    for a in {r.agent for r in g.requests}}
        assert branches == {frozenset(r.rid for r in h.requests if r.agent == a)
                            for a in {r.agent for r in h.requests}}


def test_one_session_file_brings_its_subagents_and_inline_side_chains_read_the_same(
        tmp_path):
    """LOGS may be one session file (its subagents/ come along); side chains written into the
    main file (older transcripts) give the same graph as side-chain files."""
    project = CLAUDE / "-home-alice-work-acme-payments"
    main_file = project / "5f0c2e1a-7d41-4b8e-9a57-3c2d1e0f9b88.jsonl"
    (one,), _ = import_sessions(read_claude_code(main_file), "claude-code transcripts")
    forked = next(g for g in _claude()[0] if len(g.requests) == 11)
    assert _shape(one) == _shape(forked)
    inline = tmp_path / "session.jsonl"
    sides = sorted((project / main_file.stem / "subagents").glob("agent-*.jsonl"))
    inline.write_text(main_file.read_text() + "".join(p.read_text() for p in sides))
    (merged,), _ = import_sessions(read_claude_code(inline), "claude-code transcripts")
    assert _shape(merged) == _shape(forked)
