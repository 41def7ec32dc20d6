"""A recorded run directory (`racksim-validate run` writes one): its workload, the server shape
it recorded, and the two things done with it: fit a profile, and predict it with a profile.

Shared by the `fit` and `compare` subcommands and by the grid (`grid`). Errors are ValueError
with the run, flag or field named and the fix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from rackSim.config.specs import WorkloadSpec
from rackSim.perf.measured import Profile, ServerShape
from rackSim.workload.graph import SessionGraph

WORKLOAD_FILE = "workload.json"
DELAY_SPAN_MIN_MS = 5.0  # the server-side delays tried span at least twice this
SCHEDULER_KEYS = ("max_num_seqs", "max_num_batched_tokens")


def run_workload(run: Path) -> tuple[WorkloadSpec, int]:
    """The workload and seed a run replayed."""
    path = run / WORKLOAD_FILE
    if not path.exists():
        raise ValueError(f"--run: {path} missing; is {run} a `racksim-validate run` directory?")
    doc = json.loads(path.read_text())
    return WorkloadSpec.model_validate(doc["workload"]), int(doc["seed"])


def reuses_outputs(run: Path) -> bool:
    """Whether a run's prompts re-sent earlier outputs as the ids the server generated
    (run.json `prompt_outputs`)."""
    from rackSim.validate.driver import recorded_prompt_outputs

    path = run / "run.json"
    return path.exists() and recorded_prompt_outputs(json.loads(path.read_text())) == "server"


def recorded_shape(run: Path) -> dict:
    """The server shape a run recorded (ServerShape fields it knows): KV block and capacity
    from the endpoints' /metrics, scheduler limits from the server log. ValueError when the
    endpoints differ, or when the run stopped because a server changed mid-run."""
    path = run / "run.json"
    if not path.exists():
        raise ValueError(f"--run: {path} missing; is {run} a `racksim-validate run` directory?")
    meta = json.loads(path.read_text())
    if meta.get("server_changed"):
        raise ValueError(f"--run {run}: a server changed mid-run ({meta['server_changed']}); "
                         "nothing fitted from it would describe one server: run again")
    shapes = [{k: e["shape"][k] for k in ("block_tokens", "kv_capacity_tokens")
               if k in e.get("shape", {})} for e in meta.get("endpoints", [])]
    if any(sh != shapes[0] for sh in shapes):
        raise ValueError(f"--run {run}: its endpoints have different shapes {shapes}; fit one "
                         "server's run at a time")
    out = dict(shapes[0]) if shapes else {}
    sched = meta.get("scheduler", {})
    out.update({k: sched[k] for k in SCHEDULER_KEYS if k in sched})
    return out


def complete_shape(run: Path, given: dict[str, int | None]) -> ServerShape:
    """The recorded shape completed by `given` (flag values, None = not given); a given value
    that contradicts the record is refused (kv_capacity_tokens: the record wins)."""
    shape = recorded_shape(run)
    for key, value in given.items():
        if value is None:
            continue
        if key in shape and shape[key] != value and key != "kv_capacity_tokens":
            raise ValueError(f"--{key.replace('_', '-')} {value}: the run recorded "
                             f"{shape[key]} for this server; drop the flag")
        shape.setdefault(key, value)
    missing = [k for k in SCHEDULER_KEYS if k not in shape]
    if missing:
        raise ValueError(f"--run {run}: the server's {', '.join(missing)} were not recorded "
                         "(run with --server-log for a local server); give "
                         + " and ".join(f"--{k.replace('_', '-')}" for k in missing))
    return ServerShape(**shape)


def log_ranges(run: Path) -> list[tuple[Path, int, int]]:
    """The (server log, start byte, end byte) ranges a run kept (`run --server-log`)."""
    meta = json.loads((run / "run.json").read_text())
    return [(Path(r["path"]), r["start_byte"], r["end_byte"])
            for r in meta.get("server_log", [])]


def run_speed(run: Path, profile: Profile) -> dict[str, float]:
    """How many times slower (> 1) or faster the server computed during `run` than during
    `profile`'s fitting run, per kind of work ('decode', 'prefill'): `Profile.ratios` of the
    run's iteration-log steps over the same ratios on the fitting run (`Profile.step_ratios`).
    Read from the run's own steps; a kind the run or the fitting run lacks takes the other
    kind's factor."""
    from rackSim.validate.ingest import read_iteration_log

    if not profile.step_ratios:
        raise ValueError("--at-run-speed: the profile has no step_ratios, so no reference "
                         "speed; use a profile fitted on an iteration log (fit --source log)")
    ranges = log_ranges(run)
    if not ranges:
        raise ValueError(f"--at-run-speed: {run} kept no server log range, so its speed is not "
                         "known; record runs with `run --server-log`")
    now = profile.ratios([row for path, a, b in ranges for row in read_iteration_log(path, a, b)])
    speed = {k: now[k] / profile.step_ratios[k] for k in now if k in profile.step_ratios}
    if not speed:
        raise ValueError(f"--at-run-speed: no iteration lines in {run}'s server log range")
    return {k: speed.get(k, next(iter(speed.values()))) for k in ("decode", "prefill")}


