"""Replay a session-graph workload against real vLLM servers and record what they do.

The replay policy is the simulator's own (`rackSim.workload.replay`): `concurrency` closed-loop
lanes, each replaying sessions one after another (subagent branches concurrently), a primer
that makes each lane's active prefix resident (sent for real here, one output token, phase
"primer"), warm-up requests per lane, then the measurement window. Lane i is served by
endpoint i mod n (session affinity, as one would pin an agent to a replica).

Each request is a streaming `/v1/completions` call with the prompt as token ids
(`rackSim.workload.tokens.prompt_token_ids`), `max_tokens` = the request's output tokens,
`ignore_eos`, `return_token_ids` and `stream_options: include_usage + continuous_usage_stats`.
A turn's prompt re-sends the outputs of the requests it continues (`output_spans`); by default
(`prompt_outputs="server"`) as the token ids the server generated for them in this run, as an
agent re-sends what the model said, so the blocks those outputs filled hit the server's prefix
cache; with "workload" as the workload's own ids, which never match them (runs recorded
before this choice existed did so, and their run.json has no `prompt_outputs`). The
server's ids are kept in `outputs.jsonl` (one line per request, for a resumed run); where an
output was not generated in this run (a lane's primer generates one token of it) the
workload's ids stay. Workloads with explicit prompt paths (trace loaders) have no
outputs to re-send and record "workload".
Times are seconds since the run (segment) started, on the monotonic clock; every token's
arrival is kept in `token_times_s`. Records are appended and flushed as each request ends
(`recording`); `/metrics` is scraped before, every `scrape_interval_s` during, and after.

Resume: the replay plan is deterministic in (sessions, replay spec, seed). A resumed run
replays the same plan; a request whose key already has a successful record is not sent again -
it completes at once (its delay skipped) and still counts toward its lane's warm-up. Failed
requests are sent again (their old failing records stay in the file). The resumed segment's
clock starts 1 s after the latest time in the file, so times stay increasing; the measurement
window is the last segment's (run.json lists every segment).

Server shape: the preflight reads each server's KV cache shape from `/metrics`
(`vllm:cache_config_info`: block size, KV capacity, prefix caching; the process start time)
and run.json keeps it per endpoint. Every scrape checks it again: a server that restarts or
changes shape mid-run stops the run (stop_reason `server_changed`, run.json says what changed),
since nothing fitted from it would describe one server.

Drift: repeated runs on one server can slow down (measured here: TTFT P50 52 -> 90 ms over six
runs at the same load; a fresh server restores the first numbers). Before the primer and after
the drain the driver sends a fixed probe to each endpoint, one request at a time
(`PROBE_REQUESTS` requests of `PROBE_PROMPT` fresh random tokens, so never a cache hit, and
`PROBE_OUTPUT` output tokens), and keeps the median TTFT and time per output token of each;
the probe runs twice before, the first round discarded (a fresh server's first requests are
slow while it compiles: measured here, TTFT -46% between a cold and a warm probe).
run.json's `probe` holds both and their change; a change beyond `DRIFT_LIMIT` marks the run as
drifting, which `run` reports in its summary.

The driver's own CPU: every timestamp is taken when the driver's event loop gets to it, so a
driver waiting for a CPU records tokens late and in bursts and sends late. Each segment keeps
the driver thread's time on a CPU and runnable but waiting for one (`driver_cpu_s`,
`driver_wait_s`, from the kernel's schedstat); a wait beyond `DRIVER_WAIT_LIMIT` of the
segment marks its timestamps as late, which `run` reports. Measured on the 2-core machine with
a local server at the driver's priority, at 12 lanes: the driver waited 43% of the run, and
for 0.2-0.6 s at a time no token reached it while the server kept streaming.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from rackSim.config.specs import ReplaySpec
from rackSim.metrics.records import RequestRecord
from rackSim.validate.faults import ErrorPolicy, classify
from rackSim.validate.recording import RecordWriter, done_keys, read_record_rows
from rackSim.validate.scrape import (
    EndpointError,
    ScrapeLog,
    ServerInfo,
    cache_shape,
    preflight,
    scrape,
    shape_change,
)
from rackSim.validate.server import schedstat_s
from rackSim.workload.graph import RequestSpec, SessionGraph, SessionInstance
from rackSim.workload.replay import PRIMER, ClosedLoopReplay, SessionCursor
from rackSim.workload.tokens import FIRST_TOKEN_ID, output_spans, prompt_token_ids

RECORDS, SCRAPES, RUN_META, OUTPUTS = "records.jsonl", "scrapes.jsonl", "run.json", \
    "outputs.jsonl"
PROMPT_OUTPUTS = ("server", "workload")
PROBE_REQUESTS, PROBE_PROMPT, PROBE_OUTPUT = 5, 512, 32
DRIFT_LIMIT = 0.25  # relative change of a probe median that marks a server as drifting
DRIVER_WAIT_LIMIT = 0.05  # share of a segment the driver may wait for a CPU


def thread_cpu_s() -> tuple[float, float] | None:
    """The calling thread's time on a CPU and runnable but waiting for one (s), from
    /proc/thread-self/schedstat; None where the kernel does not keep them."""
    return schedstat_s("/proc/thread-self/schedstat")


def driver_wait_share(segment: dict) -> float | None:
    """The share of a run.json segment the driver waited for a CPU (None: not measured)."""
    wait = segment.get("driver_wait_s")
    span = segment["end_s"] - segment["start_s"]
    return None if wait is None or span <= 0 else wait / span


@dataclass
class DriverSettings:
    """endpoints: base URLs. model: served model name (None = the first /v1/models lists).
    scrape_interval_s: seconds between /metrics scrapes during the run. max_requests: hard
    cap on requests sent in this segment. max_duration_s: wall-clock cap on the segment.
    vocab_size: token ids are drawn from [4, vocab_size). token_salt: rotates every token id
    (a bijection on the vocabulary, so prefix sharing is unchanged) so that a run does not hit
    prefixes a previous run left in the server's cache; None = a fresh random salt (a resumed
    run reuses the salt in run.json). probe: the drift probe before and after (module
    docstring). server_log: a local server's log; run.json then keeps this segment's byte
    range of it (probes excluded) and the scheduler limits its start-up lines state.
    prompt_outputs: what a prompt re-sends as an earlier request's output, "server" (the ids
    it generated) or "workload" (the workload's ids) (module docstring)."""

    endpoints: list[str]
    replay: ReplaySpec
    seed: int = 0
    model: str | None = None
    policy: ErrorPolicy = field(default_factory=ErrorPolicy)
    scrape_interval_s: float = 5.0
    max_requests: int = 5000
    max_duration_s: float = 3600.0
    vocab_size: int = 32_000
    resume: bool = False
    token_salt: int | None = None
    probe: bool = True
    server_log: Path | None = None
    prompt_outputs: str = "server"


@dataclass
class DriverOutcome:
    """How a segment ended. stop_reason: window | max_requests | max_duration | max_errors |
    server_changed | interrupted."""

    out_dir: Path
    sent: int
    failed: int
    skipped: int
    stop_reason: str
    window_start_s: float | None
    window_end_s: float | None
    records_path: Path
    meta: dict


class ReplayDriver:
    """One segment of a validated run (see the module docstring)."""

    def __init__(self, sessions: list[SessionGraph], settings: DriverSettings, out_dir: Path):
        if not settings.endpoints:
            raise ValueError("--endpoint: give at least one vLLM server URL")
        self.sessions, self.s, self.out_dir = sessions, settings, out_dir
        self.replay = ClosedLoopReplay(sessions, settings.replay, settings.seed)
        self.records_path = out_dir / RECORDS
        self.done = done_keys(self.records_path) if settings.resume else set()
        if not settings.resume and self.records_path.exists() and \
                self.records_path.stat().st_size > 0:
            raise FileExistsError(f"{self.records_path} exists: pass --resume to continue that "
                                  "run, or choose a new --out directory")
        self.offset_s = _last_time(self.records_path) + 1.0 if settings.resume else 0.0
        self.salt = settings.token_salt
        meta_path = out_dir / RUN_META
        if self.salt is None and settings.resume and meta_path.exists():
            self.salt = json.loads(meta_path.read_text()).get("token_salt")
        if self.salt is None:
            self.salt = int.from_bytes(os.urandom(4), "little")
        self.prompt_outputs = _prompt_outputs(settings, sessions, meta_path)
        self.outputs_path = out_dir / OUTPUTS
        if not settings.resume:
            self.outputs_path.unlink(missing_ok=True)  # a new run re-sends none of another's
        self.outputs = read_outputs(self.outputs_path)
        self.sent = self.failed = self.skipped = 0
        self.stop_reason: str | None = None
        self._t0 = 0.0
        self._inflight: set[asyncio.Task] = set()
        self._sleeping: set[asyncio.Task] = set()
        self._infos: list[ServerInfo] = []
        self.server_changed: str | None = None  # what changed on a server mid-run
        self.probes: dict[str, dict] = {}  # endpoint -> {"before"|"after": probe medians}
        self._log_range: tuple[int, int] | None = None  # this segment's bytes of server_log

    # -- clock and bookkeeping -------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self._t0 + self.offset_s

    def _stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    def _server(self, lane: int) -> ServerInfo:
        """The server a lane's requests go to: endpoint lane mod n (session affinity)."""
        return self._infos[lane % len(self._infos)]

    # -- sending ---------------------------------------------------------------------------
    async def _request(self, client: httpx.AsyncClient, inst: SessionInstance, spec: RequestSpec,
                       primer: bool) -> None:
        lane = inst.lane
        key = f"{inst.key_base}:{spec.rid}:{'p' if primer else 'r'}"
        phase = PRIMER if primer else self.replay.phase_of_send(lane, self.now())
        if key in self.done:
            self.skipped += 1
            return
        info = self._server(lane)
        ids = self._prompt(inst, spec.rid)
        rec = RequestRecord(session_id=inst.graph.session_id, rid=spec.rid, lane=lane,
                            session_key=inst.key_base, agent=spec.agent, send_s=self.now(),
                            prompt_tokens=len(ids),
                            phase=phase, prefill_instance=lane % len(self._infos))
        body = {"model": info.model, "prompt": ids.tolist(), "max_tokens": spec.output_tokens,
                "stream": True, "ignore_eos": True, "return_token_ids": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        self.sent += 1
        generated: list[int] = []
        try:
            await asyncio.wait_for(self._stream(client, info.url, body, rec, generated),
                                   self.s.policy.request_timeout_s)
            if rec.error is None and rec.output_tokens < spec.output_tokens:
                rec.error = (f"truncated: stream ended after {rec.output_tokens} of "
                             f"{spec.output_tokens} tokens")
            if rec.error is None and self.prompt_outputs == "server":
                self._keep_output(f"{inst.key_base}:{spec.rid}", generated)
        except asyncio.CancelledError:
            rec.error = "protocol: cancelled (run interrupted)"
            raise
        except Exception as err:  # noqa: BLE001 - every failure is recorded, then policy
            rec.error = classify(err) if not isinstance(err, TimeoutError) else \
                f"timeout: request exceeded {self.s.policy.request_timeout_s:.0f} s"
        finally:
            rec.finish_s = rec.token_times_s[-1] if rec.error is None and rec.token_times_s \
                else self.now()
            self.writer.write(rec, key, info.url)
            if rec.error is not None:
                self.failed += 1
                if self.s.policy.should_stop(self.failed):
                    self._stop("max_errors")

    def _prompt(self, inst: SessionInstance, rid: int) -> np.ndarray:
        """The token ids request `rid`'s prompt is sent as: the workload's (salted), with the
        outputs it re-sends replaced by the server's where this run generated them."""
        ids = salted_ids(prompt_token_ids(inst, rid, self.s.vocab_size), self.salt,
                         self.s.vocab_size)
        if self.prompt_outputs == "server":
            reqs = inst.graph.requests
            for a, start, end in output_spans(inst, rid):
                got = self.outputs.get(f"{inst.key_base}:{a}")
                if got is not None:
                    first = reqs[a].prompt_tokens
                    n = min(end, first + len(got)) - start
                    if n > 0:
                        ids[start:start + n] = got[start - first:start - first + n]
        return ids

    def _keep_output(self, key: str, generated: list[int]) -> None:
        self.outputs[key] = np.asarray(generated, dtype=np.int64)
        with self.outputs_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"key": key, "ids": generated}, separators=(",", ":")) + "\n")

    async def _stream(self, client: httpx.AsyncClient, url: str, body: dict,
                      rec: RequestRecord, generated: list[int]) -> None:
        """Stream one completion into `rec` (token times, usage) and `generated` (the
        output's token ids, as the server returns them)."""
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code >= 400:
                text = (await resp.aread()).decode(errors="replace")[:300]
                rec.error = f"http: {resp.status_code} {text}"
                return
            saw_done = False
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    # read on to the body's end: a response left unread closes its
                    # connection, and every request would then open a new one
                    saw_done = True
                    continue
                t = self.now()
                chunk = json.loads(data)
                if "error" in chunk and not chunk.get("choices"):
                    rec.error = f"http: in-stream error {str(chunk['error'])[:300]}"
                    return
                for ch in chunk.get("choices") or []:
                    ids = ch.get("token_ids")
                    n = len(ids) if ids is not None else (1 if ch.get("text") else 0)
                    if ids:
                        generated.extend(ids)
                    if n and math.isnan(rec.first_token_s):
                        rec.first_token_s = t
                    rec.token_times_s.extend([t] * n)
                    rec.output_tokens += n
                usage = chunk.get("usage")
                if usage:
                    rec.prompt_tokens = int(usage.get("prompt_tokens", rec.prompt_tokens))
                    details = usage.get("prompt_tokens_details") or {}
                    if details.get("cached_tokens") is not None:
                        rec.cached_tokens = int(details["cached_tokens"])
            if not saw_done:
                rec.error = (f"truncated: stream closed before [DONE] after "
                             f"{rec.output_tokens} tokens")

    async def _probe(self, client: httpx.AsyncClient, info: ServerInfo, label: str) -> dict:
        """The fixed probe (module docstring): median TTFT and time per output token (ms)."""
        rng = np.random.default_rng([self.salt, len(label), self.s.seed])
        ttft, tpot = [], []
        for _ in range(PROBE_REQUESTS):
            ids = rng.integers(0, self.s.vocab_size, PROBE_PROMPT)
            rec = RequestRecord(session_id=-1, rid=0, lane=-1, session_key=-1, agent="probe",
                                send_s=self.now(), prompt_tokens=PROBE_PROMPT, phase="probe")
            body = {"model": info.model, "prompt": ids.tolist(), "max_tokens": PROBE_OUTPUT,
                    "stream": True, "ignore_eos": True, "return_token_ids": True}
            await self._stream(client, info.url, body, rec, [])
            if rec.error is None and rec.output_tokens > 1:
                ttft.append((rec.first_token_s - rec.send_s) * 1e3)
                tpot.append((rec.token_times_s[-1] - rec.first_token_s) * 1e3
                            / (rec.output_tokens - 1))
        return {"ttft_ms": float(np.median(ttft)) if ttft else math.nan,
                "tpot_ms": float(np.median(tpot)) if tpot else math.nan, "ok": len(ttft)}

    async def _probe_all(self, client: httpx.AsyncClient, label: str) -> None:
        for info in self._infos:
            try:
                self.probes.setdefault(info.url, {})[label] = \
                    await self._probe(client, info, label)
            except (httpx.HTTPError, ValueError) as err:
                self.probes.setdefault(info.url, {})[label] = {"error": classify(err)}

    def _log_size(self) -> int:
        return self.s.server_log.stat().st_size if self.s.server_log is not None else 0

    def drift(self) -> dict:
        """Per endpoint: the probe before and after, each median's relative change, and
        whether any change exceeds DRIFT_LIMIT."""
        out = {}
        for url, pr in self.probes.items():
            before, after = pr.get("before", {}), pr.get("after", {})
            change = {k: (after[k] - before[k]) / before[k]
                      for k in ("ttft_ms", "tpot_ms")
                      if before.get(k) and after.get(k) is not None
                      and not math.isnan(before[k]) and not math.isnan(after[k])}
            out[url] = {"before": before, "after": after, "change": change,
                        "drifting": any(abs(v) > DRIFT_LIMIT for v in change.values())}
        return out

    # -- the closed loop -------------------------------------------------------------------
    def _spawn(self, coro, sleeping: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        bucket = self._sleeping if sleeping else self._inflight
        bucket.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task) -> None:
        self._sleeping.discard(task)
        self._inflight.discard(task)

    def _later(self, client: httpx.AsyncClient, cursor: SessionCursor, spec: RequestSpec,
               at_once: bool = False) -> None:
        """Send `spec` after its delay (`at_once`: now, as a lane's first requests)."""
        self._spawn(self._run_one(client, cursor, spec, at_once), sleeping=True)

    async def _run_one(self, client: httpx.AsyncClient, cursor: SessionCursor,
                       spec: RequestSpec, at_once: bool = False) -> None:
        inst = cursor.inst
        key = f"{inst.key_base}:{spec.rid}:r"
        if spec.delay_s > 0 and not at_once and key not in self.done:
            await asyncio.sleep(spec.delay_s)
        end = self.replay.window_end_s
        if self.stop_reason is not None or (end is not None and self.now() >= end):
            return  # after the window nothing new is sent (as in the simulator)
        if self.sent >= self.s.max_requests:
            self._stop("max_requests")
            return
        task = asyncio.current_task()
        self._sleeping.discard(task)
        self._inflight.add(task)
        await self._request(client, inst, spec, primer=False)
        self._completed(client, cursor, spec)

    def _completed(self, client: httpx.AsyncClient, cursor: SessionCursor, spec: RequestSpec
                   ) -> None:
        lane = cursor.inst.lane
        self.replay.note_done(lane, self.now())
        for nxt in cursor.complete(spec.rid):
            self._later(client, cursor, nxt)
        if cursor.done and self.stop_reason is None:
            new = SessionCursor(self.replay.next(lane))
            for nxt in new.start():
                self._later(client, new, nxt)

    async def _lane(self, client: httpx.AsyncClient, lane: int) -> None:
        first = self.replay.first(lane)
        if first.primer is not None:
            await self._request(client, first.inst, first.primer, primer=True)
        cursor = SessionCursor(first.inst, first.start_rid)
        for spec in cursor.start():  # the lane arrives now, as in the simulator
            self._later(client, cursor, spec, at_once=True)

    async def _scraper(self, client: httpx.AsyncClient, log: ScrapeLog) -> None:
        while True:
            await asyncio.sleep(self.s.scrape_interval_s)
            await self._scrape_all(client, log, "during")

    async def _scrape_all(self, client: httpx.AsyncClient, log: ScrapeLog, label: str) -> None:
        for info in self._infos:
            try:
                samples = await scrape(client, info.url)
                await asyncio.to_thread(log.write, self.now(), info.url, label, samples)
                change = shape_change(info.shape, cache_shape(samples)) if info.shape else None
                if change is not None and self.server_changed is None:
                    self.server_changed = f"{info.url}: {change}"
                    self._stop("server_changed")
            except (httpx.HTTPError, ValueError) as err:
                log.write(self.now(), info.url, label, None, error=classify(err))

    async def run(self) -> DriverOutcome:
        """Preflight every endpoint, replay until the window (+ drain) has passed or a limit
        is hit, then write run.json. Raises EndpointError before sending anything when an
        endpoint is unreachable or not vLLM."""
        pol = self.s.policy
        timeout = httpx.Timeout(connect=pol.connect_timeout_s, read=pol.read_timeout_s,
                                write=pol.read_timeout_s, pool=None)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            self._infos = [await preflight(client, u, self.s.model) for u in self.s.endpoints]
            self._check_lengths()
            if self.s.probe:
                await self._probe_all(client, "warm-up")  # a fresh server's first requests
                await self._probe_all(client, "before")   # are slow: not the baseline
            log_start = self._log_size()
            self.writer = RecordWriter(self.records_path)
            log = ScrapeLog(self.out_dir / SCRAPES)
            self._t0 = time.monotonic()
            seg_start, cpu_start = self.now(), thread_cpu_s()
            await self._scrape_all(client, log, "before")
            scraper = asyncio.get_running_loop().create_task(self._scraper(client, log))
            try:
                for lane in range(self.replay.lanes):
                    self._spawn(self._lane(client, lane))
                await self._wait_until_done()
            except (asyncio.CancelledError, KeyboardInterrupt):
                self._stop("interrupted")
                raise
            finally:
                for t in list(self._sleeping):
                    t.cancel()
                if self.stop_reason == "interrupted":
                    for t in list(self._inflight):
                        t.cancel()
                await asyncio.gather(*self._inflight, *self._sleeping, return_exceptions=True)
                scraper.cancel()
                await asyncio.gather(scraper, return_exceptions=True)
                await self._scrape_all(client, log, "after")
                if self.s.server_log is not None:
                    await asyncio.sleep(1.0)  # the server logs a step's line after the step
                    self._log_range = (log_start, self._log_size())
                if self.s.probe and self.stop_reason != "interrupted":
                    await self._probe_all(client, "after")
                log.close()
                self.writer.close()
                cpu_end = thread_cpu_s()
                cpu = (None, None) if cpu_start is None or cpu_end is None else \
                    (cpu_end[0] - cpu_start[0], cpu_end[1] - cpu_start[1])
                meta = self._write_meta(seg_start, cpu)
        return DriverOutcome(self.out_dir, self.sent, self.failed, self.skipped,
                             self.stop_reason or "window", *self._window(), self.records_path,
                             meta)

    async def _wait_until_done(self) -> None:
        deadline = time.monotonic() + self.s.max_duration_s
        while True:
            await asyncio.sleep(0.05)
            end = self.replay.window_end_s
            if end is not None and self.now() >= end:
                self._stop("window")  # in-flight requests drain (bounded by the timeouts)
            if time.monotonic() > deadline:
                self._stop("max_duration")
            if self.stop_reason is not None:
                for t in list(self._sleeping):
                    t.cancel()
                if not self._inflight:
                    return
            elif not self._inflight and not self._sleeping:
                self._stop("plan_exhausted")
                return

    def _check_lengths(self) -> None:
        for info in self._infos:
            if info.max_model_len is None:
                continue
            for g in self.sessions:
                for r in g.requests:
                    if r.context_tokens > info.max_model_len:
                        raise EndpointError(
                            f"workload: session {g.session_id} request {r.rid} needs "
                            f"{r.context_tokens} tokens (prompt + output) but {info.url} has "
                            f"max_model_len {info.max_model_len}; lower the workload's "
                            "max_context_tokens or raise the server's --max-model-len")

    def _window(self) -> tuple[float | None, float | None]:
        ws = self.replay.window_start_s
        if ws is None:
            return None, None
        return ws, min(ws + self.s.replay.window_s, self.now())

    def _write_meta(self, seg_start: float, cpu: tuple[float | None, float | None]) -> dict:
        path = self.out_dir / RUN_META
        meta = json.loads(path.read_text()) if path.exists() else {
            "format": "racksim-validate-run/1", "segments": []}
        ws, we = self._window()
        meta.update({"token_salt": self.salt, "seed": self.s.seed,
                     "prompt_outputs": self.prompt_outputs,
                     "endpoints": [asdict(i) for i in self._infos],
                     "replay": self.s.replay.model_dump(), "num_sessions": len(self.sessions),
                     "window_start_s": ws, "window_end_s": we,
                     "server_changed": self.server_changed, "probe": self.drift()})
        if self._log_range is not None:
            from rackSim.validate.ingest import server_args_from_log

            log, (a, b) = self.s.server_log, self._log_range
            meta.setdefault("server_log", []).append(
                {"path": str(log.resolve()), "start_byte": a, "end_byte": b})
            meta["scheduler"] = server_args_from_log(log, a)
        meta["segments"].append({"start_s": seg_start, "end_s": self.now(), "sent": self.sent,
                                 "failed": self.failed, "skipped": self.skipped,
                                 "stop_reason": self.stop_reason or "window",
                                 "window_start_s": ws, "window_end_s": we,
                                 "driver_cpu_s": cpu[0], "driver_wait_s": cpu[1]})
        path.write_text(json.dumps(meta, indent=1))
        return meta


