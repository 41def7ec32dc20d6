"""Save and load session graphs as versioned JSONL (schema: docs/workload_format.md).

Line 1 is a header; each session is a session line followed by its request lines. Loading
checks everything before returning, and any problem raises `WorkloadFormatError` naming the
line and field, so a malformed file never yields a partial workload.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rackSim.config.errors import PoolInputError, TraceInputError
from rackSim.workload.graph import (
    BLOCK_TOKENS,
    RequestSpec,
    SessionGraph,
    SessionInstance,
    path_blocks,
)
from rackSim.workload.tokens import block_hashes

FORMAT = "racksim-workload"
VERSION = 1


class WorkloadFormatError(PoolInputError):
    """A workload file is malformed; `line` (1-based) and `field` say where."""

    def __init__(self, path: str | Path, line: int, field: str, message: str):
        self.path, self.line, self.field = str(path), line, field
        super().__init__(f"{path}:{line}: field '{field}': {message}")


class TraceFormatError(WorkloadFormatError):
    """A trace file (Mooncake JSONL, Azure CSV) is malformed."""

    exit_code = TraceInputError.exit_code


def save_jsonl(graphs: Iterable[SessionGraph], path: str | Path,
               meta: dict[str, Any] | None = None, with_hashes: bool = False) -> None:
    """Write `graphs` to `path`.

    with_hashes: also write each prompt's session-scoped 64-token block hashes
    (`tokens.block_hashes` with key_base 0, shifted to 63 bits so any JSON reader holds them
    as signed 64-bit integers; large: one integer per prompt block).
    """
    graphs = list(graphs)
    header = {"format": FORMAT, "version": VERSION, "block_tokens": BLOCK_TOKENS,
              "sessions": len(graphs), "requests": sum(len(g.requests) for g in graphs),
              "meta": meta or {}}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for g in graphs:
            inst = SessionInstance(g, key_base=0)
            f.write(json.dumps({"session": g.session_id, "requests": len(g.requests),
                                "start_s": g.start_s}) + "\n")
            for r in g.requests:
                row: dict[str, Any] = {
                    "rid": r.rid, "parent": r.parent, "prefix_tokens": r.prefix_tokens,
                    "new_tokens": r.new_tokens, "output_tokens": r.output_tokens,
                    "after": list(r.after), "delay_s": r.delay_s, "agent": r.agent}
                if r.path is not None:
                    row["path"] = [list(e) for e in r.path]
                if with_hashes:
                    row["hashes"] = [int(h) >> 1 for h in block_hashes(inst, r.rid)]
                f.write(json.dumps(row) + "\n")


def load_jsonl(path: str | Path) -> list[SessionGraph]:
    """Read and validate a workload file; raise `WorkloadFormatError` on the first problem."""
    return _Reader(path).read()


_SESSION_KEYS = {"session", "requests", "start_s"}
_REQUEST_KEYS = {"rid", "parent", "prefix_tokens", "new_tokens", "output_tokens", "after",
                 "delay_s", "agent", "path", "hashes"}


class _Reader:
    def __init__(self, path: str | Path):
        self.path = path

    def fail(self, line: int, fld: str, msg: str) -> WorkloadFormatError:
        return WorkloadFormatError(self.path, line, fld, msg)

    def read(self) -> list[SessionGraph]:
        with open(self.path, encoding="utf-8") as f:
            lines = [(i, s) for i, s in enumerate(f, 1) if s.strip()]
        if not lines:
            raise self.fail(1, "format", "empty file (expected a header line)")
        n_line, header = lines[0][0], self._obj(*lines[0])
        self._header(n_line, header)
        graphs: list[SessionGraph] = []
        k, seen = 1, set()
        while k < len(lines):
            s_line, row = lines[k][0], self._obj(*lines[k])
            self._keys(s_line, row, _SESSION_KEYS, required={"session", "requests"})
            sid = row["session"]
            if not isinstance(sid, str) or not sid:
                raise self.fail(s_line, "session", "must be a non-empty string")
            if sid in seen:
                raise self.fail(s_line, "session", f"duplicate session id '{sid}'")
            seen.add(sid)
            n = self._int(s_line, row, "requests", lo=1)
            start = row.get("start_s")
            if start is not None:
                start = self._float(s_line, row, "start_s")
            body = lines[k + 1:k + 1 + n]
            if len(body) < n:
                raise self.fail(s_line, "requests",
                                f"session '{sid}' declares {n} requests, file ends after "
                                f"{len(body)}")
            graphs.append(SessionGraph(sid, self._requests(body), start))
            k += 1 + n
        for fld, want in (("sessions", len(graphs)),
                          ("requests", sum(len(g.requests) for g in graphs))):
            if header[fld] != want:
                raise self.fail(n_line, fld, f"header declares {header[fld]}, file has {want}")
        return graphs

    def _obj(self, line: int, text: str) -> dict[str, Any]:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise self.fail(line, "<json>", f"not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise self.fail(line, "<json>", "expected a JSON object")
        return obj

    def _header(self, line: int, h: dict[str, Any]) -> None:
        if h.get("format") != FORMAT:
            raise self.fail(line, "format", f"expected '{FORMAT}', got {h.get('format')!r}")
        if h.get("version") != VERSION:
            raise self.fail(line, "version",
                            f"unknown version {h.get('version')!r} (this reader knows {VERSION})")
        self._keys(line, h, {"format", "version", "block_tokens", "sessions", "requests", "meta"},
                   required={"block_tokens", "sessions", "requests"})
        if h["block_tokens"] != BLOCK_TOKENS:
            raise self.fail(line, "block_tokens", f"must be {BLOCK_TOKENS}")
        self._int(line, h, "sessions", lo=0)
        self._int(line, h, "requests", lo=0)

    def _keys(self, line: int, row: dict[str, Any], allowed: set[str],
              required: set[str]) -> None:
        for key in row:
            if key not in allowed:
                raise self.fail(line, key, f"unknown field (expected one of {sorted(allowed)})")
        for key in sorted(required):
            if key not in row:
                raise self.fail(line, key, "missing")

    def _int(self, line: int, row: dict[str, Any], fld: str, lo: int = 0) -> int:
        v = row[fld]
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(line, fld, f"must be an integer, got {v!r}")
        if v < lo:
            raise self.fail(line, fld, f"must be >= {lo}, got {v}")
        return v

    def _float(self, line: int, row: dict[str, Any], fld: str) -> float:
        v = row[fld]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self.fail(line, fld, f"must be a finite number, got {v!r}")
        if v < 0:
            raise self.fail(line, fld, f"must be >= 0, got {v}")
        return float(v)

    def _requests(self, body: list[tuple[int, str]]) -> tuple[RequestSpec, ...]:
        n = len(body)
        rows = []
        for want, (line, text) in enumerate(body):
            row = self._obj(line, text)
            self._keys(line, row, _REQUEST_KEYS,
                       required={"rid", "parent", "prefix_tokens", "new_tokens", "output_tokens"})
            if self._int(line, row, "rid") != want:
                raise self.fail(line, "rid", f"expected {want} (rids count 0..{n - 1} in order)")
            rows.append((line, row))
        after = {}
        for line, row in rows:
            deps = row.get("after", [])
            if not isinstance(deps, list):
                raise self.fail(line, "after", "must be a list of rids")
            for a in deps:
                if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < n:
                    raise self.fail(line, "after", f"missing request {a!r} in this session")
            if len(set(deps)) != len(deps):
                raise self.fail(line, "after", "duplicate rid")
            after[row["rid"]] = deps
        self._acyclic(rows, after)
        return tuple(self._request(line, row, after, rows) for line, row in rows)

    def _acyclic(self, rows: list[tuple[int, dict[str, Any]]], after: dict[int, list]) -> None:
        state = dict.fromkeys(after, 0)  # 0 new, 1 on stack, 2 done
        for root in after:
            if state[root]:
                continue
            stack = [(root, iter(after[root]))]
            state[root] = 1
            while stack:
                node, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    state[node] = 2
                    stack.pop()
                elif state[nxt] == 1:
                    cyc = [s for s, _ in stack]
                    cyc = cyc[cyc.index(nxt):] + [nxt]
                    raise self.fail(rows[nxt][0], "after",
                                    "cycle " + " -> ".join(map(str, cyc)))
                elif state[nxt] == 0:
                    state[nxt] = 1
                    stack.append((nxt, iter(after[nxt])))

    def _request(self, line: int, row: dict[str, Any], after: dict[int, list],
                 rows: list[tuple[int, dict[str, Any]]]) -> RequestSpec:
        rid = row["rid"]
        for a in after[rid]:
            if a >= rid:
                raise self.fail(line, "after", f"request {a} is listed later (list requests in "
                                               "topological order)")
        prefix = self._int(line, row, "prefix_tokens")
        new = self._int(line, row, "new_tokens")
        out = self._int(line, row, "output_tokens", lo=1)
        parent = row["parent"]
        if parent is None:
            if prefix:
                raise self.fail(line, "prefix_tokens", "must be 0 without a parent")
        else:
            if isinstance(parent, bool) or not isinstance(parent, int) or not 0 <= parent < rid:
                raise self.fail(line, "parent", f"missing parent request {parent!r} (must be an "
                                                "earlier rid of this session)")
            if not self._precedes(parent, rid, after):
                raise self.fail(line, "parent", f"request {parent} is not a predecessor through "
                                                "'after', so its context may not exist yet")
            prow = rows[parent][1]
            if prow.get("path") is not None:
                raise self.fail(line, "parent", f"request {parent} has an explicit path; its "
                                                "context cannot be a derived prefix")
            ctx = prow["prefix_tokens"] + prow["new_tokens"] + prow["output_tokens"]
            if prefix > ctx:
                raise self.fail(line, "prefix_tokens",
                                f"{prefix} exceeds parent {parent}'s context of {ctx} tokens")
        if prefix + new < 1:
            raise self.fail(line, "new_tokens", "the prompt must have at least one token")
        delay = self._float(line, row, "delay_s") if "delay_s" in row else 0.0
        agent = self._int(line, row, "agent") if "agent" in row else 0
        path = self._path(line, row, prefix + new) if row.get("path") is not None else None
        if "hashes" in row:
            self._hashes(line, row, rows)
        return RequestSpec(rid, parent, prefix, new, out, tuple(after[rid]), delay, agent, path)

    @staticmethod
    def _precedes(a: int, b: int, after: dict[int, list]) -> bool:
        if a in after[b]:
            return True
        todo, seen = list(after[b]), set()
        while todo:
            x = todo.pop()
            if x == a:
                return True
            if x not in seen:
                seen.add(x)
                todo.extend(after[x])
        return False

    def _path(self, line: int, row: dict[str, Any], prompt: int) -> tuple[tuple[int, int], ...]:
        p = row["path"]
        ok = isinstance(p, list) and p and all(
            isinstance(e, list) and len(e) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in e) and e[1] >= 0
            for e in p)
        if not ok:
            raise self.fail(line, "path", "must be a non-empty list of [node_key, blocks >= 0]")
        total = path_blocks(p)
        if total != prompt // BLOCK_TOKENS:
            raise self.fail(line, "path", f"covers {total} blocks, the prompt of {prompt} tokens "
                                          f"has {prompt // BLOCK_TOKENS} full blocks")
        return tuple((k, b) for k, b in p)

    def _hashes(self, line: int, row: dict[str, Any],
                rows: list[tuple[int, dict[str, Any]]]) -> None:
        hs = row["hashes"]
        if not isinstance(hs, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hs):
            raise self.fail(line, "hashes", "must be a list of integers")
        prompt = row["prefix_tokens"] + row["new_tokens"]
        if len(hs) != prompt // BLOCK_TOKENS:
            raise self.fail(line, "hashes", f"{len(hs)} hashes, the prompt of {prompt} tokens has "
                                            f"{prompt // BLOCK_TOKENS} full blocks")
        parent = row["parent"]
        if parent is None or "hashes" not in rows[parent][1]:
            return
        shared = min(row["prefix_tokens"] // BLOCK_TOKENS, len(rows[parent][1]["hashes"]))
        mine, theirs = hs[:shared], rows[parent][1]["hashes"][:shared]
        if mine != theirs:
            i = next(i for i, (x, y) in enumerate(zip(mine, theirs, strict=True)) if x != y)
            raise self.fail(line, "hashes", f"block {i} lies in the prefix shared with parent "
                                            f"{parent} but its hash differs from the parent's")
