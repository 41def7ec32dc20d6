"""Console entry points. Each parses its arguments and hands over to a package; no logic here.

racksim            - simulate a Hydra scenario (scenarios/): `racksim deployment.decode.gpus=16`
racksim-calibrate  - fit calibration profiles (rackSim.calibrate)
racksim-validate   - drive real vLLM servers, recalibrate, compare (rackSim.validate)
racksim-workload   - describe a workload (rackSim.workload)
racksim-plot       - figures from a sweep table (rackSim.report)
racksim-fidelity   - published vs predicted, leave-one-out, effects (rackSim.calibrate.fidelity)
racksim-plan       - the cheapest fleets for a demand and SLOs (rackSim.plan)
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rackSim.config.scenarios import SCENARIOS_DIR

EXIT_INTERRUPTED = 130


@hydra.main(config_path=str(SCENARIOS_DIR), config_name="config", version_base=None)
def _run(tree: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rackSim.config import load_run_config
    from rackSim.config.errors import InputError
    from rackSim.report.table import format_summary
    from rackSim.run import run_sweep_job, simulate_to

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    if hc.mode == RunMode.MULTIRUN:
        rec = run_sweep_job(tree, out, Path(hc.sweep.dir), list(hc.overrides.task))
        state = "skipped (already done)" if rec.get("skipped") else rec["status"]
        print(f"racksim: job {hc.job.num} {' '.join(hc.overrides.task)}: {state}"
              + (f": {rec['error']}" if rec.get("error") else ""), file=sys.stderr)
        return None
    try:
        cfg = load_run_config(tree)
        result = simulate_to(cfg, out, plots=cfg.plots)
    except InputError as err:
        print(f"racksim: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    print(format_summary(result.summary, title=f"{result.summary['scenario']}  ->  {out}"))
    if result.summary.get("partial"):
        print("racksim: interrupted; results written and marked PARTIAL", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    return result.summary["throughput_tok_s_gpu"]


def _check_command_line(command: str) -> None:
    """A Hydra command's overrides, checked before Hydra runs: a bad one ends in one line
    and its class's exit code (`check_overrides`)."""
    from rackSim.config.errors import ScenarioError
    from rackSim.config.scenarios import check_overrides

    try:
        check_overrides(sys.argv[1:])
    except ScenarioError as err:
        print(f"{command}: {err}", file=sys.stderr)
        sys.exit(err.exit_code)


def run() -> None:
    try:
        _check_command_line("racksim")
        _run()
    except KeyboardInterrupt:  # outside a simulation loop, which keeps what it simulated
        from rackSim.report.sweep_table import SweepTableCallback, report_interrupted_sweep

        if SweepTableCallback.under_way is not None:
            report_interrupted_sweep(SweepTableCallback.under_way)
        else:
            print("racksim: interrupted before a result was complete; nothing written is a "
                  "result (a directory holding part of one is marked PARTIAL)", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


@hydra.main(config_path=str(SCENARIOS_DIR), config_name="config", version_base=None)
def _plan(tree: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from rackSim.config.errors import InputError
    from rackSim.plan.command import run_plan, shown_rows, write_plan
    from rackSim.plan.confirm import ConfirmError
    from rackSim.plan.inputs import load_plan_inputs
    from rackSim.report.plan_table import format_plan, plan_table

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    try:
        inputs = load_plan_inputs(tree)
        result = run_plan(inputs, out, list(hc.overrides.task))
    except KeyboardInterrupt:
        print(f"racksim-plan: interrupted; no plan written. To go on, run the same command "
              f"with hydra.run.dir={out}: candidates already simulated are not simulated "
              "again", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except InputError as err:  # the question (PlanError) or a file it reads (a profile)
        print(f"racksim-plan: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except ConfirmError as err:
        print(f"racksim-plan: {err}", file=sys.stderr)
        sys.exit(1)
    page = write_plan(result, inputs, out)
    print(format_plan(plan_table(shown_rows(result))))
    print(f"racksim-plan: {page}", file=sys.stderr)


def plan() -> None:
    try:
        _check_command_line("racksim-plan")
        _plan()
    except KeyboardInterrupt:
        print("racksim-plan: interrupted; no plan written", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


def _exit_with(module: str, command: str) -> None:
    """Run `module.main()` and exit with its code; Ctrl-C that the command does not handle
    itself (long ones keep what they did and say so) ends in one line and 130."""
    import importlib

    try:
        code = importlib.import_module(module).main()
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    sys.exit(code)


def calibrate() -> None:
    _exit_with("rackSim.calibrate.command", "racksim-calibrate")


def validate() -> None:
    _exit_with("rackSim.validate.command", "racksim-validate")


def workload() -> None:
    _exit_with("rackSim.workload.command", "racksim-workload")


def plot() -> None:
    _exit_with("rackSim.report.command", "racksim-plot")


def fidelity() -> None:
    _exit_with("rackSim.calibrate.fidelity", "racksim-fidelity")