def frontend_output_ms(run: Path, recs: list) -> tuple[float, dict]:
    """Front-end CPU per output token on `run` (ms) and where it came from: the API server's
    (its `process_cpu_seconds_total` over its `vllm:generation_tokens_total`, /metrics before
    and after the run) plus the measuring driver's (`driver_cpu_s` of run.json over the tokens
    of its records). A part the run did not record counts 0 and is named in the provenance."""
    from rackSim.validate.scrape import read_scrapes, run_delta

    path = run / "scrapes.jsonl"
    scrapes = read_scrapes(path) if path.exists() else []
    api_cpu = run_delta(scrapes, "process_cpu_seconds_total")
    api_tokens = run_delta(scrapes, "vllm:generation_tokens_total")
    api = api_cpu / api_tokens * 1e3 if api_tokens > 0 and api_cpu >= 0 else 0.0
    meta = json.loads((run / "run.json").read_text())
    drv_cpu = sum(s.get("driver_cpu_s", 0.0) for s in meta.get("segments", []))
    drv_tokens = sum(r.output_tokens for r in recs)
    drv = drv_cpu / drv_tokens * 1e3 if drv_tokens > 0 else 0.0
    prov = {"api_server_ms": api, "driver_ms": drv, "from": str(run),
            "how": "CPU seconds over output tokens: API server (/metrics), driver (run.json)"}
    if not api:
        prov["missing"] = "the API server's CPU or token counters (no /metrics scrapes)"
    return api + drv, prov


def fit_run(run: Path, source: str, shape: ServerShape, refine: bool = False,
            ranges: list[tuple[Path, int, int]] | None = None) -> Profile:
    """Fit a profile on `run`: source 'log' (its iteration-log ranges, or `ranges`) or
    'records' (black box); `refine` then sets the overheads by simulating the run."""
    from rackSim.validate.compare import summarize_run
    from rackSim.validate.fit import fit_driver_records, fit_iteration_log
    from rackSim.validate.ingest import load_driver_run, read_iteration_log
    from rackSim.validate.refine import refine_overheads
    from rackSim.workload.sources import load_sessions

    recs, t0, t1 = load_driver_run(run)
    if not recs:
        raise ValueError(f"--run {run}: no request records; nothing to fit")
    if source == "log":
        ranges = ranges or log_ranges(run)
        if not ranges:
            raise ValueError("fit --source log: give --log SERVER.LOG (the run kept no server "
                             "log range; use `run --server-log` next time)")
        steps = [row for path, a, b in ranges for row in read_iteration_log(path, a, b)]
        prof = fit_iteration_log(steps, shape, records=recs,
                                 inputs=[f"{p}[{a}:{b}]" for p, a, b in ranges] + [str(run)])
    else:
        prof = fit_driver_records(recs, shape, inputs=[str(run)])
    # the front-end per output token is measured; the constant keeps the rest (a request
    # alone in its step is handled first: one output's worth; `refine` then sets it exactly)
    prof.output_ms, prof.provenance["output_ms"] = frontend_output_ms(run, recs)
    prof.api_overhead_ms = max(0.0, prof.api_overhead_ms - prof.output_ms)
    wl, seed = run_workload(run)
    sessions = load_sessions(wl, seed)
    if refine:
        prof = refine_overheads(prof, sessions, wl.replay, seed,
                                summarize_run(recs, t0, t1, "measured").summary,
                                reuse_outputs=reuses_outputs(run))
    fit_front_end(run, recs, prof, sessions, server_delay=not refine)
    return prof


