"""Read coding-agent transcripts in the Claude Code JSONL layout as `LoggedSession`s.

Layout: one `<session>.jsonl` per session, its subagents' side chains in
`<session>/subagents/agent-*.jsonl`. Each line is one entry; `user`, `assistant` and `system`
entries carry `uuid`, `parentUuid` (a compaction boundary: null, with `logicalParentUuid`),
an ISO `timestamp`, and `isSidechain` / `agentId` on side chains. Other entry types (summaries,
snapshots) carry no call and are ignored.

An API call is an `assistant` entry with `message.usage` (`input_tokens`,
`cache_creation_input_tokens`, `cache_read_input_tokens`, `output_tokens`); one call streamed
as several entries shares their `requestId` (or `message.id`) and counts once: inputs must
agree, the output is the largest seen. Prompt = input + cache creation + cache read tokens,
cached = cache read. Entries with model `<synthetic>` are written locally (no call) and only
relay links.

Links: a call continues the nearest call above it through `parentUuid` (tool results and
user turns in between). Its send time is the timestamp of the nearest `user` entry in between
(the tool result or message it answers), else its own first entry's; its end is its last
streamed entry's timestamp. A side chain's first call has no link and forks where
`agent_logs` attaches it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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

SUBAGENTS = "subagents"
_INPUTS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


@dataclass
class _Entry:
    uuid: str
    parent: str | None
    parent_field: str
    kind: str
    ts: float
    file: str
    line: int
    chain: str
    request: str | None = None
    usage: tuple[int, int, int, int] | None = None  # input, cache creation, cache read, output


def find_sessions(root: Path) -> list[tuple[Path, list[Path]]]:
    """(session file, its subagent files) under `root` (a session file or a directory)."""
    mains = [root] if root.is_file() else sorted(
        p for p in root.rglob("*.jsonl") if p.parent.name != SUBAGENTS)
    return [(m, sorted((m.parent / m.stem / SUBAGENTS).glob("agent-*.jsonl"))) for m in mains]


def read_claude_code(root: Path) -> Iterator[tuple[str, LoggedSession | LogIssue]]:
    """(session file, its calls or the issue that rejects it) per session under `root`."""
    for main, subs in tqdm(find_sessions(root), desc="sessions", unit="session",
                           disable=None):
        try:
            yield str(main), _session([main, *subs])
        except SessionRejected as bad:
            yield str(main), bad.issue


def _session(files: list[Path]) -> LoggedSession:
    entries: list[_Entry] = []
    for f in files:
        entries += _entries(f)
    nodes: dict[str, _Entry] = {}
    groups: dict[str, list[_Entry]] = {}
    duplicates = 0
    for e in entries:
        if e.uuid in nodes:  # a resumed transcript repeats earlier entries
            duplicates += 1
            continue
        nodes[e.uuid] = e
        if e.request is not None:
            groups.setdefault(e.request, []).append(e)
    calls = []
    for request, group in groups.items():
        duplicates += len(group) - 1
        calls.append(_call(request, group, nodes))
    if not calls:
        raise SessionRejected(LogIssue(str(files[0]), 1, "message.usage",
                                       "no assistant entry with usage: nothing to import"))
    return LoggedSession(calls, "parentUuid", duplicates)


def _entries(path: Path) -> list[_Entry]:
    default_chain = path.stem if path.parent.name == SUBAGENTS else "sidechain"
    out = []
    for i, _raw, obj in json_lines(path, "the file ends mid-entry (written while the agent "
                                         "ran?); drop the partial line or import the session "
                                         "once it has ended"):
        if isinstance(obj, LogIssue):
            raise SessionRejected(obj)
        if isinstance(obj, dict) and obj.get("type") in ("user", "assistant", "system") \
                and "uuid" in obj:
            out.append(_entry(obj, str(path), i, default_chain))
    return out


def _entry(obj: dict, file: str, line: int, default_chain: str) -> _Entry:
    uuid = obj["uuid"]
    if not isinstance(uuid, str) or not uuid:
        raise SessionRejected(LogIssue(file, line, "uuid", f"must be a non-empty string, got "
                                                           f"{uuid!r}"))
    parent, pfield = obj.get("parentUuid"), "parentUuid"
    if parent is None and obj.get("logicalParentUuid") is not None:
        parent, pfield = obj["logicalParentUuid"], "logicalParentUuid"
    if parent is not None and not isinstance(parent, str):
        raise SessionRejected(LogIssue(file, line, pfield, f"must be a uuid string or null, "
                                                           f"got {parent!r}"))
    chain = str(obj.get("agentId") or default_chain) if obj.get("isSidechain") else ""
    e = _Entry(uuid, parent, pfield, obj["type"], epoch_s(file, line, "timestamp",
                                                          obj.get("timestamp")),
               file, line, chain)
    if e.kind == "assistant":
        msg = obj.get("message")
        if not isinstance(msg, dict):
            raise SessionRejected(LogIssue(file, line, "message", "assistant entry without a "
                                                                  "message object"))
        if msg.get("model") != "<synthetic>":
            e.request, e.usage = _usage(msg, obj, file, line)
    return e


def _usage(msg: dict, obj: dict, file: str, line: int
           ) -> tuple[str, tuple[int, int, int, int]]:
    usage = msg.get("usage")
    if not isinstance(usage, dict):
        raise SessionRejected(LogIssue(file, line, "message.usage", (
            "assistant entry without usage; token counts are needed for every call (was the "
            "transcript exported without them?)")))
    values = []
    for key in (*_INPUTS, "output_tokens"):
        v = usage.get(key)
        if v is None and key.startswith("cache_"):
            v = 0
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SessionRejected(LogIssue(file, line, f"message.usage.{key}",
                                           f"must be a count >= 0, got {v!r}"))
        values.append(v)
    request = obj.get("requestId") or msg.get("id")
    if not isinstance(request, str) or not request:
        raise SessionRejected(LogIssue(file, line, "requestId", (
            "assistant entry without requestId or message.id: its streamed entries cannot be "
            "told apart from other calls")))
    return request, (values[0], values[1], values[2], values[3])


def _call(request: str, group: list[_Entry], nodes: dict[str, _Entry]) -> LoggedCall:
    first = group[0]
    for e in group[1:]:
        for k, name in enumerate(_INPUTS):
            if e.usage[k] != first.usage[k]:
                raise SessionRejected(LogIssue(e.file, e.line, f"message.usage.{name}", (
                    f"usage contradicts itself: streamed entries of one request say "
                    f"{first.usage[k]} ({first.file}:{first.line}) and {e.usage[k]}")))
    inp, creation, read, _ = first.usage
    prompt, cached, output = usage_counts(
        first.file, first.line, inp + creation + read, read, max(e.usage[3] for e in group),
        ("message.usage.input_tokens", "message.usage.cache_read_input_tokens",
         "message.usage.output_tokens"))
    link, send = _walk(first, nodes)
    return LoggedCall(request, first.file, first.line, prompt, cached, output, send,
                      max(e.ts for e in group), link, first.chain)


def _walk(first: _Entry, nodes: dict[str, _Entry]) -> tuple[str | None, float]:
    """(request id of the call above `first`, send time) by its parent links."""
    send: float | None = None
    where, ref, seen = first, first.parent, set()
    while ref is not None:
        if ref in seen:
            raise SessionRejected(LogIssue(where.file, where.line, where.parent_field, (
                "parent links form a cycle; the transcript is corrupt")))
        seen.add(ref)
        node = nodes.get(ref)
        if node is None:
            raise SessionRejected(LogIssue(where.file, where.line, where.parent_field, (
                f"links to a missing parent entry {ref!r} (in none of the session's files); "
                "the transcript is incomplete")))
        if node.request is not None and node.request != first.request:
            return node.request, first.ts if send is None else send
        if send is None and node.kind == "user":
            send = node.ts
        where, ref = node, node.parent
    return None, first.ts if send is None else send
