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

