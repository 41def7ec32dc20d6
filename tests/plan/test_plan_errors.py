"""Bad planning questions are refused before anything runs, naming the field; a demand no fleet
within the limits can serve gets the best found and the SLO it misses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
from plan_support import SMALL, compose_plan, compose_tree

from rackSim.config.errors import ProfileInputError
from rackSim.plan.command import run_plan, scenario_overrides, write_plan
from rackSim.plan.confirm import _run_sweep
from rackSim.plan.inputs import PlanError, load_plan_inputs
from rackSim.report.plan_table import format_plan


@pytest.mark.parametrize("override, field, says", [
    ("plan.hardware=[{name: gb300_nvl72, rental_usd_per_gpu_hour: -1}]",
     "plan.hardware[0].rental_usd_per_gpu_hour", "greater than or equal to 0"),
    ("plan.hardware=[{name: gb300_nvl72, capex_usd_per_gpu: -5, years: 4, "
     "power_usd_per_kwh: 0.1}]", "plan.hardware[0].capex_usd_per_gpu",
     "greater than or equal to 0"),
    ("plan.hardware=[{name: gb300_nvl72, capex_usd_per_gpu: 50000}]", "plan.hardware[0]",
     "needs a price"),
    ("plan.hardware=[{name: h100_nvl9000, rental_usd_per_gpu_hour: 2}]",
     "plan.hardware[0].name", "unknown hardware 'h100_nvl9000'"),
    ("plan.hardware=[{name: gb300_nvl72, rental_usd_per_gpu_hour: 5}, "
     "{name: gb300_nvl72, rental_usd_per_gpu_hour: 4}]", "plan.hardware", "listed twice"),
    ("+plan.slo.ttft_p50_s_max=5.0", "plan.slo", "contradicts P50 <= P90"),
    ("+plan.slo.itl_p90_ms_max=2.0", "plan.slo", "give one of them"),
    ("plan.slo.ttft_p90_s_max=-1", "plan.slo.ttft_p90_s_max", "greater than 0"),
    ("+plan.demand.sessions_per_hour=100", "plan.demand", "exactly one of agents"),
    ("plan.limits.max_racks=0", "plan.limits.max_racks", "greater than 0"),
    ("+plan.space.prefill_dbo=[]", "plan.space.prefill_dbo", "at least 1 item"),
    ("+plan.space.decode_dbo=[true,true]", "plan.space", "decode_dbo=[True, True] lists a "
     "value twice"),
    ("+plan.space.colocated_dbo=[maybe]", "plan.space.colocated_dbo[0]", "valid boolean"),
])
def test_bad_plans_name_the_field(override, field, says):
    with pytest.raises(PlanError) as err:
        compose_plan(["plan=agentx_reference", override])
    line = next(x for x in str(err.value).splitlines() if x.strip().startswith(field))
    assert says in line


def test_a_space_with_no_layout_that_fits_a_rack_names_its_fields():
    # every instance lives in one 72-GPU rack: a DEP72 decode leaves no room for a prefill
    with pytest.raises(PlanError) as err:
        compose_plan(["plan=agentx_reference", "plan.space.decode_gpus=[72,128]",
                      "plan.space.prefill_gpus_per_instance=[4,2]",
                      "plan.space.colocated_gpus=[80]"])
    assert str(err.value).splitlines()[1:] == [
        "  plan.space (decode_gpus x decode_instances + prefill_gpus_per_instance): the smallest "
        "disaggregated layout, P1xDEP2+DEP72, takes 74 GPUs; the plan's largest rack holds 72: "
        "pick smaller widths",
        "  plan.space (colocated_gpus): the smallest colocated layout, C1xDEP80, takes 80 GPUs; "
        "the plan's largest rack holds 72: pick smaller widths"]


def test_no_plan_chosen_says_how_to_pick_one():
    with pytest.raises(PlanError, match="plan=agentx_reference"):
        load_plan_inputs(compose_tree([]))


@pytest.mark.parametrize("overrides, says", [
    (["plan=agentx_reference", "plan.hardware=[{name: gb300_nvl72, rental_usd_per_gpu_hour: -1}]"],
     "plan.hardware[0].rental_usd_per_gpu_hour"),
    # fits the rack, but the scenario's rules refuse every layout: after the screen, before
    # anything is simulated or written
    (SMALL + ["plan.space.decode_gpus=[5]", "plan.space.colocated_gpus=[5]"],
     "deployment.decode.gpus=5: 384 routed + 0 redundant experts cannot be spread evenly"),
    # overrides Hydra cannot apply: one line, checked before Hydra runs (it printed its own
    # report and exited 1)
    (["plan=nope"], "racksim-plan: plan=nope: no such option in scenarios/plan/; choose one of "
                    "agentx_reference"),
    (["plan.demand.agents=8000"], "racksim-plan: plan.demand.agents: no plan chosen, so it has "
                                  "no keys; choose one first (plan=<one of agentx_reference>)"),
    (["plan=agentx_reference", "plan.demand.agentz=8000"],
     "racksim-plan: plan.demand.agentz: no such scenario key"),
    # a key of the question its YAML leaves at the default: Hydra wants a '+' for it
    (["plan=agentx_reference", "plan.confirm.rounds=1"],
     "racksim-plan: plan.confirm.rounds: not in the composed YAML, which leaves it at its "
     "default (2); set it with a leading '+': +plan.confirm.rounds=1"),
])
def test_cli_refuses_before_running(tmp_path, overrides, says):
    run = subprocess.run(
        [sys.executable, "-c", "from rackSim.cli import plan; plan()", *overrides,
         f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert says in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "plan.html").exists() and not (tmp_path / "candidates").exists()


@pytest.mark.parametrize("profile, says", [
    ("bad", "perf.profile {bad}: no 'name' field, so this is not a calibration profile"),
    ("calibration/h200_hgx__qwen3_235b_a22b.yaml",
     "profile 'h200_hgx__qwen3_235b_a22b' was fitted for model qwen3_235b_a22b"),
])
def test_a_profile_that_cannot_price_the_plan_is_the_profile_class(tmp_path, profile, says):
    """Both ended in a ProfileInputError traceback from the screen (exit 1). A hardware
    option's own profile is checked with the plan, before the screen, and named by its
    field."""
    bad = tmp_path / "p.yaml"
    bad.write_text("format: x\n")
    run = subprocess.run(
        [sys.executable, "-c", "from rackSim.cli import plan; plan()", *SMALL,
         f"perf.profile={bad if profile == 'bad' else profile}",
         f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, run.stderr  # the calibration profile class
    assert run.stderr.startswith("racksim-plan: perf.profile ") and "Traceback" not in run.stderr
    assert says.format(bad=bad) in run.stderr
    assert not (tmp_path / "run" / "plan.html").exists()
    option = [o for o in SMALL if o.startswith("plan.hardware=")][0]
    with_profile = option.replace("}]", f", profile: {bad if profile == 'bad' else profile}}}]")
    with pytest.raises(ProfileInputError, match=r"^plan.hardware\[0\].profile "):
        load_plan_inputs(compose_tree([*SMALL, with_profile]))


def test_every_layout_refused_names_each_reason_once(tmp_path):
    inputs = compose_plan(SMALL + ["plan.space.decode_gpus=[5]", "plan.space.colocated_gpus=[5,7]"])
    with pytest.raises(PlanError) as err:
        run_plan(inputs, tmp_path)
    lines = str(err.value).splitlines()
    assert lines[0].startswith("no layout of plan.space can run")
    # one line per reason, with how many families it refused: DEP5 and 2 x DEP5 decode (each
    # family's 3 prefill instance counts are one family)
    assert [x.split(":")[0].strip() for x in lines[1:]] == [
        "deployment.decode.gpus=5", "deployment.colocated.gpus=5", "deployment.colocated.gpus=7"]
    assert lines[1].endswith("(2 families, e.g. gb300_nvl72, disaggregated: DEP2 prefill + "
                             "DEP5 decode)")
    assert not list(tmp_path.iterdir())


def test_unservable_demand_gets_the_best_found_and_the_missed_slo(tmp_path):
    inputs = compose_plan(SMALL + ["plan.demand.agents=5000", "plan.limits.max_racks=1",
                                   "plan.confirm.top_k=0"])
    result = run_plan(inputs, tmp_path)
    assert not result.met and len(result.plans) == inputs.plan.plans
    best = result.plans.iloc[0]
    assert not best["feasible"] and "TTFT P90" in best["verdict"]
    # the best found is the one closest to the SLOs
    assert best["headroom_min"] == pytest.approx(result.screened["headroom_min"].max())
    page = write_plan(result, inputs, tmp_path).read_text()
    assert 'id="missed"' in page and "TTFT P90" in page
    table = pd.read_csv(tmp_path / "plan.csv")
    assert table["status"].iloc[0] == "best found: misses"
    assert table["misses"].iloc[0].startswith(best["verdict"][:20])
    # the terminal says the same: the best found, its screened numbers, and what it misses
    lines = format_plan(table).splitlines()
    assert lines[1].startswith("best found: misses")
    assert f"{best['throughput_tok_s_gpu']:,.0f}" in lines[1]
    assert lines[2].split() == ["misses:", *best["verdict"].split()]


def test_budget_limit_is_a_reason(tmp_path):
    inputs = compose_plan(SMALL + ["plan.confirm.top_k=0", "plan.limits.max_usd_per_hour=100"])
    result = run_plan(inputs, tmp_path)
    assert not result.met
    assert "over the $100/h budget" in result.plans.iloc[0]["verdict"]
    assert result.families["why"].str.contains("budget").all()


def test_only_scenario_overrides_reach_the_simulations():
    assert scenario_overrides(["experiment=smoke", "plan=agentx_reference",
                               "plan.demand.agents=4", "hardware=gb200_nvl72",
                               "hydra.run.dir=x", "workload.num_sessions=8"]) == \
        ["experiment=smoke", "workload.num_sessions=8"]


def test_simulation_verdicts_name_the_missed_slo(small_inputs):
    from rackSim.plan.command import des_verdict

    row = pd.Series({"des_status": "ok", "des_error": None, "des_interactivity_tok_s": 140.0,
                     "des_ttft_p90_ms": 2500.0, "des_ttft_p50_ms": 100.0})
    assert des_verdict(row, small_inputs) == ("interactivity 140 < 150 tok/s/user; "
                                              "TTFT P90 2.5 s > 2 s")
    assert des_verdict(row.copy().replace({140.0: 151.0, 2500.0: 1999.0}), small_inputs) == ""
    failed = row.copy()
    failed["des_status"], failed["des_error"] = "failed", "ValueError: boom"
    assert des_verdict(failed, small_inputs) == "simulation failed: ValueError: boom"
    # with the simulation's stages, a missed TTFT says where its mean went (stages of a
    # tenth of it or more, largest first)
    staged = row.copy()
    for stage, ms in (("prefill_queue", 900.0), ("prefill", 410.0), ("kv_transfer", 2.0),
                      ("decode_admission", 220.0), ("first_step", 20.0)):
        staged[f"des_ttft_{stage}_ms"] = ms
    assert des_verdict(staged, small_inputs) == (
        "interactivity 140 < 150 tok/s/user; TTFT P90 2.5 s > 2 s "
        "(mean 1.6 s: prefill wait 0.9, prefill 0.41, decode wait 0.22 s)")


def test_ctrl_c_lets_the_confirmation_sweep_keep_what_it_ran(tmp_path):
    """Ctrl-C while the confirmation sweep runs (in a process group of its own, which a
    terminal's Ctrl-C does not reach): the sweep gets the signal from the plan and is let end
    on its own (its handler here writes a file, as the real one writes its table) before the
    interrupt goes on; it is not killed."""
    kept, ready = tmp_path / "kept", tmp_path / "ready"
    sweep = ("import pathlib, signal, sys, time\n"
             "def stop(*_):\n"
             f"    pathlib.Path({str(kept)!r}).write_text('table'); sys.exit(130)\n"
             "signal.signal(signal.SIGINT, stop)\n"
             f"pathlib.Path({str(ready)!r}).touch()\n"
             "time.sleep(60)\n")

    def ctrl_c_once_the_sweep_listens() -> None:
        """Ctrl-C once the sweep has its handler (a slow machine may take a while to start
        it; without one it dies of the signal and keeps nothing)."""
        for _ in range(6000):
            if ready.exists():
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    # as in a terminal: a shell that starts the tests in the background without job control
    # leaves SIGINT ignored, and the plan would never see the Ctrl-C
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=ctrl_c_once_the_sweep_listens, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            _run_sweep([sys.executable, "-c", sweep])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert kept.read_text() == "table"


def test_ctrl_c_during_the_plan_is_one_line_and_130(tmp_path):
    code = ("import rackSim.plan.command as c\n"
            "def interrupted(*a, **k): raise KeyboardInterrupt\n"
            "c.run_plan = interrupted\n"
            "from rackSim.cli import plan; plan()")
    run = subprocess.run([sys.executable, "-c", code, "plan=agentx_reference",
                          f"hydra.run.dir={tmp_path}"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 130, run.stderr
    assert run.stderr.strip() == (
        f"racksim-plan: interrupted; no plan written. To go on, run the same command with "
        f"hydra.run.dir={tmp_path}: candidates already simulated are not simulated again")
    assert not (tmp_path / "plan.html").exists()
