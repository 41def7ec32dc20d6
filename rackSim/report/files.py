"""Write a Result into a run directory: summary JSON, Parquet tables, CSV time series."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from rackSim.metrics.summary import Result

PARTIAL_MARKER = "PARTIAL"


def _jsonable(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


def write_result(result: Result, out: Path) -> dict[str, Path]:
    """Write every artefact of `result` into `out`; returns name -> path.

    A partial result (an interrupted run) is written too, but its summary says
    `"partial": true` and a PARTIAL marker file sits beside it.
    """
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "summary": out / "summary.json",
        "requests": out / "requests.parquet",
        "steps": out / "steps.parquet",
        "timeseries": out / "throughput_timeseries.csv",
        "itl_histogram": out / "itl_histogram.csv",
    }
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
            paths[name] = out / f"{name}.csv"
            table.to_csv(paths[name], index=False)
    marker = out / PARTIAL_MARKER
    if result.summary.get("partial"):
        marker.write_text("This run was interrupted: its results cover only part of the "
                          "measurement window.\n")
    elif marker.exists():
        marker.unlink()
    return paths
