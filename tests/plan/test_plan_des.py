"""A planner run on a small demand: the screen's best candidates are simulated (whole fleets)
through the joblib launcher, the chosen plan meets the SLOs in the simulation, every
confirmed candidate carries its screen-vs-DES error, and a second run resumes (simulates
nothing again). The one-rack stand-in's scenario is checked without simulating."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rackSim.plan.command import run_plan, write_plan
from rackSim.plan.confirm import candidate_config, run_confirmation
from rackSim.report.plan_table import format_plan


@pytest.mark.slow
def test_small_plan_is_confirmed_by_the_simulation(small_inputs, tmp_path):
    plan = small_inputs.plan
    result = run_plan(small_inputs, tmp_path, ["experiment=smoke"])
    conf = result.confirmed
    assert len(conf) == plan.confirm.top_k
    assert (conf["des_status"] == "ok").all(), conf["des_error"].tolist()
    best = result.plans.iloc[0]
    assert bool(best["des_meets_slo"])
    assert best["des_interactivity_tok_s"] >= plan.slo.interactivity_p90_tok_s_user_min
    assert best["des_ttft_p90_ms"] <= plan.slo.ttft_p90_s_max * 1e3
    # the screen is an estimate from bounds: within 50 % of the simulation on throughput and
    # interactivity for these small racks (measured: 5-30 %)
    for col in ("err_throughput_tok_s_gpu", "err_interactivity_tok_s", "err_ttft_p90_ms"):
        assert np.isfinite(conf[col]).all()
    assert (conf["err_throughput_tok_s_gpu"].abs() < 0.5).all()
    assert (conf["err_interactivity_tok_s"].abs() < 0.5).all()
    # each simulation is the candidate's whole fleet at the full demand
    for cid, row in conf.set_index("candidate").iterrows():
        job = next(p.parent for p in (tmp_path / "confirm").glob("*/job.json")
                   if cid in json.loads(p.read_text())["overrides"][-1])
        sim = json.loads((job / "scenario.json").read_text())
        assert sim["deployment"]["racks"] == row["racks"]
        assert sim["deployment"]["fleet_router"]["policy"] == "session_affinity"
        assert sim["workload"]["replay"]["concurrency"] == 40
        assert sim["deployment"]["prefill"]["instances"] == row["prefill_instances"]
        if row["family"] == "colocated":  # no prefill or decode instance beside them
            col = sim["deployment"]["colocated"]
            assert (col["instances"], col["gpus"]) == (row["colocated_instances"],
                                                       row["colocated_gpus"])
            assert sim["deployment"]["decode"]["instances"] == 0
        else:
            assert sim["deployment"]["decode"]["gpus"] == row["decode_gpus"]
    # both families were confirmed: the plan answers "should we disaggregate at all?"
    assert set(conf["family"]) == {"disaggregated", "colocated"}

    page = write_plan(result, small_inputs, tmp_path).read_text()
    assert "whole fleet" in page and "confirmed" in page
    table = pd.read_parquet(tmp_path / "plan.parquet")
    assert table["status"].iloc[0] == "plan 1: confirmed"
    assert table["TTFT P90 ms (DES)"].iloc[0] == pytest.approx(best["des_ttft_p90_ms"])
    # where each simulated TTFT went: its mean by stage, 0 past the prompt when colocated
    stages = table.filter(regex=r"^TTFT mean .* ms \(DES\)$")
    assert stages.shape[1] == 5
    confirmed = table["TTFT P90 ms (DES)"].notna()
    assert (stages[confirmed] >= 0).all().all()
    colocated = confirmed & table["layout per rack"].str.startswith("C").to_numpy()
    assert colocated.any() and (stages[colocated].iloc[:, 2:] == 0).all().all()
    # the terminal shows the simulated numbers of a confirmed plan, not the screen's
    first = format_plan(table).splitlines()[1]
    assert first.startswith("plan 1: confirmed")
    assert f"{best['des_throughput_tok_s_gpu']:,.0f}" in first
    assert f"{best['des_ttft_p90_ms'] / 1e3:.2f}s" in first

    # resume: the same candidates again are skipped, their records untouched
    before = {p: p.read_text() for p in (tmp_path / "confirm").glob("*/job.json")}
    again = run_confirmation(conf["candidate"].tolist(), plan, tmp_path, ["experiment=smoke"])
    assert (again["status"] == "ok").all()
    assert {p: p.read_text() for p in (tmp_path / "confirm").glob("*/job.json")} == before


def test_one_rack_stands_for_a_fleet_at_its_share(small_inputs):
    row = pd.Series({"racks": 3, "layout": "P2xDEP2+DEP4", "family": "disaggregated",
                     "prefill_instances": 2, "prefill_gpus": 2, "decode_instances": 1,
                     "decode_gpus": 4, "colocated_instances": 0, "colocated_gpus": 0,
                     "prefill_dbo": False, "decode_dbo": False, "colocated_dbo": False,
                     "hardware": "gb300_nvl72", "agents_per_rack": 40 / 3})
    one = small_inputs.plan.model_copy(update={"confirm": small_inputs.plan.confirm.model_copy(
        update={"fleet": False})})
    c = candidate_config(row, one, small_inputs.scenario)
    assert c["deployment"]["racks"] == 1 and c["workload"]["replay"]["concurrency"] == 14
    whole = candidate_config(row, small_inputs.plan, small_inputs.scenario)
    assert whole["deployment"]["racks"] == 3 and whole["workload"]["replay"]["concurrency"] == 40
    assert whole["defaults"] == [{"override /hardware": "gb300_nvl72"}]
    assert whole["workload"]["replay"]["window_s"] == small_inputs.plan.confirm.window_s


def test_command_line_keys_a_candidate_sets_stay_the_candidates(tmp_path):
    """The sweep applies its command-line overrides after the candidate files, so a scenario
    override of a key a candidate sets (the prefill width, the clients, the profile) would
    undo the candidate: plans with `deployment.prefill.gpus_per_instance=4` on the command
    line simulated DEP8 prefill candidates at DEP4, and GB200 candidates on the GB300 profile
    given as `perf.profile`. Such keys go into every file (the scenario's value where the
    candidate sets none) and off the command line; the other overrides stay on it. Composed
    as the sweep composes them, each candidate is itself."""
    from plan_support import SMALL, compose_plan, compose_tree

    from rackSim.config import load_run_config
    from rackSim.plan.confirm import confirm_command, held_by_candidates, write_candidates

    profile = "calibration/gb300__deepseek_v4_1_flash.yaml"
    overrides = ["deployment.prefill.gpus_per_instance=4", "workload.replay.concurrency=7",
                 f"perf.profile={profile}", "deployment.decode.max_num_seqs_per_rank=64",
                 "deployment.prefill.dbo.prefill_token_threshold=256"]
    inputs = compose_plan([*[o for o in SMALL if not o.startswith("plan.hardware")],
                           "plan.hardware=[{name: gb300_nvl72, rental_usd_per_gpu_hour: 5, "
                           f"profile: {profile}}}]", *overrides])
    base = {"racks": 1, "hardware": "gb300_nvl72", "agents_per_rack": 40.0,
            "prefill_dbo": False, "decode_dbo": False, "colocated_dbo": False}
    rows = pd.DataFrame([
        {**base, "layout": "P2xDEP2(dbo)+DEP4", "family": "disaggregated",
         "prefill_instances": 2, "prefill_gpus": 2, "decode_instances": 1, "decode_gpus": 4,
         "colocated_instances": 0, "colocated_gpus": 0, "prefill_dbo": True},
        {**base, "layout": "C2xDEP4", "family": "colocated", "prefill_instances": 0,
         "prefill_gpus": 0, "decode_instances": 0, "decode_gpus": 0,
         "colocated_instances": 2, "colocated_gpus": 4}])
    scenario = ["experiment=smoke", *overrides]
    ids = write_candidates(rows, inputs.plan, tmp_path, inputs.scenario, scenario)
    cmd = confirm_command(ids, inputs.plan, tmp_path, scenario)
    assert held_by_candidates(ids, tmp_path, scenario) == overrides[:3]  # what the plan says
    kept = cmd[cmd.index("progress=false") + 1:-1]
    assert kept == ["experiment=smoke", "deployment.decode.max_num_seqs_per_rank=64",
                    "deployment.prefill.dbo.prefill_token_threshold=256"]
    search = f"hydra.searchpath=[file://{(tmp_path / 'candidates').resolve()}]"
    dis, col = (load_run_config(compose_tree([search, *kept, f"+candidate={i}"]))
                for i in ids)
    assert dis.deployment.prefill.gpus_per_instance == 2  # the candidate's, not 4
    assert col.deployment.prefill.gpus_per_instance == 4  # the scenario's: it sets none
    for c in (dis, col):
        assert c.workload.replay.concurrency == 40 and str(c.perf.profile).endswith(profile)
        assert c.deployment.decode.max_num_seqs_per_rank == 64
    assert dis.deployment.prefill.dbo.enabled
    assert dis.deployment.prefill.dbo.prefill_token_threshold == 256
