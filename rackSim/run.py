"""One call from a validated scenario to a Result: build, simulate, summarise, write.

`run_sweep_job` is the body of one Hydra multirun job: it skips a scenario the sweep already
finished (resume), records a failed one (`error.json`) instead of stopping the sweep, and
leaves a `job.json` record that `rackSim.report.sweep_table` turns into the sweep's table.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from rackSim.config.specs import DBO_MARK, DeploymentSpec, RunConfig
from rackSim.engine.simulation import Simulation
from rackSim.metrics.summary import FleetLayout, Result, summarize, window_mask
from rackSim.perf.step import COMPONENTS
from rackSim.report.files import PARTIAL_MARKER, SCENARIO_FILE, clear_run_files, write_result
from rackSim.workload.graph import SessionGraph
from rackSim.workload.sources import load_sessions

JOB_RECORD = "job.json"
ERROR_RECORD = "error.json"


def layout_name(dep: DeploymentSpec) -> str:
    """Short layout label, e.g. `P8xDEP2+DEP32`: prefill instances x their width + decode width
    (`C3xDEP16`: three colocated DEP16 instances; `P4xDEP8(dbo)+DEP32`: the prefill
    instances with dual-batch overlap);
    a fleet names each rack group as `racks x (layout)` with its decode instances, e.g.
    `14x(P8xDEP2+2xDEP16)` (a part with no instances is left out)."""
    labels = []
    for g in dep.rack_groups:
        p, d, c = g.prefill, g.decode, g.colocated
        dec = f"{d.instances}x" if d.instances != 1 else ""
        label = "+".join(part for n, part in (
            (p.instances, f"P{p.instances}x{p.parallelism}{p.gpus_per_instance}{_dbo(p)}"),
            (d.instances, f"{dec}{d.parallelism}{d.gpus}{_dbo(d)}"),
            (g.colocated_instances,
             f"C{g.colocated_instances}x{c.parallelism}{c.gpus}{_dbo(c)}" if c else "")) if n)
        labels.append(label if g.racks == 1 and not dep.groups else f"{g.racks}x({label})")
    return " + ".join(labels)


def scenario_label(cfg: RunConfig) -> str:
    """`layout (deployment) | model | hardware`, e.g. `P8xDEP2+DEP16 (agentx_p8_dep32) |
    DeepSeek-V4.1-Flash | GB300-NVL72`: the layout simulated, which overrides may have changed
    from the deployment's own, then the deployment's name (left out when it is the layout)."""
    layout, name = layout_name(cfg.deployment), cfg.deployment.name
    head = layout if name == layout else f"{layout} ({name})"
    return f"{head} | {cfg.model.name} | {cfg.hardware.name}"


def _dbo(instances) -> str:
    """`(dbo)` after an instance kind that runs with dual-batch overlap."""
    return DBO_MARK if instances.dbo.enabled else ""


def decode_width(dep: DeploymentSpec) -> int:
    """GPUs per instance of the instances that decode in the first rack group: its decode
    instances', or its colocated instances' when it serves colocated (what a width sweep
    varies; the unused decode section of a colocated layout says nothing)."""
    g = dep.rack_groups[0]
    return g.colocated.gpus if g.colocated_instances else g.decode.gpus


def decode_breakdown_ms(steps: pd.DataFrame, t0: float, t1: float) -> dict[str, float]:
    """Mean decode step time and its components over the window [t0, t1) (s), as
    `decode_<part>_ms`."""
    cols = {"decode_step_ms": "duration_ms", **{f"decode_{c}_ms": f"{c}_ms" for c in COMPONENTS}}
    dec = steps.loc[window_mask(steps, t0, t1, "decode"), list(cols.values())]  # these only
    return {k: float(dec[c].mean()) if len(dec) else math.nan for k, c in cols.items()}


def simulate(cfg: RunConfig, sessions: list[SessionGraph] | None = None,
             progress: bool | None = None) -> Result:
    """Simulate `cfg` (its workload, unless `sessions` is given) and summarise the window."""
    if sessions is None:
        sessions = load_sessions(cfg.workload, cfg.seed)
    sim = Simulation(cfg, sessions)
    out = sim.run(progress=cfg.progress if progress is None else progress)
    extra = {
        "scenario": scenario_label(cfg),
        "deployment": cfg.deployment.name, "concurrency": cfg.workload.replay.concurrency,
        "layout": layout_name(cfg.deployment), "decode_gpus": decode_width(cfg.deployment),
        "prefill_instances": cfg.deployment.prefill.instances,
        "partial": out.partial, "sim_s": out.sim_s, "wall_s": out.wall_s, "events": out.events,
        "kv_bytes_moved": out.kv_bytes_moved, "kv_bytes_cross_rack": out.kv_bytes_cross_rack,
        "window_start_s": out.window_start_s, "window_end_s": out.window_end_s,
        "seed": cfg.seed,
    }
    result = summarize(out.requests, out.steps, out.itl, out.window_start_s, out.window_end_s,
                       out.num_gpus, cfg.pricing, extra,
                       FleetLayout(out.instance_racks, out.rack_gpus, out.decode_itl))
    result.summary.update(decode_breakdown_ms(result.steps, out.window_start_s,
                                              out.window_end_s))
    return result


def simulate_to(cfg: RunConfig, out_dir: Path, plots: bool = True,
                progress: bool | None = None) -> Result:
    """Simulate and write every artefact (tables, summary, plots) into `out_dir`. matplotlib
    is imported only when plots are drawn (0.4 s of a sweep job's or a notebook's start)."""
    result = simulate(cfg, progress=progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        clear_run_files(out_dir)
        (out_dir / SCENARIO_FILE).write_text(cfg.model_dump_json(indent=2))
        write_result(result, out_dir)
        if plots:
            from rackSim.report.plots import plot_run

            plot_run(result, out_dir)
    except KeyboardInterrupt:  # files may be missing or cut short: not a result
        (out_dir / PARTIAL_MARKER).write_text(
            "This run was interrupted while its results were being written: files may be "
            "missing or cut short.\n")
        raise
    return result


def read_job(job_dir: Path) -> dict[str, Any] | None:
    """The `job.json` record of a sweep job directory, or None if it has none (or a bad one)."""
    try:
        return json.loads((job_dir / JOB_RECORD).read_text())
    except (OSError, ValueError):
        return None


def _done(job_dir: Path, overrides: list[str]) -> bool:
    rec = read_job(job_dir)
    return (rec is not None and rec.get("status") == "ok"
            and sorted(rec.get("overrides", [])) == overrides
            and (job_dir / "summary.json").is_file())


def find_done(sweep_dir: Path, overrides: Sequence[str]) -> Path | None:
    """The job directory under `sweep_dir` that already finished these overrides, if any."""
    want = sorted(overrides)
    for rec in sorted(sweep_dir.glob(f"**/{JOB_RECORD}")):
        if _done(rec.parent, want):
            return rec.parent
    return None


def _free_dir(job_dir: Path, sweep_dir: Path, overrides: Sequence[str]) -> Path:
    """`job_dir`, unless it holds another scenario's results (the sweep was changed and re-run
    into the same directory): then a sibling named after the overrides, so nothing is lost."""
    rec = read_job(job_dir)
    if rec is None or sorted(rec.get("overrides", [])) == sorted(overrides):
        return job_dir
    digest = hashlib.sha1("\n".join(sorted(overrides)).encode()).hexdigest()[:8]
    return sweep_dir / f"{job_dir.name}-{digest}"


def run_sweep_job(tree: Mapping[str, Any], job_dir: Path, sweep_dir: Path,
                  overrides: Sequence[str]) -> dict[str, Any]:
    """Run one scenario of a sweep and return its `job.json` record.

    Skips it when `sweep_dir` already holds a finished job with the same overrides; otherwise
    validates and simulates it into `job_dir`. Any error (invalid scenario, exception while
    simulating) is written to `error.json` and recorded as `status: failed`, so one bad
    scenario does not stop the others. Ctrl-C is recorded the same way (`interrupted`) and
    then passed on as KeyboardInterrupt: it stops the sweep, not just this scenario.
    """
    from rackSim.config import load_run_config

    overrides = list(overrides)
    done = find_done(sweep_dir, overrides)
    if done is not None:
        return {**(read_job(done) or {}), "skipped": True}
    job_dir = _free_dir(job_dir, sweep_dir, overrides)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / ERROR_RECORD).unlink(missing_ok=True)
    record: dict[str, Any] = {"overrides": overrides, "status": "running",
                              "host": socket.gethostname(), "pid": os.getpid(),
                              "started_at": time.time()}
    (job_dir / JOB_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    interrupted = False
    try:
        cfg = load_run_config(tree)
        record["layout"] = layout_name(cfg.deployment)
        result = simulate_to(cfg, job_dir, plots=False, progress=False)
        interrupted = bool(result.summary.get("partial"))
        record["status"] = "failed" if interrupted else "ok"
        if interrupted:
            record["error"] = "interrupted: partial results"
    except KeyboardInterrupt:  # outside the simulation loop (which keeps what it simulated)
        interrupted = True
        record.update(status="failed", error="interrupted before its results were complete")
    except Exception as err:  # noqa: BLE001 - a sweep records every failure and goes on
        record.update(status="failed", error=f"{type(err).__name__}: {err}")
        (job_dir / ERROR_RECORD).write_text(json.dumps(
            {"overrides": overrides, "error_type": type(err).__name__, "error": str(err),
             "traceback": traceback.format_exc()}, indent=2) + "\n")
    record["finished_at"] = time.time()
    (job_dir / JOB_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    if interrupted:
        raise KeyboardInterrupt
    return record
