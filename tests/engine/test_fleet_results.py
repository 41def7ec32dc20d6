"""A fleet's results on disk: per-rack and per-instance tables, the fleet summary, its label."""

from __future__ import annotations

import pandas as pd
import pytest

from rackSim.config import compose_scenario, with_changes
from rackSim.run import layout_name, scenario_label, simulate_to


def test_fleet_run_writes_rack_and_instance_tables(tmp_path):
    base = compose_scenario(["experiment=smoke", "deployment=fleet_two_decode",
                             "deployment.racks=2", "progress=false"])
    cfg = with_changes(base, workload={"replay": {"concurrency": 24, "window_s": 20.0}})
    result = simulate_to(cfg, tmp_path, plots=False)
    racks = pd.read_csv(tmp_path / "racks.csv")
    inst = pd.read_csv(tmp_path / "instances.csv")
    s = result.summary
    assert s["racks"] == 2 and s["num_gpus"] == 2 * (2 * 2 + 2 * 4)
    assert s["layout"] == "2x(P2xDEP2+2xDEP4)"
    assert list(racks["rack"]) == [0, 1] and list(racks["gpus"]) == [12, 12]
    # the racks' tokens add up to the fleet's (each over its own GPUs)
    assert (racks["throughput_tok_s_gpu"] * racks["gpus"]).sum() == pytest.approx(
        s["throughput_tok_s_gpu"] * s["num_gpus"], rel=1e-9)
    assert set(inst["instance"]) == {"prefill-0", "prefill-1", "prefill-2", "prefill-3",
                                     "decode-0", "decode-1", "decode-2", "decode-3"}
    assert inst.groupby("rack")["instance"].count().tolist() == [4, 4]
    dec = inst[inst["role"] == "decode"]
    assert (dec["interactivity_tok_s"] > 0).all() and inst["busy_share"].between(0, 1.01).all()
    # the decode breakdown of the summary averages every decode instance's steps
    assert s["decode_step_ms"] > 0
    assert s["kv_bytes_cross_rack"] == 0.0  # decode slots to spare: KV never left its rack


@pytest.mark.parametrize("overrides, label", [
    ([], "P8xDEP2+DEP32"),
    (["deployment=fleet_mixed"], "10x(P8xDEP2+DEP32) + 4x(P8xDEP2+2xDEP16)"),
    (["deployment=fleet_split_pd"], "2x(P36xDEP2) + 2x(2xDEP32)"),
    (["deployment=fleet_full_rack", "deployment.racks=14"], "14x(P12xDEP2+3xDEP16)"),
    (["deployment.prefill.dbo.enabled=true"], "P8xDEP2(dbo)+DEP32"),  # dual-batch overlap
])
def test_layout_labels_name_the_rack_groups(overrides, label):
    assert layout_name(compose_scenario(overrides).deployment) == label


@pytest.mark.parametrize("overrides, label", [
    ([], "P8xDEP2+DEP32 (agentx_p8_dep32) | DeepSeek-V4.1-Flash | GB300-NVL72"),
    # an override changes the layout simulated, not the deployment it started from
    (["deployment.decode.gpus=16", "hardware=gb200_nvl72"],
     "P8xDEP2+DEP16 (agentx_p8_dep32) | DeepSeek-V4.1-Flash | GB200-NVL72"),
    (["experiment=smoke"], "P2xDEP2+DEP4 (smoke) | DeepSeek-V4.1-Flash | GB300-NVL72"),
    (["deployment.name=P8xDEP2+DEP32"], "P8xDEP2+DEP32 | DeepSeek-V4.1-Flash | GB300-NVL72"),
])
def test_the_scenario_label_names_the_layout_simulated(overrides, label):
    assert scenario_label(compose_scenario(overrides)) == label