def fit_front_end(run: Path, recs: list, prof: Profile, sessions: list[SessionGraph],
                  server_delay: bool) -> None:
    """Split `prof`'s delay before the scheduler where the server's own TTFT histogram splits
    it (in place, with provenance), when the run has one:

    - `intake_ms`, the part before the server stamps a request: the run's client-minus-server
      TTFT mean less the output delay the model gives the same run's first tokens, within
      [0, api_overhead_ms];
    - with `server_delay`, the part the server counts (api_overhead_ms - intake_ms), set so
      that the simulated run's server TTFT mean over the measurement window (between the
      first and last /metrics scrapes inside it, the primers left out) is the server's own:
      where a line through that mean simulated at `refine.LINE_POINTS` delays (0 to twice the
      iteration-log fit's estimate from requests that prefilled alone) meets it
      (`refine.solve_by_line`: a shifted delay reshuffles the simulated batches and moves the
      mean of ~130 requests by a few ms from one delay to the next); the line is kept in the
      provenance."""
    from rackSim.validate.colocated import simulate_colocated
    from rackSim.validate.compare import ttft_all_mean_ms
    from rackSim.validate.refine import LINE_POINTS, solve_by_line
    from rackSim.validate.scrape import (
        SERVER_MEANS,
        read_scrapes,
        server_ttft_mean_ms,
        window_histogram_mean_ms,
    )

    path = run / "scrapes.jsonl"
    scrapes = read_scrapes(path) if path.exists() else []
    server = server_ttft_mean_ms(scrapes)
    if math.isnan(server):
        prof.intake_ms = 0.0
        prof.provenance["intake_ms"] = {
            "missing": "the server's TTFT histogram (no /metrics scrapes)"}
        return
    gap = ttft_all_mean_ms(recs) - server
    wl, seed = run_workload(run)
    reuse = reuses_outputs(run)

    def sim(p: Profile):
        return simulate_colocated(sessions, wl.replay, p, seed=seed, reuse_outputs=reuse)

    delay = [(r.first_token_s - r.prefill_end_s) * 1e3 for r in sim(prof).records
             if r.error is None and not math.isnan(r.first_token_s)]
    out = float(np.mean(delay)) if delay else 0.0
    intake = max(gap - out, 0.0)
    prov = {"client_minus_server_ttft_ms": gap, "output_delay_ms": out, "from": str(run)}
    meta = json.loads((run / "run.json").read_text())
    ws = meta.get("window_start_s")
    win, a, b = window_histogram_mean_ms(scrapes, SERVER_MEANS["server_ttft_mean_ms"], ws,
                                         meta.get("window_end_s")) if ws is not None \
        else (math.nan,) * 3
    if server_delay and not math.isnan(win):
        def window_ttft(d: float) -> float:
            p = replace(prof, api_overhead_ms=intake + d, intake_ms=intake)
            o = sim(p)
            window = (o.window_start_s + a - ws, o.window_start_s + b - ws)
            means = simulated_server_means_ms(o, p, window)
            return means.get("server_ttft_mean_ms", math.nan)

        span = 2.0 * max(prof.api_overhead_ms - intake, DELAY_SPAN_MIN_MS)
        d, line = solve_by_line(window_ttft, win, np.linspace(0.0, span, LINE_POINTS))
        prov.update(window_server_ttft_mean_ms=win, window_s=[a, b],
                    alone_api_overhead_ms=prof.api_overhead_ms, server_delay_line=line)
        if d is not None:
            prof.api_overhead_ms = intake + d
        else:
            prov["server_delay"] = ("kept the alone-requests estimate: the simulated window's "
                                    "TTFT did not grow with the delay")
    elif server_delay:
        prov["server_delay"] = "kept: no two /metrics scrapes inside the window"
    prof.intake_ms = min(intake, prof.api_overhead_ms)
    prof.provenance["intake_ms"] = prov


