"""The table of a sweep: one row per scenario, its overridden keys, its status, its metrics.

Built from the `job.json` record (and `summary.json`) each multirun job leaves in its
directory, automatically at the end of a multirun (`SweepTableCallback`, wired in
`scenarios/config.yaml`) and on demand (`racksim-plot table SWEEP_DIR`). Written beside the
jobs as `sweep.parquet` and `sweep.csv`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rackSim.metrics.summary import SUMMARY_KEYS
from rackSim.report.files import FIGURE_FILES, TABLE_FILES
from rackSim.run import JOB_RECORD, read_job

TABLE_PARQUET = "sweep.parquet"
TABLE_CSV = "sweep.csv"
STATUS_COLUMNS = ("status", "error", "layout", "job_dir")


def override_key(override: str) -> str:
    """`+deployment.decode.gpus=8` -> `deployment.decode.gpus`."""
    return override.split("=", 1)[0].lstrip("+~")


def _value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Hydra override strings as {key: value}, values parsed as bool / int / float / str."""
    return {override_key(o): _value(o.split("=", 1)[1]) if "=" in o else None for o in overrides}


def _rows(sweep_dir: Path) -> list[tuple[dict, dict, float]]:
    found: dict[tuple[str, ...], tuple[dict, dict, float]] = {}
    for path in sorted(sweep_dir.glob(f"**/{JOB_RECORD}")):
        rec = read_job(path.parent)
        if rec is None or "overrides" not in rec:
            continue
        summary: dict = {}
        if rec.get("status") == "ok":
            try:
                summary = json.loads((path.parent / "summary.json").read_text())
            except (OSError, ValueError) as err:
                rec = {**rec, "status": "failed", "error": f"unreadable summary.json: {err}"}
        rank = (rec.get("status") == "ok", rec.get("finished_at") or 0.0)
        key = tuple(sorted(rec["overrides"]))
        rec = {**rec, "job_dir": str(path.parent.relative_to(sweep_dir))}
        if key not in found or rank > found[key][2]:
            found[key] = (rec, summary, rank)
    return list(found.values())


def _uniform(col: pd.Series) -> pd.Series:
    """Mixed Python types in one column do not fit Parquet; fall back to strings."""
    kinds = {type(v) for v in col if v is not None and not (isinstance(v, float) and math.isnan(v))}
    if len(kinds) > 1 and not kinds <= {int, float}:
        return col.map(lambda v: None if v is None else str(v))
    return col


def build_table(sweep_dir: Path | str) -> pd.DataFrame:
    """One row per scenario of the sweep in `sweep_dir` (a scenario re-run keeps its latest
    finished record): overridden keys, then status / error / layout / job_dir, then every
    summary metric (headline keys first). Failed scenarios carry their error, metrics empty."""
    sweep_dir = Path(sweep_dir)
    rows = _rows(sweep_dir)
    if not rows:
        raise FileNotFoundError(f"no sweep jobs ({JOB_RECORD}) under {sweep_dir}"
                                + _single_run(sweep_dir))
    keys: list[str] = []
    for rec, _, _ in rows:
        keys += [k for k in parse_overrides(rec["overrides"]) if k not in keys]
    metrics: list[str] = []
    for _, summary, _ in rows:
        metrics += [k for k in summary if k not in metrics]
    head = [k for k in SUMMARY_KEYS if k in metrics]
    metrics = head + sorted(set(metrics) - set(head))
    clash = set(keys) | set(STATUS_COLUMNS)
    records = []
    for rec, summary, _ in rows:
        row: dict[str, Any] = dict.fromkeys(keys)
        row.update(parse_overrides(rec["overrides"]))
        row.update({c: rec.get(c) for c in STATUS_COLUMNS})
        row.update({(f"result.{k}" if k in clash else k): summary.get(k) for k in metrics})
        records.append(row)
    df = pd.DataFrame(records)
    for c in df.columns:
        df[c] = _uniform(df[c])
    return df.sort_values("job_dir", key=_job_order).reset_index(drop=True)


def _single_run(path: Path) -> str:
    """The hint for a single run's directory given where a sweep's is expected, else ''."""
    if (path / TABLE_FILES["summary"]).is_file() and not (path / JOB_RECORD).is_file():
        return ("; it is a single run's directory, whose figures `racksim` draws itself "
                f"({', '.join(FIGURE_FILES.values())}): give a sweep's directory "
                "(`racksim -m ...`)")
    return ""


