"""One call from a validated scenario to a Result: build, simulate, summarise, write."""

from __future__ import annotations

from pathlib import Path

from rackSim.config.specs import RunConfig
from rackSim.engine.simulation import Simulation
from rackSim.metrics.summary import Result, summarize
from rackSim.report.files import write_result
from rackSim.report.plots import plot_run
from rackSim.workload.graph import SessionGraph
from rackSim.workload.sources import load_sessions


def simulate(cfg: RunConfig, sessions: list[SessionGraph] | None = None,
             progress: bool | None = None) -> Result:
    """Simulate `cfg` (its workload, unless `sessions` is given) and summarise the window."""
    if sessions is None:
        sessions = load_sessions(cfg.workload, cfg.seed)
    sim = Simulation(cfg, sessions)
    out = sim.run(progress=cfg.progress if progress is None else progress)
    extra = {
        "scenario": f"{cfg.deployment.name} | {cfg.model.name} | {cfg.hardware.name}",
        "deployment": cfg.deployment.name, "concurrency": cfg.workload.replay.concurrency,
        "partial": out.partial, "sim_s": out.sim_s, "wall_s": out.wall_s, "events": out.events,
        "kv_bytes_moved": out.kv_bytes_moved, "window_start_s": out.window_start_s,
        "seed": cfg.seed,
    }
    return summarize(out.requests, out.steps, out.itl, out.window_start_s, out.window_end_s,
                     out.num_gpus, cfg.pricing, extra)


def simulate_to(cfg: RunConfig, out_dir: Path, plots: bool = True) -> Result:
    """Simulate and write every artefact (tables, summary, plots) into `out_dir`."""
    result = simulate(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scenario.json").write_text(cfg.model_dump_json(indent=2))
    write_result(result, out_dir)
    if plots:
        plot_run(result, out_dir)
    return result
