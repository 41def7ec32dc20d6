"""One record schema for simulated and measured runs.

The engine and the validated-mode driver both emit `RequestRecord`s (one per request) and step
rows with `STEP_COLUMNS` (one per engine step), so `rackSim.metrics` compares them with the same
code. Times are seconds since the run started; durations are milliseconds.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from rackSim.perf.step import StepBreakdown

NAN = math.nan


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request.

    send_s: when the client sent it. first_token_s: when its first output token reached the
    client (NaN if none). finish_s: last token or failure. prompt_tokens = cached_tokens +
    uncached tokens; cached_tokens is the prefix-cache hit reported for it. output_tokens: tokens
    received. token_times_s: every token's arrival, when recorded (real runs, or simulations with
    `trace_tokens`); otherwise empty. error: None when it succeeded. The sim-only stage times
    (prefill_start_s, prefill_end_s, kv_ready_s, decode_start_s) are NaN for measured runs.

    Fleet placement (simulated): prefill_instance and decode_instance are numbered across the
    fleet, decode_rank within its decode instance; prefill_rack / decode_rack are the racks
    that prefilled and decoded it (they differ when its KV crossed the scale-out network), and
    route is the global router's reason for the rack (docs/fleets.md). -1 / "" when unknown.
    """

    session_id: str
    rid: int
    lane: int
    session_key: int  # unique per replay of a session (its prefix-tree key base)
    agent: int
    send_s: float
    prompt_tokens: int
    cached_tokens: int = 0
    output_tokens: int = 0
    first_token_s: float = NAN
    finish_s: float = NAN
    error: str | None = None
    prefill_instance: int = -1
    decode_rank: int = -1
    prefill_start_s: float = NAN
    prefill_end_s: float = NAN
    kv_ready_s: float = NAN
    decode_start_s: float = NAN
    kv_bytes_moved: float = 0.0
    phase: str = "window"  # primer | warmup | window | drain
    token_times_s: list[float] = field(default_factory=list)
    prefill_rack: int = -1
    decode_rack: int = -1
    decode_instance: int = -1
    route: str = ""

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def ttft_ms(self) -> float:
        return (self.first_token_s - self.send_s) * 1e3

    def as_row(self) -> dict:
        row = asdict(self)
        row["token_times_s"] = list(self.token_times_s)
        return row


REQUEST_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
#: request columns that hold numbers (numpy arrays in a RequestLog; the others stay objects)
_NUMERIC = tuple(f.name for f in fields(RequestRecord) if f.type in ("int", "float"))
_FLOATS = tuple(f.name for f in fields(RequestRecord) if f.type == "float")
_FIELDS_OF = attrgetter(*REQUEST_COLUMNS)


class RequestLog:
    """The request records of a run in send order; finished ones kept by column.

    A simulated hour of a large fleet sends millions of requests. A `RequestRecord` with its
    boxed numbers takes ~600 bytes, and millions of them kept alive among the short-lived
    objects of the event loop spread those over a heap of gigabytes. `close(rec)` says a
    record is final (its request finished); every `chunk` closed records are packed into
    arrays (8 bytes a number) and their objects freed. Reading it (`len`, iteration and
    indexing in send order, `columns()`) sees packed and open records alike; iteration builds
    the records back, with NaN as the shared `NAN` so that rebuilt records compare equal."""

    def __init__(self, chunk: int = 1 << 14):
        self.chunk = chunk
        self._recs: list[RequestRecord | None] = []  # send order; None once packed
        self._open: dict[int, int] = {}  # id(record) -> send position, not closed yet
        self._closed: list[int] = []     # send positions closed since the last pack
        self._packed: list[tuple[np.ndarray, dict[str, np.ndarray | list]]] = []

    def append(self, rec: RequestRecord) -> None:
        self._open[id(rec)] = len(self._recs)
        self._recs.append(rec)

    def close(self, rec: RequestRecord) -> None:
        """`rec` will not change again."""
        self._closed.append(self._open.pop(id(rec)))
        if len(self._closed) >= self.chunk:
            self._pack()

    def _pack(self) -> None:
        at = np.array(self._closed, dtype=np.int64)
        recs = self._recs
        rows = [recs[i] for i in self._closed]
        for i in self._closed:
            recs[i] = None
        self._closed = []
        self._packed.append((at, _columns(rows)))

    def __len__(self) -> int:
        return len(self._recs)

    def columns(self) -> dict[str, np.ndarray | list]:
        """Every record by column (REQUEST_COLUMNS), in send order: numbers as arrays, the
        rest as lists; token_times_s as lists (empty when not recorded)."""
        rest = self._closed + list(self._open.values())
        parts = [*self._packed, (np.array(rest, dtype=np.int64),
                                 _columns([self._recs[i] for i in rest]))]
        parts = [p for p in parts if len(p[0])]
        if not parts:
            return {c: [] for c in REQUEST_COLUMNS}
        order = np.argsort(np.concatenate([at for at, _ in parts]), kind="stable")
        out: dict[str, np.ndarray | list] = {}
        for c in REQUEST_COLUMNS:
            if c in _NUMERIC:
                out[c] = np.concatenate([cols[c] for _, cols in parts])[order]
            elif c == "token_times_s":
                flat = [v for _, cols in parts for v in cols[c]]
                out[c] = [[] if flat[i] is None else flat[i] for i in order.tolist()]
            else:
                flat = np.empty(len(order), dtype=object)
                flat[:] = [v for _, cols in parts for v in cols[c]]
                out[c] = flat[order]
        return out

    def __iter__(self) -> Iterator[RequestRecord]:
        if not self._packed:
            yield from self._recs  # type: ignore[misc]  # nothing packed: all records live
            return
        cols = self.columns()
        lists = {c: v.tolist() if isinstance(v, np.ndarray) else v for c, v in cols.items()}
        for f in _FLOATS:
            lists[f] = [NAN if x != x else x for x in lists[f]]
        for values in zip(*(lists[c] for c in REQUEST_COLUMNS), strict=True):
            yield RequestRecord(*values)

    def __getitem__(self, i: int) -> RequestRecord:
        """The `i`-th record sent: the live one while open, else rebuilt (O(records): iterate
        or read `columns()` to go through many)."""
        rec = self._recs[i]
        if rec is not None:
            return rec
        return list(self)[i]


