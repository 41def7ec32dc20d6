"""JSONL workload files: exact round trip, and every malformed case names line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies_workload import session_graphs

from rackSim.workload.graph import RequestSpec, SessionGraph, SessionInstance
from rackSim.workload.jsonl import WorkloadFormatError, load_jsonl, save_jsonl
from rackSim.workload.tokens import block_hashes


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(session_graphs(), min_size=1, max_size=4), st.booleans())
def test_round_trip_is_exact(tmp_path: Path, graphs: list[SessionGraph], timed: bool) -> None:
    graphs = [SessionGraph(f"s{i}", g.requests, 1.5 * i if timed else None)
              for i, g in enumerate(graphs)]
    f = tmp_path / "w.jsonl"
    save_jsonl(graphs, f, meta={"source": "test"})
    assert load_jsonl(f) == graphs


def test_round_trip_with_paths_and_hashes(tmp_path: Path) -> None:
    g = SessionGraph("t", (RequestSpec(0, None, 0, 700, 3, path=((1 << 62, 8), (1 << 62 | 9, 2))),
                           RequestSpec(1, None, 0, 100, 4, after=(0,), delay_s=0.25)), 12.0)
    save_jsonl([g], tmp_path / "w.jsonl", with_hashes=True)
    rows = [json.loads(x) for x in (tmp_path / "w.jsonl").open()]
    inst = SessionInstance(g, key_base=0)
    assert rows[2]["hashes"] == [int(h) >> 1 for h in block_hashes(inst, 0)]
    assert len(rows[3]["hashes"]) == 1
    assert load_jsonl(tmp_path / "w.jsonl") == [g]


def _good() -> list[dict]:
    return [
        {"format": "racksim-workload", "version": 1, "block_tokens": 64, "sessions": 1,
         "requests": 3, "meta": {}},
        {"session": "a", "requests": 3, "start_s": None},
        {"rid": 0, "parent": None, "prefix_tokens": 0, "new_tokens": 200, "output_tokens": 10,
         "after": [], "delay_s": 0.0, "agent": 0, "hashes": [1, 2, 3]},
        {"rid": 1, "parent": 0, "prefix_tokens": 210, "new_tokens": 50, "output_tokens": 10,
         "after": [0], "delay_s": 1.0, "agent": 0, "hashes": [1, 2, 3, 4]},
        {"rid": 2, "parent": 1, "prefix_tokens": 100, "new_tokens": 50, "output_tokens": 10,
         "after": [1], "delay_s": 1.0, "agent": 1},
    ]


def _write(tmp_path: Path, rows: list) -> Path:
    f = tmp_path / "bad.jsonl"
    f.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return f


def test_good_file_loads(tmp_path: Path) -> None:
    (g,) = load_jsonl(_write(tmp_path, _good()))
    assert [r.prompt_tokens for r in g.requests] == [200, 260, 150]


def _set(line: int, **kv: object):
    def edit(rows: list) -> None:
        rows[line].update(kv)
    return edit


def _seq(*edits):
    def edit(rows: list) -> None:
        for e in edits:
            e(rows)
    return edit


def _drop(line: int, key: str):
    def edit(rows: list) -> None:
        del rows[line][key]
    return edit


CASES = [  # (edit, 1-based line, field, message fragment)
    (_set(0, version=2), 1, "version", "unknown version 2"),
    (_set(0, format="other"), 1, "format", "expected 'racksim-workload'"),
    (_set(0, block_tokens=16), 1, "block_tokens", "must be 64"),
    (_set(0, requests=4), 1, "requests", "declares 4"),
    (_set(0, sessions=2), 1, "sessions", "declares 2"),
    (_drop(0, "sessions"), 1, "sessions", "missing"),
    (_set(1, session=""), 2, "session", "non-empty"),
    (_set(1, requests=0), 2, "requests", ">= 1"),
    (_set(1, requests=4), 2, "requests", "file ends after 3"),
    (_set(1, start_s=-1.0), 2, "start_s", ">= 0"),
    (_set(1, colour="red"), 2, "colour", "unknown field"),
    (_set(2, rid=1), 3, "rid", "expected 0"),
    (_set(2, new_tokens=-5), 3, "new_tokens", ">= 0"),
    (_set(3, output_tokens=0), 4, "output_tokens", ">= 1"),
    (_set(3, prefix_tokens=-1), 4, "prefix_tokens", ">= 0"),
    (_set(3, new_tokens="7"), 4, "new_tokens", "must be an integer"),
    (_set(3, delay_s=float("nan")), 4, "delay_s", "finite"),
    (_set(3, parent=7), 4, "parent", "missing parent request 7"),
    (_set(3, parent=None), 4, "prefix_tokens", "must be 0 without a parent"),
    (_set(3, after=[]), 4, "parent", "not a predecessor"),
    (_set(3, after=[5]), 4, "after", "missing request 5"),
    (_set(3, after=[0, 0]), 4, "after", "duplicate"),
    (_set(3, prefix_tokens=211), 4, "prefix_tokens", "exceeds parent 0's context of 210"),
    (_set(2, after=[0]), 3, "after", "cycle 0 -> 0"),
    (_set(2, after=[1]), 3, "after", "cycle 0 -> 1 -> 0"),
    (_set(2, after=[2]), 3, "after", "cycle 0 -> 2 -> 1 -> 0"),
    (_set(3, after=[0, 2]), 4, "after", "cycle 1 -> 2 -> 1"),
    (_seq(_set(4, after=[], parent=None, prefix_tokens=0), _set(3, after=[0, 2])), 4, "after",
     "request 2 is listed later"),
    (_set(3, path=[[9, 4]]), 5, "parent", "explicit path"),
    (_set(3, hashes=[1, 2, 3]), 4, "hashes", "3 hashes, the prompt of 260 tokens has 4"),
    (_set(3, hashes=[1, 9, 3, 4]), 4, "hashes", "block 1 lies in the prefix shared"),
    (_set(3, hashes="x"), 4, "hashes", "list of integers"),
    (_set(4, path=[[5, 1]]), 5, "path", "covers 1 blocks"),
    (_set(4, path=[[5, -1]]), 5, "path", "non-empty list"),
    (_seq(_set(4, prefix_tokens=0, new_tokens=0, parent=None)), 5, "new_tokens",
     "at least one token"),
]


@pytest.mark.parametrize(("edit", "line", "field", "fragment"), CASES)
def test_malformed_files_name_line_and_field(tmp_path: Path, edit, line: int, field: str,
                                             fragment: str) -> None:
    rows = _good()
    edit(rows)
    with pytest.raises(WorkloadFormatError) as e:
        load_jsonl(_write(tmp_path, rows))
    assert (e.value.line, e.value.field) == (line, field)
    assert fragment in str(e.value)
    assert f":{line}: field '{field}'" in str(e.value)


@pytest.mark.parametrize(("rows", "line", "field"), [
    ([], 1, "format"),
    (["{not json"], 1, "<json>"),
    ([_good()[0], "[1, 2]"], 2, "<json>"),
])
def test_unreadable_lines(tmp_path: Path, rows: list, line: int, field: str) -> None:
    with pytest.raises(WorkloadFormatError) as e:
        load_jsonl(_write(tmp_path, rows))
    assert (e.value.line, e.value.field) == (line, field)


def test_truncated_file_is_an_error_not_a_smaller_workload(tmp_path: Path) -> None:
    graphs = [SessionGraph(f"s{i}", (RequestSpec(0, None, 0, 100, 5),)) for i in range(3)]
    f = tmp_path / "w.jsonl"
    save_jsonl(graphs, f)
    f.write_text("".join(f.read_text().splitlines(keepends=True)[:-2]))
    with pytest.raises(WorkloadFormatError, match="header declares 3"):
        load_jsonl(f)
