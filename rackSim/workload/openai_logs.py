"""Read OpenAI-compatible request logs (one JSON object per call) as `LoggedSession`s.

Each line of each `*.jsonl` file is one call:

* `id`: the call's id (the response id); a repeated id with the same usage counts once;
* `session_id` or `conversation_id` (top level or in `metadata`): the session it belongs to;
* `previous_response_id` or `parent_id`: the call whose context it continues (optional);
* `agent_id`: its agent chain (optional; absent = one chain per session, a second child of a
  call starts a subagent branch);
* `usage.prompt_tokens`, `usage.prompt_tokens_details.cached_tokens` (optional, 0),
  `usage.completion_tokens`;
* send time `request_start`, `created_at` or `created`; end time `request_end` or
  `completed_at` (epoch seconds or ISO-8601 with a zone).

Calls may be spread over files in any order; they are grouped by session.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rackSim.workload.agent_logs import (
    LoggedCall,
    LoggedSession,
    LogIssue,
    SessionRejected,
    epoch_s,
    json_lines,
    usage_counts,
)

_SESSION = ("session_id", "conversation_id")
_LINK = ("previous_response_id", "parent_id")
_START = ("request_start", "created_at", "created")
_END = ("request_end", "completed_at")
_SESSION_IN_TEXT = re.compile(r'"(?:session_id|conversation_id)"\s*:\s*"([^"]+)"')

Row = tuple[str, int, dict[str, Any]]


def read_openai(root: Path) -> Iterator[tuple[str, LoggedSession | LogIssue]]:
    """(session id, its calls or the issue that rejects it) per session under `root`; a line
    whose session cannot be told is yielded on its own (labelled by file and line)."""
    files = [root] if root.is_file() else sorted(root.rglob("*.jsonl"))
    rows: dict[str, list[Row]] = {}
    bad: dict[str, LogIssue] = {}
    for f in tqdm(files, desc="log files", unit="file", disable=None):
        for sid, item in _lines(f):
            if sid is None:
                yield f"{item.file}:{item.line}", item
            elif isinstance(item, LogIssue):
                bad.setdefault(sid, item)
                rows.setdefault(sid, [])
            else:
                rows.setdefault(sid, []).append(item)
    for sid, session_rows in rows.items():
        if sid in bad:
            yield sid, bad[sid]
            continue
        try:
            yield sid, _session(session_rows)
        except SessionRejected as err:
            yield sid, err.issue


def _lines(path: Path) -> Iterator[tuple[str | None, Row | LogIssue]]:
    for i, raw, obj in json_lines(path, "the file ends mid-record; drop the partial line"):
        if isinstance(obj, LogIssue):
            found = _SESSION_IN_TEXT.search(raw)
            yield (found.group(1) if found else None), obj
            continue
        if not isinstance(obj, dict):
            yield None, LogIssue(str(path), i, "<json>", "expected a JSON object per line")
            continue
        sid = _first(obj, _SESSION) or _first(obj.get("metadata") or {}, _SESSION)
        if not isinstance(sid, str) or not sid:
            yield None, LogIssue(str(path), i, "session_id", (
                "missing: every call needs session_id or conversation_id (top level or in "
                "metadata) to be grouped into sessions"))
            continue
        yield sid, (str(path), i, obj)


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((obj[k] for k in keys if obj.get(k) is not None), None)


def _session(rows: list[Row]) -> LoggedSession:
    calls: dict[str, LoggedCall] = {}
    duplicates = 0
    for file, line, obj in rows:
        c = _call(file, line, obj)
        seen = calls.get(c.key)
        if seen is None:
            calls[c.key] = c
            continue
        if (seen.prompt_tokens, seen.cached_tokens, seen.output_tokens) != \
                (c.prompt_tokens, c.cached_tokens, c.output_tokens):
            raise SessionRejected(LogIssue(file, line, "usage", (
                f"usage contradicts itself: call {c.key!r} is logged twice with different "
                f"counts (first at {seen.file}:{seen.line})")))
        duplicates += 1
    return LoggedSession(list(calls.values()), "previous_response_id", duplicates)


def _call(file: str, line: int, obj: dict[str, Any]) -> LoggedCall:
    key = obj.get("id")
    if not isinstance(key, str) or not key:
        raise SessionRejected(LogIssue(file, line, "id", "missing: every call needs its id"))
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        raise SessionRejected(LogIssue(file, line, "usage", (
            "missing: the call's token counts are needed (log the response's usage)")))
    details = usage.get("prompt_tokens_details") or {}
    prompt, cached, output = usage_counts(
        file, line, usage.get("prompt_tokens"), details.get("cached_tokens") or 0,
        usage.get("completion_tokens"),
        ("usage.prompt_tokens", "usage.prompt_tokens_details.cached_tokens",
         "usage.completion_tokens"))
    times = []
    for keys in (_START, _END):
        value = _first(obj, keys)
        if value is None:
            raise SessionRejected(LogIssue(file, line, keys[0], (
                f"missing: one of {', '.join(keys)} is needed to time the calls")))
        times.append(epoch_s(file, line, keys[0], value))
    link = _first(obj, _LINK)
    if link is not None and not isinstance(link, str):
        raise SessionRejected(LogIssue(file, line, _LINK[0], f"must be a call id string, got "
                                                             f"{link!r}"))
    chain = obj.get("agent_id") or ""
    return LoggedCall(key, file, line, prompt, cached, output, times[0], times[1], link,
                      str(chain))