#: what metrics read records from: a measured run's list, or a simulation's log
Records = list[RequestRecord] | RequestLog


def _columns(rows: list[RequestRecord]) -> dict[str, np.ndarray | list]:
    """`rows` by column: numbers as numpy arrays (dtype as pandas infers it from the values),
    others as lists, an empty token_times_s as None. Every field of a record is read in one
    C call and the rows transposed by `zip` (one Python-level `getattr` per field and record
    was 4 % of a reference run)."""
    cols: dict[str, np.ndarray | list] = {}
    by_column = zip(*map(_FIELDS_OF, rows), strict=True) if rows else ((),) * len(
        REQUEST_COLUMNS)
    for c, values in zip(REQUEST_COLUMNS, by_column, strict=True):
        cols[c] = np.array(values) if c in _NUMERIC else list(values)
    cols["token_times_s"] = [t or None for t in cols["token_times_s"]]
    return cols

STEP_COLUMNS: tuple[str, ...] = (
    "instance",          # e.g. "prefill-3", "decode", "colocated-0"
    "step",              # step index within the instance
    "start_s",
    "duration_ms",
    "prefill_requests",  # requests with a prompt chunk in the step
    "prefill_tokens",    # prompt tokens computed in the step
    "decode_requests",   # requests generating in the step
    "decode_tokens",     # tokens emitted in the step (colocated: beyond first tokens)
    "context_tokens",    # tokens of context attended (sum over requests)
    "new_loads",         # KV loads admitted (decode); prompts completed (colocated)
    "balancedness",      # EPLB mean/max rank load (NaN when not modelled)
    "moe_ms", "attention_ms", "indexer_ms", "dense_ms", "comm_ms", "draft_ms", "cpu_ms",
    "sync_ms", "straggler_ms", "kv_stall_ms",
)
"""Columns of a step table; simulated rows fill all, measured rows leave unknowns NaN."""


#: step columns that hold counts (int64 in a step table)
STEP_INT_COLUMNS = ("step", "prefill_requests", "prefill_tokens", "decode_requests",
                    "new_loads")