def salted_ids(ids: np.ndarray, salt: int, vocab_size: int) -> np.ndarray:
    """Rotate token ids in [FIRST_TOKEN_ID, vocab_size) by `salt` (equal ids stay equal)."""
    span = vocab_size - FIRST_TOKEN_ID
    return (ids - FIRST_TOKEN_ID + salt % span) % span + FIRST_TOKEN_ID


def _prompt_outputs(settings: DriverSettings, sessions: list[SessionGraph], meta_path: Path
                    ) -> str:
    """What this segment's prompts re-send as outputs: a resumed run keeps its run.json's
    choice (none recorded: "workload"); workloads with explicit paths have none to re-send."""
    if settings.prompt_outputs not in PROMPT_OUTPUTS:
        raise ValueError(f"prompt_outputs={settings.prompt_outputs!r}: one of {PROMPT_OUTPUTS}")
    if settings.resume and meta_path.exists():
        return recorded_prompt_outputs(json.loads(meta_path.read_text()))
    if any(r.path is not None for g in sessions for r in g.requests):
        return "workload"
    return settings.prompt_outputs


def recorded_prompt_outputs(meta: dict) -> str:
    """What a recorded run's prompts re-sent as outputs (run.json; runs recorded before the
    choice existed sent the workload's ids)."""
    return meta.get("prompt_outputs", "workload")


def read_outputs(path: Path) -> dict[str, np.ndarray]:
    """The server's output token ids a run kept, per request key (a torn last line is
    skipped: that request's successors get the workload's ids)."""
    out: dict[str, np.ndarray] = {}
    if not path.exists():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            out[row["key"]] = np.asarray(row["ids"], dtype=np.int64)
    return out


def _last_time(path: Path) -> float:
    t = 0.0
    if not path.exists():
        return t
    for row in read_record_rows(path):
        for k in ("finish_s", "send_s"):
            v = row.get(k)
            if isinstance(v, int | float):
                t = max(t, float(v))
    return t


def run_driver(sessions: list[SessionGraph], settings: DriverSettings, out_dir: Path
               ) -> DriverOutcome:
    """Synchronous entry: one segment of a validated run into `out_dir`."""
    return asyncio.run(ReplayDriver(sessions, settings, out_dir).run())
