"""Session graphs from agent session logs: the format-independent half of `racksim-workload
import` (docs/agent_logs.md).

A format reader (`claude_code_logs`, `openai_logs`) turns one session's log into
`LoggedCall`s: one per API call, with its token usage, send and end times (epoch s), the call
whose context it continues (`link`) and the agent chain it belongs to. `build_graph` turns
those into a `SessionGraph`:

* prompt = all input tokens; cached prefix = the cache-read count, clipped to the prefix
  parent's context (prompt + output); new tokens = the rest. A session's first call has no
  parent, so its cache reads (shared with earlier sessions) become new tokens. Both are
  counted in the `ImportReport`.
* a call continues its link's chain when it carries the same chain label and is the first
  such child to do so (unlabelled logs: the child with the largest cache read, the one that
  re-sends the whole context); any other child starts a subagent branch. A call with no link
  forks from the last call of the first call's chain that ended before it was sent.
* a branch joins the first call of the chain it forked from that is sent after the branch's
  last call ends (the turn that reads the subagents' answers).
* delay = send - the latest end among the calls it waits for (tool time).

Anonymisation: only counts, structure and timings survive; sessions are re-keyed `s00000`,
... in order of their first call, no log id, path, text or absolute time is kept.

Bad input (`LogIssue`: file, line, field, what and the fix) rejects the whole session it is
in: `strict` refuses the pool, the default skips the session, counts it and says so.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rackSim.config.errors import AgentLogInputError
from rackSim.workload.graph import RequestSpec, SessionGraph


@dataclass(frozen=True)
class LogIssue:
    """What is wrong where: `file`:`line`, `field`."""

    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: field '{self.field}': {self.message}"


class SessionRejected(Exception):
    """Raised by readers and `build_graph`: the session holding `issue` cannot be imported."""

    def __init__(self, issue: LogIssue):
        self.issue = issue
        super().__init__(str(issue))


class LogImportError(AgentLogInputError):
    """Strict import refused the pool (or nothing importable was found); lists every issue."""

    def __init__(self, issues: list[LogIssue], headline: str):
        self.issues = issues
        lines = [headline, *(f"  {i}" for i in issues[:20])]
        if len(issues) > 20:
            lines.append(f"  ... and {len(issues) - 20} more")
        super().__init__("\n".join(lines))


@dataclass
class LoggedCall:
    """One API call as the log shows it (ids and times are the log's; never exported).

    prompt_tokens: every input token; cached_tokens: those read from the provider's cache.
    send_s / end_s: epoch seconds the request was sent and its response ended.
    link: key of the call whose context this prompt continues; None = not recorded.
    chain: agent chain label ('' = main agent, or unlabelled).
    """

    key: str
    file: str
    line: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    send_s: float
    end_s: float
    link: str | None
    chain: str = ""


@dataclass
class LoggedSession:
    """A session's calls; `link_field` names the log field the links come from;
    `duplicates`: log entries that repeated a call already read (counted once)."""

    calls: list[LoggedCall]
    link_field: str
    duplicates: int = 0


@dataclass
class ImportReport:
    """What an import read, kept and dropped (token counts are totals over kept sessions)."""

    source: str
    sessions_read: int = 0
    calls: int = 0
    duplicate_entries: int = 0
    root_cached_tokens: int = 0
    clipped_cached_tokens: int = 0
    skipped: list[LogIssue] = field(default_factory=list)

    @property
    def sessions_imported(self) -> int:
        return self.sessions_read - len(self.skipped)

    def meta(self) -> dict[str, object]:
        """Provenance for the JSONL header: counts only, no path or id."""
        return {"source": self.source, "anonymised": "counts, structure and timings only",
                "sessions_read": self.sessions_read, "sessions_skipped": len(self.skipped),
                "calls": self.calls, "duplicate_entries": self.duplicate_entries,
                "root_cached_tokens": self.root_cached_tokens,
                "clipped_cached_tokens": self.clipped_cached_tokens}

    def lines(self) -> list[str]:
        """A human summary (the skipped sessions' issues are in `skipped`)."""
        out = [f"{self.source}: {self.sessions_imported} of {self.sessions_read} sessions "
                   f"imported ({len(self.skipped)} skipped), {self.calls} calls, "
                   f"{self.duplicate_entries} duplicate streamed entries counted once"]
        if self.root_cached_tokens:
            out.append(f"{self.root_cached_tokens:,} tokens read from cache by first calls "
                       "(shared with earlier sessions) imported as new tokens")
        if self.clipped_cached_tokens:
            out.append(f"{self.clipped_cached_tokens:,} cached tokens beyond the parent's "
                       "context imported as new tokens")
        return out


def json_lines(path: Path, torn_hint: str
               ) -> Iterator[tuple[int, str, dict | list | str | float | None | LogIssue]]:
    """(line number, raw line, parsed JSON or the LogIssue that says why not) for every
    non-blank line of a JSONL log; a file that cannot be read yields one LogIssue at line 1.
    A last line that is not JSON is a torn write: `torn_hint` says what to do about it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        yield 1, "", LogIssue(str(path), 1, "<file>", f"cannot read ({err})")
        return
    lines = text.split("\n")
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            yield i, raw, json.loads(raw)
        except json.JSONDecodeError as err:
            msg = f"torn last line: {torn_hint}" if i == len(lines) \
                else f"not valid JSON ({err.msg})"
            yield i, raw, LogIssue(str(path), i, "<json>", msg)


def usage_counts(file: str, line: int, prompt: object, cached: object, output: object,
                 names: tuple[str, str, str]) -> tuple[int, int, int]:
    """Check one call's (prompt, cached, output) token counts; `names` are their log fields."""
    for value, name in zip((prompt, cached, output), names, strict=True):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SessionRejected(LogIssue(file, line, name, f"must be a count >= 0, got "
                                                             f"{value!r}"))
    if cached > prompt:
        raise SessionRejected(LogIssue(file, line, names[1], (
            f"usage contradicts itself: {cached} cached tokens > {prompt} prompt tokens; fix "
            "or drop the entry")))
    if prompt < 1:
        raise SessionRejected(LogIssue(file, line, names[0], "the prompt has no tokens"))
    if output < 1:
        raise SessionRejected(LogIssue(file, line, names[2], (
            "no output tokens (an aborted call?); a replayed request generates at least one")))
    return prompt, cached, output


def epoch_s(file: str, line: int, name: str, value: object) -> float:
    """An ISO-8601 timestamp (or epoch seconds) as epoch seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            t = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if t.tzinfo is not None:
                return t.timestamp()
    raise SessionRejected(LogIssue(file, line, name, (
        f"expected an ISO-8601 time with a zone (or epoch seconds), got {value!r}")))


def build_graph(session: LoggedSession, session_id: str, report: ImportReport
                ) -> SessionGraph:
    """The session graph of one logged session (module docstring); SessionRejected on bad
    links or times."""
    calls = sorted(session.calls, key=lambda c: (c.send_s, c.end_s, c.file, c.line))
    by_key = {c.key: c for c in calls}
    for c in calls:
        if c.end_s < c.send_s:
            raise SessionRejected(LogIssue(c.file, c.line, "timestamp", (
                f"timestamps go backwards: the response ends {c.send_s - c.end_s:.3f} s before "
                "the request was sent")))
        if c.link is not None and c.link not in by_key:
            raise SessionRejected(LogIssue(c.file, c.line, session.link_field, (
                f"links to a parent {c.link!r} that is not in this session's log; the log is "
                "incomplete")))
    _check_acyclic(calls, by_key, session.link_field)
    parent = _attach_unlinked(calls)
    for c in calls:
        p = parent[c.key]
        if p is not None and c.send_s < by_key[p].end_s:
            raise SessionRejected(LogIssue(c.file, c.line, "timestamp", (
                f"timestamps go backwards: sent {by_key[p].end_s - c.send_s:.3f} s before the "
                f"call it continues ({by_key[p].file}:{by_key[p].line}) ended")))
    agent = _assign_agents(calls, parent)
    after = _joins(calls, parent, agent)
    order = _topological(calls, after)
    rid = {k: i for i, k in enumerate(order)}
    reqs = []
    for k in order:
        c, p = by_key[k], parent[k]
        if p is None:
            prefix = 0
            report.root_cached_tokens += c.cached_tokens
        else:
            q = by_key[p]
            prefix = min(c.cached_tokens, q.prompt_tokens + q.output_tokens)
            report.clipped_cached_tokens += c.cached_tokens - prefix
        waits = sorted(rid[a] for a in after[k])
        delay = c.send_s - max((by_key[order[a]].end_s for a in waits), default=c.send_s)
        reqs.append(RequestSpec(rid[k], None if p is None else rid[p], prefix,
                                c.prompt_tokens - prefix, c.output_tokens, tuple(waits),
                                round(delay, 6), agent[k]))
    report.calls += len(reqs)
    report.duplicate_entries += session.duplicates
    return SessionGraph(session_id, tuple(reqs))


def _check_acyclic(calls: list[LoggedCall], by_key: dict[str, LoggedCall], name: str) -> None:
    done: set[str] = set()
    for c in calls:
        path: list[str] = []
        k: str | None = c.key
        while k is not None and k not in done:
            if k in path:
                cyc = by_key[k]
                raise SessionRejected(LogIssue(cyc.file, cyc.line, name, (
                    f"links form a cycle through {len(path) - path.index(k)} calls; a call "
                    "cannot continue its own descendant")))
            path.append(k)
            k = by_key[k].link
        done.update(path)


def _attach_unlinked(calls: list[LoggedCall]) -> dict[str, str | None]:
    """Prefix parent per call: its link, or for an unlinked call other than the first the
    last call of the first call's chain that ended by its send (None if there is none)."""
    parent: dict[str, str | None] = {}
    main = calls[0].chain
    for c in calls:
        if c.link is None and c is not calls[0]:
            ended = [q for q in calls if q.chain == main and q.end_s <= c.send_s and q is not c]
            parent[c.key] = max(ended, key=lambda q: q.end_s).key if ended else None
        else:
            parent[c.key] = c.link
    return parent


def _assign_agents(calls: list[LoggedCall], parent: dict[str, str | None]) -> dict[str, int]:
    """Agent per call: 0 for the first call's chain, 1, 2, ... per branch in send order."""
    by_key = {c.key: c for c in calls}
    heir: dict[str, str] = {}  # parent key -> the child that continues its chain
    for c in calls:
        p = parent[c.key]
        if p is None or by_key[p].chain != c.chain:
            continue
        best = heir.get(p)
        if best is None or c.cached_tokens > by_key[best].cached_tokens:
            heir[p] = c.key
    agent: dict[str, int] = {}
    branches = 0
    for c in calls:  # send order: a parent is assigned before its children
        p = parent[c.key]
        if p is not None and heir.get(p) == c.key:
            agent[c.key] = agent[p]
        elif p is None and not agent:
            agent[c.key] = 0
        else:
            branches += 1
            agent[c.key] = branches
    return agent


def _joins(calls: list[LoggedCall], parent: dict[str, str | None], agent: dict[str, int]
           ) -> dict[str, set[str]]:
    """What each call waits for: its prefix parent, and the last calls of the branches that
    join it."""
    after = {c.key: set() if parent[c.key] is None else {parent[c.key]} for c in calls}
    heads = [c for c in calls if parent[c.key] is not None
             and agent[c.key] != agent[parent[c.key]]]
    for h in heads:
        fork = parent[h.key]
        branch = [c for c in calls if agent[c.key] == agent[h.key]]
        last = max(branch, key=lambda c: c.end_s)
        target = next((c for c in calls if agent[c.key] == agent[fork]
                       and c.send_s >= last.end_s and c.key != fork), None)
        if target is not None:
            after[target.key].add(last.key)
    return after


def _topological(calls: list[LoggedCall], after: dict[str, set[str]]) -> list[str]:
    """Keys in an order where every call follows what it waits for (ties: send time)."""
    rank = {c.key: i for i, c in enumerate(calls)}
    waiting = {k: len(v) for k, v in after.items()}
    children: dict[str, list[str]] = {k: [] for k in after}
    for k, deps in after.items():
        for d in deps:
            children[d].append(k)
    ready = [(rank[k], k) for k, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(k)
        for ch in children[k]:
            waiting[ch] -= 1
            if waiting[ch] == 0:
                heapq.heappush(ready, (rank[ch], ch))
    return order


Reader = Callable[[Path], Iterator[tuple[str, LoggedSession | LogIssue]]]


def import_sessions(found: Iterable[tuple[str, LoggedSession | LogIssue]], source: str,
                    strict: bool = False) -> tuple[list[SessionGraph], ImportReport]:
    """Session graphs of `found` (a reader's (session label, session or issue) pairs),
    re-keyed and anonymised; strict: LogImportError on any issue. Also raises when no
    session could be imported."""
    report = ImportReport(source)
    built: list[tuple[float, SessionGraph]] = []
    for _, item in found:
        report.sessions_read += 1
        if isinstance(item, LogIssue):
            report.skipped.append(item)
            continue
        try:
            graph = build_graph(item, "", report)
        except SessionRejected as bad:
            report.skipped.append(bad.issue)
            continue
        built.append((min(c.send_s for c in item.calls), graph))
    if strict and report.skipped:
        raise LogImportError(report.skipped, f"strict import refused the pool: "
                                             f"{len(report.skipped)} bad session(s)")
    if not built:
        raise LogImportError(report.skipped, f"no {source} session could be imported "
                                             f"({report.sessions_read} read)")
    built.sort(key=lambda t: t[0])
    graphs = [SessionGraph(f"s{i:05d}", g.requests) for i, (_, g) in enumerate(built)]
    return graphs, report


def detect_format(root: Path) -> str:
    """'claude-code' or 'openai', from the first JSON object of the first log under `root`."""
    files = [root] if root.is_file() else sorted(root.rglob("*.jsonl"))
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as lines:
            for raw in lines:
                try:
                    obj = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                    return "openai"
                if isinstance(obj, dict) and "uuid" in obj and "type" in obj:
                    return "claude-code"
    raise LogImportError([], f"{root}: no *.jsonl entry looks like a Claude Code transcript "
                             "(type, uuid) or an OpenAI request log (usage); pass --format")
