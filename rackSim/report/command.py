"""`racksim-plot`: the table and the figures of a sweep.

    racksim-plot table SWEEP_DIR            # (re)build SWEEP_DIR/sweep.parquet and sweep.csv
    racksim-plot plots SWEEP_DIR_OR_TABLE   # pareto / economics / decode_breakdown / latency PNGs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rackSim.config.flags import output_dir

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="racksim-plot", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="build the sweep table from a multirun directory")
    t.add_argument("sweep_dir", type=Path,
                   help="a multirun directory (its jobs' summary.json; writes sweep.parquet, "
                        "sweep.csv into it)")
    f = sub.add_parser("plots", help="PNG figures from a sweep table (or its directory)")
    f.add_argument("source", type=Path, help="sweep directory or sweep.parquet / sweep.csv")
    f.add_argument("--out", type=output_dir, default=None,
                   help="where to write the PNGs (default: the sweep directory)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rackSim.report.sweep_table import read_table, write_table

    try:
        if args.command == "table":
            pq, csv = write_table(args.sweep_dir)
            print(f"{pq}\n{csv}")
            return 0
        table, sweep_dir = read_table(args.source)
        from rackSim.report.sweep_plots import check_plottable, plot_sweep

        check_plottable(table, sweep_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"racksim-plot: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for path in plot_sweep(table, sweep_dir, args.out or sweep_dir):
        print(path)
    return 0