class StepLog:
    """The step rows of a run, kept by column.

    A simulated hour of a large fleet has tens of millions of steps; as tuples of Python
    objects they take ~600 bytes each, as columns 8 bytes per value. Each instance writes its
    rows through its own `writer`: the instance name becomes a code into `names`, the numbers
    are packed as one `struct` of doubles straight into a row buffer allocated once (`chunk`
    rows), which is copied into a block by column when it is full and then written again;
    `frame()` is the step table, iteration gives the rows back as tuples.

    The row buffer is never grown: growing it by reallocation copied it whole whenever the
    allocator could not extend it in place, which a busy heap makes the rule (in a 14-rack
    fleet those copies were 29 % of the last-level cache misses, callgrind with a 32 MB
    cache); and `chunk` is small enough (4,096 rows, 688 KB) for it to stay in cache."""

    def __init__(self, chunk: int = 1 << 12):
        self.chunk = chunk
        self.names: list[str] = []
        self._row = struct.Struct(f"{len(STEP_COLUMNS)}d")
        self._buf = bytearray(chunk * self._row.size)  # the rows not packed yet
        self._pending = 0
        self._blocks: list[np.ndarray] = []  # (len(STEP_COLUMNS), rows) float64: by column

    def writer(self, name: str, model: object = None) -> Callable[..., None]:
        """The row writer of instance `name`: `write(step, start_s, cost, duration_ms,
        prefill_requests, prefill_tokens, decode_requests, decode_tokens, context_tokens,
        new_loads)` appends one row (`cost` a StepBreakdown and `duration_ms` its total, which
        the instance has computed already); its balancedness is the step model's
        `last_balancedness` when `model` has one, else NaN. The row is packed from the
        arguments directly: no tuple, no lookup of the name (the four calls this took were
        a fifth of a light-load decode step)."""
        code = len(self.names)
        self.names.append(name)
        pack_into, size, buf = self._row.pack_into, self._row.size, self._buf
        balanced = hasattr(model, "last_balancedness")

        def write(step: int, start: float, cost: StepBreakdown, duration_ms: float,
                  p_req: int, p_tok: int, d_req: int, d_tok: float, ctx: float,
                  loads: int) -> None:
            pack_into(
                buf, self._pending * size,
                code, step, start, duration_ms, p_req, p_tok, d_req, d_tok, ctx, loads,
                model.last_balancedness if balanced else NAN, cost.moe, cost.attention,
                cost.indexer, cost.dense, cost.comm, cost.draft, cost.cpu, cost.sync,
                cost.straggler, cost.kv_stall)
            self._pending += 1
            if self._pending >= self.chunk:
                self._pack()

        return write

    def _pack(self) -> None:
        """The pending rows into a block by column; the row buffer is free again."""
        n = self._pending
        if not n:
            return
        rows = np.frombuffer(self._buf, dtype=np.float64, count=n * len(STEP_COLUMNS))
        self._blocks.append(rows.reshape(n, len(STEP_COLUMNS)).T.copy())
        self._pending = 0

    def __len__(self) -> int:
        return sum(b.shape[1] for b in self._blocks) + self._pending

    def _array(self) -> np.ndarray:
        """All rows, (rows, len(STEP_COLUMNS))."""
        self._pack()
        if not self._blocks:
            return np.empty((0, len(STEP_COLUMNS)))
        if len(self._blocks) > 1:
            self._blocks = [np.concatenate(self._blocks, axis=1)]
        return self._blocks[0].T

    def __iter__(self) -> Iterator[tuple]:
        """The rows as tuples of STEP_COLUMNS, counts as ints."""
        rows = self._array()  # packs the last rows
        names = self.names
        counts = [STEP_COLUMNS.index(c) for c in STEP_INT_COLUMNS]
        for row in rows:
            values = row.tolist()
            values[0] = names[int(values[0])]
            for i in counts:
                values[i] = int(values[i])
            yield tuple(values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepLog):
            return NotImplemented
        a, b = self._array(), other._array()
        names = [self.names[int(c)] for c in a[:, 0]]
        return (a.shape == b.shape and names == [other.names[int(c)] for c in b[:, 0]]
                and np.array_equal(a[:, 1:], b[:, 1:], equal_nan=True))

    __hash__ = None  # mutable

    def frame(self) -> pd.DataFrame:
        """The step table (STEP_COLUMNS; counts as int64), built column by column from the
        blocks, which hold their rows by column: one contiguous copy of each column (a frame
        of the whole row array and its casts took 0.5 s of a light-load hour's 580K steps)."""
        self._pack()
        blocks = self._blocks

        def column(i: int, dtype: type) -> np.ndarray:
            if not blocks:
                return np.empty(0, dtype=dtype)
            return np.concatenate([b[i] for b in blocks]).astype(dtype, copy=False)

        cols = {name: column(i, np.int64 if name in STEP_INT_COLUMNS else np.float64)
                for i, name in enumerate(STEP_COLUMNS)}
        codes = cols["instance"].astype(np.int64) if blocks else np.empty(0, dtype=np.int64)
        cols["instance"] = np.array(self.names, dtype=object)[codes]
        return pd.DataFrame(cols, copy=False)