def _job_order(col: pd.Series) -> pd.Series:
    return col.map(lambda d: (int(d) if d.isdigit() else math.inf, d))


def write_table(sweep_dir: Path | str) -> tuple[Path, Path]:
    """Build the sweep table and write it as `sweep.parquet` and `sweep.csv` in `sweep_dir`."""
    sweep_dir = Path(sweep_dir)
    df = build_table(sweep_dir)
    pq, csv = sweep_dir / TABLE_PARQUET, sweep_dir / TABLE_CSV
    df.to_parquet(pq, index=False)
    df.to_csv(csv, index=False)
    return pq, csv


def read_table(path: Path | str) -> tuple[pd.DataFrame, Path]:
    """A sweep table from its file or its sweep directory; returns (table, sweep_dir)."""
    path = Path(path)
    if path.is_dir():
        for name in (TABLE_PARQUET, TABLE_CSV):
            if (path / name).is_file():
                return read_table(path / name)
        raise FileNotFoundError(
            f"no sweep table ({TABLE_PARQUET} or {TABLE_CSV}) in {path}"
            + (_single_run(path) or f"; build it with `racksim-plot table {path}`"))
    if not path.is_file():
        raise FileNotFoundError(f"no such sweep table or directory: {path}")
    df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    if "job_dir" not in df.columns:
        raise ValueError(f"{path} is not a sweep table (no job_dir column)")
    return df, path.parent


#: (column, header, format) of the terminal table's metrics
_SHOWN = (("throughput_tok_s_gpu", "tok/s/GPU", "{:,.0f}"),
          ("interactivity_tok_s", "tok/s/user", "{:,.1f}"),
          ("ttft_p90_ms", "TTFT P90 ms", "{:,.0f}"),
          ("margin_usd_gpu_h", "margin $/GPU-h", "{:.2f}"))


def format_sweep(df: pd.DataFrame, limit: int = 20) -> str:
    """The sweep table for the terminal: the keys that vary between scenarios (all of them
    when none does), status, layout and the headline metrics, `limit` rows at most."""
    keys = list(df.columns[:list(df.columns).index("status")])
    varied = [k for k in keys if df[k].astype(str).nunique() > 1] or keys
    cols = [*varied, "status", "layout"]
    text = df[cols].astype(object).where(df[cols].notna(), "").astype(str)
    for col, head, fmt in _SHOWN:
        if col in df.columns:
            text[head] = [fmt.format(v) if isinstance(v, int | float) and v == v else ""
                          for v in df[col]]
    shown = text.head(limit).to_string(index=False)
    if len(df) > limit:
        shown += f"\n... {len(df) - limit} more scenarios in the table"
    return shown


EXIT_NOTHING_FINISHED = 1
"""`racksim -m`'s exit code when no scenario of the sweep finished (the table lists why)."""


class SweepTableCallback(Callback):
    """Hydra callback: write the sweep table when a multirun ends; a sweep none of whose
    scenarios finished then exits with EXIT_NOTHING_FINISHED (a sweep with some finished
    ones exits 0: its table holds results)."""

    #: the directory of the sweep under way in this process, for the report of a sweep that
    #: Ctrl-C stops (Hydra then calls no end hook)
    under_way: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        SweepTableCallback.under_way = Path(str(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        df = report_sweep(Path(str(config.hydra.sweep.dir)))
        if df is not None and (df["status"] != "ok").all():
            print("racksim: no scenario of the sweep finished; their errors are in the table's "
                  "error column", file=sys.stderr)
            raise SystemExit(EXIT_NOTHING_FINISHED)


def report_sweep(sweep_dir: Path) -> pd.DataFrame | None:
    """Write the sweep table and print it with its counts; None when no job left a record."""
    try:
        pq, csv = write_table(sweep_dir)
    except FileNotFoundError as err:
        print(f"racksim: no sweep table: {err}")
        return None
    df = pd.read_parquet(pq)
    failed = int((df["status"] != "ok").sum())
    print(format_sweep(df))
    print(f"racksim: sweep table {pq} and {csv.name}: {len(df)} scenarios, {failed} failed")
    return df


def report_interrupted_sweep(sweep_dir: Path) -> None:
    """After Ctrl-C stopped a sweep: the table of the scenarios it reached, and how to go on."""
    report_sweep(sweep_dir)
    print(f"racksim: sweep interrupted; to go on, run the same command with "
          f"hydra.sweep.dir={sweep_dir}: finished scenarios are skipped", file=sys.stderr)
