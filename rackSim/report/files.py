"""Write a Result into a run directory: summary JSON, Parquet tables, CSV time series."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from rackSim.metrics.summary import Result

PARTIAL_MARKER = "PARTIAL"
SCENARIO_FILE = "scenario.json"
TABLE_FILES = {"summary": "summary.json", "requests": "requests.parquet",
               "steps": "steps.parquet", "timeseries": "throughput_timeseries.csv",
               "itl_histogram": "itl_histogram.csv", "racks": "racks.csv",
               "instances": "instances.csv"}
FIGURE_FILES = {"throughput": "throughput.png", "latency": "latency.png",
                "decode_breakdown": "decode_breakdown.png"}


def _jsonable(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


def write_result(result: Result, out: Path) -> dict[str, Path]:
    """Write every artefact of `result` into `out`; returns name -> path.

    A partial result (an interrupted run) is written too, but its summary says
    `"partial": true` and a PARTIAL marker file sits beside it. An earlier run's files
    (a stale marker among them) are the caller's to clear first: `clear_run_files`.
    """
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / TABLE_FILES[k]
             for k in ("summary", "requests", "steps", "timeseries", "itl_histogram")}
    summary = {k: _jsonable(v) for k, v in result.summary.items()}
    paths["summary"].write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    result.requests.to_parquet(paths["requests"], index=False)
    result.steps.to_parquet(paths["steps"], index=False)
    result.timeseries.to_csv(paths["timeseries"], index=False)
    edges = result.itl.edges()
    nz = result.itl.weights > 0
    pd.DataFrame({"lo_ms": edges[:-1][nz], "hi_ms": edges[1:][nz],
                  "tokens": result.itl.weights[nz]}).to_csv(paths["itl_histogram"], index=False)
    for name in ("racks", "instances"):  # simulated fleets: per rack and per instance
        table = getattr(result, name)
        if len(table):
            paths[name] = out / TABLE_FILES[name]
            table.to_csv(paths[name], index=False)
    if result.summary.get("partial"):
        (out / PARTIAL_MARKER).write_text("This run was interrupted: its results cover only "
                                          "part of the measurement window.\n")
    return paths


def clear_run_files(out: Path) -> None:
    """Remove what an earlier run wrote into `out` (its tables, figures, scenario and marker),
    so that a run into the same directory leaves none of them beside its own: a run with
    `plots=false` would otherwise sit beside the figures of the last one. Other files stay."""
    for name in (*TABLE_FILES.values(), *FIGURE_FILES.values(), SCENARIO_FILE, PARTIAL_MARKER):
        (out / name).unlink(missing_ok=True)