def simulated_server_means_ms(sim, profile: Profile,
                              window: tuple[float, float] | None = None) -> dict[str, float]:
    """What the simulated server's own histograms would say (ms; `scrape.SERVER_MEANS`), over
    its successful requests: TTFT from its arrival stamp (the send plus the intake) to the end
    of the step that computes its first token; queue from the first step boundary after it
    reaches the scheduler (send plus api_overhead_ms) to the start of the step that admits
    it; prefill from there to the first token. `sim`: a ColocatedOutput. `window` (simulated
    s, both ends included): what the histograms gained between two scrapes at those times,
    as vLLM observes them: TTFT when the first token is computed, queue and prefill when the
    request finishes (NaN for a part with no request in the window)."""
    done = [r for r in sim.records if r.error is None and not math.isnan(r.first_token_s)]
    if not done:
        return {}
    starts = np.sort(np.array([row[2] for row in sim.steps]))
    send = np.array([r.send_s for r in done])
    admit = np.array([r.prefill_start_s for r in done])
    end = np.array([r.prefill_end_s for r in done])
    boundary = starts[np.minimum(np.searchsorted(starts, send + profile.api_overhead_ms / 1e3),
                                 len(starts) - 1)]
    parts = {"server_ttft_mean_ms": (end - send) * 1e3 - profile.intake_ms,
             "server_queue_mean_ms": np.clip(admit - boundary, 0, None) * 1e3,
             "server_prefill_mean_ms": (end - admit) * 1e3}
    if window is None:
        return {k: float(v.mean()) for k, v in parts.items()}
    lo, hi = window
    fin = np.array([r.finish_s for r in done])
    seen = {"server_ttft_mean_ms": (end >= lo) & (end <= hi)}
    out = {}
    for k, v in parts.items():
        keep = seen.get(k, (fin >= lo) & (fin <= hi))
        out[k] = float(v[keep].mean()) if keep.any() else math.nan
    return out


@dataclass
class Prediction:
    """A run measured and predicted: both summaries and the comparison table."""

    measured: dict
    predicted: dict
    table: pd.DataFrame
    sessions: list[SessionGraph]
    speed: dict[str, float]  # decode / prefill work priced this many times slower (1: as fitted)


def predict_run(run: Path, profile: Profile, allow_other_shape: bool = False,
                at_run_speed: bool = False) -> Prediction:
    """Simulate `run`'s workload (same seed) on the colocated model priced by `profile` and
    compare with what was measured. A profile of another server shape is refused unless
    `allow_other_shape`. `at_run_speed`: price the engine at the speed the run measured
    (`run_speed`), which separates the model's error from the machine's speed that day."""
    from rackSim.validate.colocated import simulate_colocated
    from rackSim.validate.compare import compare_summaries, summarize_run
    from rackSim.validate.ingest import load_driver_run
    from rackSim.validate.scrape import read_scrapes, server_means_ms
    from rackSim.workload.sources import load_sessions

    wl, seed = run_workload(run)
    differ = {k: (v, getattr(profile.server, k)) for k, v in recorded_shape(run).items()
              if getattr(profile.server, k) != v}
    if differ and not allow_other_shape:
        what = ", ".join(f"{k}: run {a}, profile {b}" for k, (a, b) in differ.items())
        raise ValueError(f"--profile: fitted on a server of another shape than {run}'s "
                         f"({what}); fit a profile on this server, or pass "
                         "--allow-other-shape")
    recs, t0, t1 = load_driver_run(run)
    if not recs:
        raise ValueError(f"--run {run}: no request records; nothing to compare")
    speed = run_speed(run, profile) if at_run_speed else {"decode": 1.0, "prefill": 1.0}
    if at_run_speed:
        profile = profile.at_speed(**speed)
    sessions = load_sessions(wl, seed)
    sim = simulate_colocated(sessions, wl.replay, profile, seed=seed,
                             reuse_outputs=reuses_outputs(run))
    scrapes = run / "scrapes.jsonl"
    server = server_means_ms(read_scrapes(scrapes)) if scrapes.exists() else {}
    measured = summarize_run(recs, t0, t1, "measured", sessions=sessions, server=server).summary
    predicted = summarize_run(sim.records, sim.window_start_s, sim.window_end_s, "simulated",
                              sessions=sessions, server=simulated_server_means_ms(
                                  sim, profile)).summary
    return Prediction(measured, predicted, compare_summaries(measured, predicted), sessions,
                      speed)
