"""Real trace loaders (Mooncake, Azure) and open-loop replay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rackSim.config.errors import ScenarioError
from rackSim.workload.graph import BLOCK_TOKENS, RequestSpec, SessionGraph, path_blocks
from rackSim.workload.jsonl import WorkloadFormatError, load_jsonl, save_jsonl
from rackSim.workload.open_loop import OpenLoopSchedule, OpenLoopSpec
from rackSim.workload.prefix_cache import BlockLruCache
from rackSim.workload.traces import (
    AZURE_KEY_BASE,
    TRACE_KEY_BASE,
    load_azure,
    load_mooncake,
)

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(),
                                  reason=f"public traces not found at {TRACES}")
REL = 0.005  # published means are rounded to whole tokens; allow 0.5 %


@pytest.fixture(scope="module")
def conversation() -> list[SessionGraph]:
    return load_mooncake(TRACES / "mooncake_conversation_trace.jsonl", seed=0)


def _means(graphs: list[SessionGraph]) -> tuple[float, float]:
    return (float(np.mean([g.requests[0].prompt_tokens for g in graphs])),
            float(np.mean([g.requests[0].output_tokens for g in graphs])))


@needs_traces
def test_mooncake_conversation_matches_published_facts(conversation) -> None:
    assert len(conversation) == 12_031
    prompt, out = _means(conversation)
    assert prompt == pytest.approx(12_035, rel=REL)
    assert out == pytest.approx(343, rel=REL)
    starts = np.array([g.start_s for g in conversation])
    assert np.all(np.diff(starts) >= 0)                      # arrival order
    assert 3_500 <= starts[-1] <= 3_600                      # about one hour
    for g in conversation[:500]:
        (r,) = g.requests
        assert r.path[0][0] >= TRACE_KEY_BASE
        assert path_blocks(r.path) == r.prompt_tokens // BLOCK_TOKENS


@needs_traces
def test_mooncake_synthetic_matches_published_facts() -> None:
    graphs = load_mooncake(TRACES / "mooncake_synthetic_trace.jsonl")
    assert len(graphs) == 3_993
    prompt, out = _means(graphs)
    assert prompt == pytest.approx(15_325, rel=REL)
    assert out == pytest.approx(149, rel=REL)
    # not bucketed: no jitter by default, arrivals are the raw timestamps
    raw = sorted(json.loads(x)["timestamp"] / 1e3
                 for x in (TRACES / "mooncake_synthetic_trace.jsonl").open())
    assert [g.start_s for g in graphs] == pytest.approx(raw)


@needs_traces
def test_mooncake_jitter_stays_inside_the_three_second_buckets(conversation) -> None:
    rows = [json.loads(x) for x in (TRACES / "mooncake_conversation_trace.jsonl").open()]
    bucket = {f"mooncake-{i + 1:06d}": round(r["timestamp"] / 3000) * 3.0
              for i, r in enumerate(rows)}
    offsets = np.array([g.start_s - bucket[g.session_id] for g in conversation])
    assert offsets.min() >= 0 and offsets.max() < 3.0
    assert abs(offsets.mean() - 1.5) < 0.05                  # uniform on [0, 3)


def test_mooncake_jitter_is_seeded(tmp_path: Path) -> None:
    f = _mc(tmp_path, [{**GOOD, "timestamp": t} for t in (0, 0, 2999, 3000, 6001)])
    one, again, other = load_mooncake(f, 0), load_mooncake(f, 0), load_mooncake(f, 1)
    assert one == again and one != other
    assert [g.start_s for g in load_mooncake(f, jitter_s=0.0)] == [0, 0, 2.999, 3, 6.001]


@needs_traces
def test_shared_hash_ids_become_shared_prefix_nodes(conversation) -> None:
    rows = [json.loads(x) for x in (TRACES / "mooncake_conversation_trace.jsonl").open()]
    by_id = {g.session_id: g.requests[0] for g in conversation}
    a, b = by_id["mooncake-000001"], by_id["mooncake-000002"]
    assert rows[0]["hash_ids"][0] == rows[1]["hash_ids"][0] == 0
    assert a.path[0] == b.path[0] == (TRACE_KEY_BASE, 8)
    assert a.path[1] != b.path[1]


@needs_traces
def test_azure_traces_load_as_fresh_prompts() -> None:
    for name, rows, prompt, out in (("azure2023_code.csv", 8_819, 2_048, 28),
                                    ("azure2023_conv.csv", 19_366, 1_155, 211)):
        graphs = load_azure(TRACES / name)
        assert len(graphs) == rows
        p, o = _means(graphs)
        assert p == pytest.approx(prompt, rel=REL) and o == pytest.approx(out, rel=0.02)
        keys = {g.requests[0].path[0][0] for g in graphs}
        assert len(keys) == rows and min(keys) >= AZURE_KEY_BASE
        assert graphs[0].start_s == 0 and 3_400 <= graphs[-1].start_s <= 3_600


@needs_traces
def test_trace_round_trips_through_jsonl(tmp_path: Path, conversation) -> None:
    save_jsonl(conversation[:2000], tmp_path / "m.jsonl")
    assert load_jsonl(tmp_path / "m.jsonl") == conversation[:2000]


def _mc(tmp_path: Path, rows: list) -> Path:
    f = tmp_path / "mc.jsonl"
    f.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return f


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


@pytest.mark.parametrize(("bad", "field", "fragment"), [
    ({"input_length": 1200}, "hash_ids", "2 ids, an input of 1200 tokens has 3 blocks"),
    ({"input_length": -1}, "input_length", ">= 0"),
    ({"input_length": 0, "hash_ids": []}, "input_length", ">= 1"),
    ({"output_length": 0}, "output_length", ">= 1"),
    ({"timestamp": "x"}, "timestamp", "number"),
    ({"hash_ids": [1, "a"]}, "hash_ids", "list of integers"),
    ({"hash_ids": None}, "hash_ids", "list of integers"),
])
def test_mooncake_errors_name_line_and_field(tmp_path: Path, bad: dict, field: str,
                                             fragment: str) -> None:
    with pytest.raises(WorkloadFormatError, match=fragment) as e:
        load_mooncake(_mc(tmp_path, [GOOD, {**GOOD, **bad}]))
    assert (e.value.line, e.value.field) == (2, field)


def test_mooncake_unreadable_line(tmp_path: Path) -> None:
    with pytest.raises(WorkloadFormatError) as e:
        load_mooncake(_mc(tmp_path, [GOOD, "{oops"]))
    assert (e.value.line, e.value.field) == (2, "<json>")


def test_mooncake_paths_and_radix_compression(tmp_path: Path) -> None:
    rows = [{**GOOD, "input_length": 1000},                       # 1 2
            {**GOOD, "input_length": 1600, "hash_ids": [1, 2, 3, 4]},
            {**GOOD, "input_length": 1100, "hash_ids": [1, 2, 5]}]
    f = _mc(tmp_path, rows)
    raw = [g.requests[0].path for g in load_mooncake(f, jitter_s=0.0, compress=False)]
    assert raw[0] == ((TRACE_KEY_BASE + 1, 8), (TRACE_KEY_BASE + 2, 7))
    assert raw[1][2:] == ((TRACE_KEY_BASE + 3, 8), (TRACE_KEY_BASE + 4, 1))
    # 1 is always followed by 2 (merged); 2 is followed by nothing, 3 or 5; 3 always by 4
    merged = [g.requests[0].path for g in load_mooncake(f, jitter_s=0.0)]
    assert merged == [((TRACE_KEY_BASE + 1, 15),),
                      ((TRACE_KEY_BASE + 1, 16), (TRACE_KEY_BASE + 3, 9)),
                      ((TRACE_KEY_BASE + 1, 16), (TRACE_KEY_BASE + 5, 1))]


@needs_traces
@pytest.mark.parametrize("capacity", [None, 30_000])
def test_radix_compression_keeps_cache_behaviour(conversation, capacity) -> None:
    raw = load_mooncake(TRACES / "mooncake_conversation_trace.jsonl", compress=False)[:3000]
    fast, slow = BlockLruCache(capacity), BlockLruCache(capacity)
    hits = [(fast.access(a.requests[0].path), slow.access(b.requests[0].path))
            for a, b in zip(conversation[:3000], raw, strict=True)]
    assert [a for a, _ in hits] == [b for _, b in hits]
    depth = np.mean([len(g.requests[0].path) for g in conversation])
    assert depth < 4 < np.mean([len(g.requests[0].path) for g in raw])


@pytest.mark.parametrize(("text", "line", "field"), [
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.97,5\n", 1, "GeneratedTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,5,1\nnope,5,1\n", 3,
     "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,5,1\n"
     "2023-11-16 18:17:04.97,0,1\n", 3, "ContextTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,5,1.5\n", 2,
     "GeneratedTokens"),
])
def test_azure_errors_name_line_and_field(tmp_path: Path, text: str, line: int,
                                          field: str) -> None:
    f = tmp_path / "a.csv"
    f.write_text(text)
    with pytest.raises(WorkloadFormatError) as e:
        load_azure(f)
    assert (e.value.line, e.value.field) == (line, field)


def _timed(starts: list[float]) -> list[SessionGraph]:
    return [SessionGraph(f"t{i}", (RequestSpec(0, None, 0, 100, 5),), s)
            for i, s in enumerate(starts)]


def test_open_loop_schedule_orders_speeds_up_and_windows() -> None:
    graphs = _timed([9.0, 1.0, 5.0, 3.0, 7.0])
    sched = OpenLoopSchedule(graphs, speedup=2.0, offset_s=2.0, window_s=2.5)
    sends = list(sched)
    assert [t for t, _ in sends] == [0.5, 1.5]
    assert [i.graph.session_id for _, i in sends] == ["t3", "t2"]
    assert len({i.key_base for _, i in sends}) == 2
    assert all(0 < i.key_base < 1 << 60 for _, i in sends)
    assert len(sched) == 2 and sched.duration_s == 1.5
    full = OpenLoopSchedule.from_spec(graphs, OpenLoopSpec(offset_s=0.5), window_s=100.0)
    assert [t for t, _ in full] == [0.5, 2.5, 4.5, 6.5, 8.5]


def test_a_window_no_request_arrives_in_is_refused() -> None:
    graphs = _timed([0.0, 4.0, 30.0, 31.0])
    OpenLoopSchedule(graphs, window_s=40.0).require_arrival_after(10.0)  # 30 and 31 are in
    OpenLoopSchedule(graphs, window_s=31.0).require_arrival_after(30.0)  # the window's start
    with pytest.raises(ScenarioError, match=r"window_s=15: no request .* \(5-20 s of the "
                       r"replay, after the 5-s warm-up; the last arrival before it is at 4\.0 "
                       r"s, the next after it at 30\.0 s\)"):
        OpenLoopSchedule(graphs, window_s=20.0).require_arrival_after(5.0)
    with pytest.raises(ScenarioError, match=r"window_s=10: .*no arrival after it\)"):
        OpenLoopSchedule(graphs, window_s=42.0).require_arrival_after(32.0)
    # the offset skips the whole trace: nothing before the window, nothing after it
    with pytest.raises(ScenarioError, match=r"warm-up; no arrival after it\); widen"):
        OpenLoopSchedule(graphs, offset_s=50.0, window_s=10.0).require_arrival_after(0.0)
    # sped up 10x, the arrival at trace 30 s is sent at 3 s
    OpenLoopSchedule(graphs, speedup=10.0, window_s=4.0).require_arrival_after(1.0)


def test_open_loop_needs_timestamps() -> None:
    with pytest.raises(ValueError, match="session 'c' has no start_s"):
        OpenLoopSchedule([SessionGraph("c", (RequestSpec(0, None, 0, 1, 1),))])
    with pytest.raises(ValueError, match="speedup"):
        OpenLoopSchedule(_timed([0.0]), speedup=0)


@needs_traces
def test_open_loop_replay_of_mooncake_at_speedup(conversation) -> None:
    sched = OpenLoopSchedule(conversation, speedup=4.0, window_s=600.0)
    times = np.array([t for t, _ in sched])
    assert np.all(np.diff(times) >= 0) and times[-1] < 600
    # 600 simulated seconds at 4x speed-up hold exactly the first 2400 trace seconds
    in_trace = sum(1 for g in conversation if g.start_s < 2400)
    assert len(sched) == in_trace


@st.composite
def _mooncake_rows(draw: st.DrawFn) -> list[dict]:
    """Rows whose hash ids share prefixes the way conversations do (each extends an earlier
    row's prefix with fresh ids)."""
    rows: list[list[int]] = []
    fresh = 0
    for _ in range(draw(st.integers(1, 12))):
        base: list[int] = []
        if rows and draw(st.booleans()):
            src = draw(st.sampled_from(rows))
            base = src[:draw(st.integers(0, len(src)))]
        n_new = draw(st.integers(0 if base else 1, 4))
        rows.append(base + list(range(fresh, fresh + n_new)))
        fresh += n_new
    out = []
    for ids in rows:
        tail = draw(st.integers(1, 512))
        out.append({"timestamp": 0, "input_length": 512 * (len(ids) - 1) + tail,
                    "output_length": 1, "hash_ids": ids})
    return out


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_mooncake_rows(), st.none() | st.integers(0, 60), st.randoms(use_true_random=False))
def test_radix_compression_is_invisible_to_any_lru(tmp_path: Path, rows, capacity, rnd) -> None:
    f = _mc(tmp_path, rows)
    merged = load_mooncake(f, jitter_s=0.0)
    raw = load_mooncake(f, jitter_s=0.0, compress=False)
    pairs = list(zip(merged, raw, strict=True))
    pairs += rnd.sample(pairs, len(pairs))
    fast, slow = BlockLruCache(capacity), BlockLruCache(capacity)
    for a, b in pairs:
        assert path_blocks(a.requests[0].path) == path_blocks(b.requests[0].path)
        assert fast.access(a.requests[0].path) == slow.access(b.requests[0].path)
        assert fast.used == slow.used
