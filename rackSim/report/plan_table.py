"""The plan as tables people read and pandas loads.

`plan_table` turns the planner's candidate rows (screen predictions, simulation results where
confirmed) into the plan table: one row per plan or confirmed candidate, human column names,
units in the names. `write_plan_tables` writes it and the other tables as Parquet and CSV.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rackSim.metrics.summary import TTFT_STAGES

#: planner column -> plan-table column (units in the name)
COLUMNS = {
    "status": "status",
    "confirm_round": "round",
    "hardware": "hardware",
    "racks": "racks",
    "gpus": "GPUs used",
    "gpus_bought": "GPUs bought",
    "layout": "layout per rack",
    "agents_per_rack": "agents per rack",
    "throughput_tok_s_gpu": "tok/s/GPU (screen)",
    "des_throughput_tok_s_gpu": "tok/s/GPU (DES)",
    "interactivity_tok_s": "P90 tok/s/user (screen)",
    "des_interactivity_tok_s": "P90 tok/s/user (DES)",
    "interactivity_edge_tok_s": "P90 tok/s/user knife-edge (screen)",
    "ttft_p90_ms": "TTFT P90 ms (screen)",
    "des_ttft_p90_ms": "TTFT P90 ms (DES)",
    # where the simulated TTFT went: its mean by stage (the screen has no split)
    **{f"des_ttft_{stage}_ms": f"TTFT mean {label} ms (DES)" for stage, *_, label in TTFT_STAGES},
    "revenue_usd_gpu_h": "revenue $/GPU-h",
    "cost_usd_gpu_h": "cost $/GPU-h",
    "fleet_usd_h": "fleet $/h",
    "cost_usd_per_mtok": "cost $/Mtok",
    "headroom_interactivity": "headroom interactivity",
    "headroom_ttft_p90": "headroom TTFT P90",
    "headroom_ttft_p50": "headroom TTFT P50",
    "err_throughput_tok_s_gpu": "screen err tok/s/GPU",
    "err_interactivity_tok_s": "screen err tok/s/user",
    "err_ttft_p90_ms": "screen err TTFT P90",
    "verdict": "misses",
    "des_verdict": "misses in DES",
}


def plan_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The readable plan table of planner rows (columns absent from `rows` are left out).
    Headroom and screen errors are fractions (0.12 = 12 %)."""
    keep = [c for c in COLUMNS if c in rows.columns]
    return rows[keep].rename(columns=COLUMNS).reset_index(drop=True)


def write_plan_tables(out_dir: Path, tables: dict[str, pd.DataFrame]) -> list[Path]:
    """Write each table as `<name>.parquet` and `<name>.csv` in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, df in tables.items():
        for path, write in ((out_dir / f"{name}.parquet", df.to_parquet),
                            (out_dir / f"{name}.csv", df.to_csv)):
            write(path, index=False)
            paths.append(path)
    return paths


def _pick(row: pd.Series, des: str, screen: str) -> float:
    """The simulated value where the row was confirmed, else the screen's."""
    v = row.get(des)
    return float(v) if v is not None and v == v else float(row.get(screen, float("nan")))


def format_plan(table: pd.DataFrame) -> str:
    """The plan table (`plan_table`) for the terminal: one line per row, simulated numbers
    where the row was confirmed (screen otherwise), and what a row misses."""
    w = max([22, *(len(str(x)) for x in table["layout per rack"])])  # layouts' column
    head = (f"{'status':<22} {'hardware':<13} {'racks':>5}  {'layout per rack':<{w}} "
            f"{'tok/s/GPU':>10} {'tok/s/user':>10} {'TTFT P90':>9} {'$/Mtok':>8}")
    lines = [head]
    for _, r in table.iterrows():
        ttft = _pick(r, "TTFT P90 ms (DES)", "TTFT P90 ms (screen)") / 1e3
        lines.append(
            f"{r['status']:<22} {r['hardware']:<13} {r['racks']:>5}  "
            f"{r['layout per rack']:<{w}} "
            f"{_pick(r, 'tok/s/GPU (DES)', 'tok/s/GPU (screen)'):>10,.0f} "
            f"{_pick(r, 'P90 tok/s/user (DES)', 'P90 tok/s/user (screen)'):>10,.1f} "
            f"{ttft:>8.2f}s {r['cost $/Mtok']:>8.4f}")
        missed = [str(r.get(c)) for c in ("misses in DES", "misses")
                  if isinstance(r.get(c), str) and r.get(c)]
        if missed:
            lines.append(f"{'':<22} misses: {missed[0]}")
        edge = r.get("P90 tok/s/user knife-edge (screen)")
        if edge is not None and edge == edge:
            lines.append(f"{'':<22} knife-edge: the screen's P90 "
                         f"{r['P90 tok/s/user (screen)']:,.1f} tok/s/user, {edge:,.1f} on the "
                         "other kind of step (idle or carrying prefill)")
    return "\n".join(lines)
