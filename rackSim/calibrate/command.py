"""`racksim-calibrate`: fit a calibration profile and print the fit table, or explain a step.

Subcommands (each its own module with a `main(argv)`): `racksim-calibrate headline` (what the
published headline implies, rackSim.calibrate.headline), `racksim-calibrate model CONFIG` (a
model spec from a config.json, rackSim.calibrate.model_spec), `racksim-calibrate profile --model M
--hardware H` (a profile fitted to that GPU's kernel tables, rackSim.calibrate.table_profile),
`racksim-calibrate peer` (generated models' step times beside aiconfigurator-core's estimates,
rackSim.calibrate.peer_models).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rackSim.calibrate.scenario import DEFAULT_PROFILE
from rackSim.config.errors import InputError
from rackSim.config.flags import output_file, positive_int, whole_numbers_above
from rackSim.config.scenarios import scenario_options
from rackSim.perf.profile import Profile


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="racksim-calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=output_file, default=DEFAULT_PROFILE,
                    help="profile to write (default: %(default)s)")
    ap.add_argument("--no-aic", action="store_true",
                    help="skip the aiconfigurator-core kernel-table fit")
    ap.add_argument("--explain", action="store_true",
                    help="print decode step breakdowns for DEP4..64 instead of fitting")
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE,
                    help="profile used by --explain (default: %(default)s)")
    ap.add_argument("--requests-per-rank", type=positive_int, default=64,
                    help="decode requests per rank (--explain)")
    ap.add_argument("--context", type=positive_int, default=131072,
                    help="context tokens per request (--explain)")
    ap.add_argument("--widths", type=whole_numbers_above(0), default=None,
                    help="DEP widths, comma-separated (--explain; default: those of "
                         "4,8,16,32,64 one NVLink domain of the hardware holds)")
    ap.add_argument("--hardware", choices=scenario_options("hardware"), default=None,
                    metavar="HARDWARE",
                    help="a scenarios/hardware/ option (--explain; default: the GPU the "
                         "profile was fitted for)")
    ap.add_argument("--dbo", action="store_true",
                    help="decode steps with dual-batch overlap (--explain; "
                         "deployment.decode.dbo.enabled; docs/perf.md)")
    return ap


#: subcommand -> module whose `main(argv)` handles it
SUBCOMMANDS = {
    "headline": "rackSim.calibrate.headline",
    "workload": "rackSim.calibrate.headline_fit",
    "prefill": "rackSim.calibrate.prefill",
    "model": "rackSim.calibrate.model_spec",
    "profile": "rackSim.calibrate.table_profile",
    "peer": "rackSim.calibrate.peer_models",
}


def main(argv: list[str] | None = None) -> int:
    """Entry point: a subcommand's, or the fit and `--explain`; bad input of any class ends
    in one line and that class's exit code."""
    argv = sys.argv[1:] if argv is None else argv
    sub = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    try:
        if sub is not None:
            import importlib

            return importlib.import_module(SUBCOMMANDS[sub]).main(argv[1:])
        return _fit_or_explain(argv)
    except InputError as err:
        print(f"racksim-calibrate{' ' + sub if sub else ''}: {err}", file=sys.stderr)
        return err.exit_code


def _fit_or_explain(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.explain:
        from rackSim.calibrate.explain import explain

        print(explain(args.profile, args.widths, args.requests_per_rank, args.context,
                      args.hardware, args.dbo))
        return 0
    from rackSim.calibrate import aic
    from rackSim.calibrate.fit import AIC_MISSING, calibrate, format_table, write

    use_aic = not args.no_aic
    if use_aic and aic.aic_root() is None:
        print(AIC_MISSING, file=sys.stderr)
        use_aic = False
    previous = Profile.load(args.out, "--out") if args.out.is_file() else None
    profile = calibrate(previous, use_aic, lambda s: print(s, file=sys.stderr))
    write(profile, args.out)
    print(format_table(profile.residuals))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
