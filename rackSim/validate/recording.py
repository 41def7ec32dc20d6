"""The driver's record file: one RequestRecord per JSON line, appended and flushed as it goes.

Each line is `RequestRecord.as_row()` plus two driver fields: `key` (which request of the
replay plan it was: `<session key base>:<rid>:<r|p>`, p = primer) and `endpoint` (the server's
base URL). Lines are flushed and fsynced one by one, so a crash or Ctrl-C loses at most the
request in flight; a torn last line (power cut mid-write) is skipped on reading with a warning.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import fields
from pathlib import Path
from typing import IO

from rackSim.metrics.records import RequestRecord

_FIELDS = {f.name for f in fields(RequestRecord)}
def _clean(v: object) -> object:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def record_line(rec: RequestRecord, key: str, endpoint: str) -> str:
    """One JSON line for `rec` (NaN written as null)."""
    row = {k: _clean(v) for k, v in rec.as_row().items()}
    row["key"], row["endpoint"] = key, endpoint
    return json.dumps(row, separators=(",", ":"))


def record_from_row(row: dict) -> RequestRecord:
    """A RequestRecord from one parsed line (extra driver fields ignored, null -> NaN)."""
    kw = {}
    for k, v in row.items():
        if k not in _FIELDS:
            continue
        kw[k] = math.nan if v is None and k.endswith("_s") else v
    if "session_id" not in kw or "rid" not in kw or "send_s" not in kw:
        raise ValueError("record line lacks session_id / rid / send_s")
    kw.setdefault("prompt_tokens", 0)
    kw.setdefault("lane", 0)
    kw.setdefault("session_key", -1)
    kw.setdefault("agent", 0)
    return RequestRecord(**kw)


class RecordWriter:
    """Appends records to a JSONL file, flushing (and fsyncing) every line."""

    def __init__(self, path: Path, fsync: bool = False):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = path.open("a", encoding="utf-8")
        self._fsync = fsync

    def write(self, rec: RequestRecord, key: str, endpoint: str) -> None:
        self._f.write(record_line(rec, key, endpoint) + "\n")
        self._f.flush()
        if self._fsync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def read_record_rows(path: Path) -> list[dict]:
    """Every parsed line of a record file, in order; a torn line is skipped with a warning."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                warnings.warn(f"{path}:{n}: unreadable record line skipped (torn write?)",
                              stacklevel=2)
    return rows


def read_records(path: Path) -> list[RequestRecord]:
    """The RequestRecords of a driver record file (see `read_record_rows`)."""
    out = []
    for n, row in enumerate(read_record_rows(path), 1):
        try:
            out.append(record_from_row(row))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: record {n}: {err}") from err
    return out


def done_keys(path: Path) -> set[str]:
    """Keys of requests that completed without error (what a resumed run does not re-send)."""
    if not path.exists():
        return set()
    return {r["key"] for r in read_record_rows(path)
            if r.get("key") and r.get("error") is None and r.get("finish_s") is not None}
