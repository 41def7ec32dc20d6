"""A planner run on a small demand: the screen's best candidates are simulated through the
joblib launcher, the chosen plan meets the SLOs in the simulation, every confirmed candidate
carries its screen-vs-DES error, and a second run resumes (simulates nothing again)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rackSim.plan.command import run_plan, write_plan
from rackSim.plan.confirm import run_confirmation


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
    # the simulated rack is one rack at agents / racks clients
    for cid, row in conf.set_index("candidate").iterrows():
        job = next(p.parent for p in (tmp_path / "confirm").glob("*/job.json")
                   if cid in json.loads(p.read_text())["overrides"][-1])
        sim = json.loads((job / "scenario.json").read_text())
        assert sim["deployment"]["racks"] == 1
        assert sim["workload"]["replay"]["concurrency"] == -(-40 // row["racks"])
        assert sim["deployment"]["prefill"]["instances"] == row["prefill_instances"]
        assert sim["deployment"]["decode"]["gpus"] == row["decode_gpus"]

    page = write_plan(result, small_inputs, tmp_path).read_text()
    assert "ONE rack" in page and "confirmed" in page
    table = pd.read_parquet(tmp_path / "plan.parquet")
    assert table["status"].iloc[0] == "plan 1: confirmed"
    assert table["TTFT P90 ms (DES)"].iloc[0] == pytest.approx(best["des_ttft_p90_ms"])

    # resume: the same candidates again are skipped, their records untouched
    before = {p: p.read_text() for p in (tmp_path / "confirm").glob("*/job.json")}
    again = run_confirmation(conf["candidate"].tolist(), plan, tmp_path, ["experiment=smoke"])
    assert (again["status"] == "ok").all()
    assert {p: p.read_text() for p in (tmp_path / "confirm").glob("*/job.json")} == before
