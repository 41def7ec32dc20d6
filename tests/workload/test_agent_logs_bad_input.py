"""Bad agent logs: each defect names file, line and field; strict refuses, default skips."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from rackSim.workload.agent_logs import LogImportError, import_sessions
from rackSim.workload.claude_code_logs import read_claude_code
from rackSim.workload.command import main
from rackSim.workload.jsonl import load_jsonl
from rackSim.workload.openai_logs import read_openai

FIXTURES = Path(__file__).parent / "fixtures" / "agent_logs"
PROJECT = "-home-alice-work-acme-payments"
FORKED = "5f0c2e1a-7d41-4b8e-9a57-3c2d1e0f9b88.jsonl"   # the session with subagents
OPENAI_LOG = "requests-2026-11-20.jsonl"


def _edit(path: Path, line: int, change: Callable[[dict], None]) -> None:
    rows = path.read_text().splitlines()
    obj = json.loads(rows[line - 1])
    change(obj)
    rows[line - 1] = json.dumps(obj)
    path.write_text("\n".join(rows) + "\n")


def _claude_copy(tmp_path: Path) -> Path:
    root = tmp_path / "claude"
    shutil.copytree(FIXTURES / "claude_code", root)
    return root


def _uuid(path: Path, line: int) -> str:
    return json.loads(path.read_text().splitlines()[line - 1])["uuid"]


def _torn(path: Path) -> None:
    text = path.read_text().rstrip("\n")
    path.write_text(text[:-40])


def _no_usage(path: Path) -> None:
    _edit(path, 6, lambda e: e["message"].pop("usage"))


def _missing_parent(path: Path) -> None:
    _edit(path, 7, lambda e: e.update(parentUuid="0000-not-in-any-file"))


def _cycle(path: Path) -> None:
    a1b = _uuid(path, 4)
    _edit(path, 2, lambda e: e.update(parentUuid=a1b))


def _backwards(path: Path) -> None:
    _edit(path, 7, lambda e: e.update(timestamp="2026-11-20T09:30:05.000Z"))


def _contradiction(path: Path) -> None:
    _edit(path, 4, lambda e: e["message"]["usage"].update(input_tokens=999))


CLAUDE_CASES = [  # (defect, line, field, words in the message)
    (_torn, 20, "<json>", "torn last line"),
    (_no_usage, 6, "message.usage", "without usage"),
    (_missing_parent, 7, "parentUuid", "missing parent"),
    (_cycle, 3, "parentUuid", "cycle"),
    (_backwards, 8, "timestamp", "backwards"),
    (_contradiction, 4, "message.usage.input_tokens", "contradicts itself"),
]


@pytest.mark.parametrize(("defect", "line", "field", "words"), CLAUDE_CASES,
                         ids=[c[0].__name__.strip("_") for c in CLAUDE_CASES])
def test_claude_defects_skip_the_session_or_refuse_the_pool(tmp_path, defect, line, field,
                                                            words):
    root = _claude_copy(tmp_path)
    bad = root / PROJECT / FORKED
    defect(bad)
    graphs, report = import_sessions(read_claude_code(root), "claude-code transcripts")
    assert len(graphs) == 1 and report.sessions_read == 2
    (issue,) = report.skipped
    assert (issue.file, issue.line, issue.field) == (str(bad), line, field)
    assert words in issue.message
    with pytest.raises(LogImportError, match=words) as err:
        import_sessions(read_claude_code(root), "claude-code transcripts", strict=True)
    assert f"{bad}:{line}: field '{field}'" in str(err.value)


def _openai_copy(tmp_path: Path) -> Path:
    path = tmp_path / "openai" / OPENAI_LOG
    path.parent.mkdir()
    shutil.copy(FIXTURES / "openai" / OPENAI_LOG, path)
    return path


def _cached_above_prompt(path: Path) -> None:
    _edit(path, 3, lambda e: e["usage"]["prompt_tokens_details"].update(cached_tokens=30_000))


def _openai_cycle(path: Path) -> None:
    _edit(path, 1, lambda e: e.update(previous_response_id="resp_a2"))


def _openai_missing_parent(path: Path) -> None:
    _edit(path, 3, lambda e: e.update(previous_response_id="resp_gone"))


def _openai_no_usage(path: Path) -> None:
    _edit(path, 5, lambda e: e.pop("usage"))


def _openai_twice_differently(path: Path) -> None:
    _edit(path, 12, lambda e: e["usage"].update(completion_tokens=111))


def _openai_backwards(path: Path) -> None:
    _edit(path, 3, lambda e: e.update(request_start=e["request_end"] + 1))


OPENAI_CASES = [
    (_torn, 16, "<json>", "torn last line"),   # line 16 holds the first session's last call
    (_cached_above_prompt, 3, "usage.prompt_tokens_details.cached_tokens",
     "contradicts itself"),
    (_openai_cycle, 1, "previous_response_id", "cycle"),
    (_openai_missing_parent, 3, "previous_response_id", "not in this session"),
    (_openai_no_usage, 5, "usage", "missing"),
    (_openai_twice_differently, 12, "usage", "logged twice"),
    (_openai_backwards, 3, "timestamp", "backwards"),
]


@pytest.mark.parametrize(("defect", "line", "field", "words"), OPENAI_CASES,
                         ids=[c[0].__name__.strip("_") for c in OPENAI_CASES])
def test_openai_defects_skip_the_session_or_refuse_the_pool(tmp_path, defect, line, field,
                                                            words):
    path = _openai_copy(tmp_path)
    defect(path)
    graphs, report = import_sessions(read_openai(path.parent), "openai request logs")
    assert len(graphs) == 1 and len(graphs[0].requests) == 4   # the other session survives
    (issue,) = report.skipped
    assert (issue.file, issue.line, issue.field) == (str(path), line, field)
    assert words in issue.message
    with pytest.raises(LogImportError, match=words):
        import_sessions(read_openai(path.parent), "openai request logs", strict=True)


def test_openai_line_without_a_session_is_reported_and_its_session_not_half_imported(
        tmp_path):
    path = _openai_copy(tmp_path)
    _edit(path, 2, lambda e: e.pop("metadata"))   # the first call of the unlabelled session
    graphs, report = import_sessions(read_openai(path.parent), "openai request logs")
    assert report.sessions_read == 3 and len(graphs) == 1
    assert [(i.line, i.field) for i in report.skipped] == [(2, "session_id"),
                                                          (4, "previous_response_id")]


def test_command_default_skips_and_says_so_strict_writes_nothing(tmp_path, capsys):
    root = _claude_copy(tmp_path)
    _no_usage(root / PROJECT / FORKED)
    out = tmp_path / "pool.jsonl"
    assert main(["import", str(root), "--out", str(out), "--strict"]) == 7  # agent logs
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
    assert "strict import refused the pool" in capsys.readouterr().err
    assert main(["import", str(root), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "warning: skipped session" in captured.err and "message.usage" in captured.err
    assert "1 of 2 sessions imported (1 skipped)" in captured.out
    assert len(load_jsonl(out)) == 1
    assert json.loads(out.read_text().splitlines()[0])["meta"]["sessions_skipped"] == 1


def test_command_refuses_when_nothing_imports(tmp_path, capsys):
    path = _openai_copy(tmp_path)
    path.write_text(path.read_text().replace('"usage"', '"usage_"'))
    out = tmp_path / "pool.jsonl"
    assert main(["import", str(path), "--out", str(out), "--format", "openai"]) == 7
    assert "no openai request logs session could be imported" in capsys.readouterr().err
    assert not out.exists()
    assert main(["import", str(tmp_path / "absent"), "--out", str(out)]) == 7
    assert "no such file or directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["import", str(empty), "--out", str(out)]) == 7
    assert "pass --format" in capsys.readouterr().err
