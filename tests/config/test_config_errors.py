"""Every way a scenario can be wrong fails before simulating, naming the field and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rackSim.config import ConfigError, compose_scenario
from rackSim.config.errors import ScenarioError


@pytest.mark.parametrize("overrides, expect", [
    # experts that cannot be spread over the EP width
    (["deployment.decode.gpus=5"], ["deployment.decode.gpus=5", "384", "divides"]),
    (["deployment.eplb.redundant_experts=1"], ["385", "EP ranks"]),
    # the target's experts spread, the draft's do not: the widths that spread both
    (["deployment.decode.gpus=48"],
     ["deployment.decode.gpus=48", "draft model's 128", "divides both 384 and 128",
      "(2, 4, 8, 16, 32, 64, 128)"]),
    # more GPUs than the racks hold
    (["deployment.prefill.instances=40"], ["84 GPUs", "racks=1", "72"]),
    # weights plus one full-context request do not fit in HBM
    (["hardware=gb200_nvl72", "deployment.prefill.gpus_per_instance=1"],
     ["deployment.prefill", "KV per GPU", "full-context"]),
    # negative or zero rates and sizes
    (["pricing.output_usd_per_mtok=-1"], ["pricing.output_usd_per_mtok", "greater than or equal"]),
    (["hardware.hbm_bw_bytes_s=0"], ["hardware.hbm_bw_bytes_s", "greater than 0"]),
    (["workload.replay.concurrency=0"], ["workload.replay.concurrency"]),
    (["workload.replay.window_s=-5"], ["workload.replay.window_s"]),
    # not finite (an infinite window ran into the progress bar's arithmetic) and a negative
    # seed (numpy's traceback)
    (["workload.replay.window_s=inf"], ["workload.replay.window_s", "finite number"]),
    (["pricing.gpu_hour_usd=nan"], ["pricing.gpu_hour_usd", "finite number"]),
    (["seed=-1"], ["seed", "greater than or equal to 0"]),
    (["++workload.agentx.output_tokens={kind:lognormal,median:nan,sigma:1}"],
     ["workload.agentx.output_tokens.median", "finite number"]),
    (["++workload.agentx.output_tokens={kind:lognormal,median:200,sigma:1,max:nan}"],
     ["workload.agentx.output_tokens", "max=nan", "leave it out for no cap"]),
    (["deployment.kv_transfer.efficiency=1.5"], ["deployment.kv_transfer.efficiency"]),
    (["deployment.decode.speculative.accepted_tokens_per_step=5"], ["exceeds"]),
    # speculation with a model that has no draft layers would be free
    (["model=meta_llama_3_1_70b", "perf.weight_dtype=fp8"],
     ["deployment.decode.speculative.num_draft_tokens=3", "no draft", "num_draft_tokens=0"]),
    # unknown keys (added with + so Hydra lets them through to validation)
    (["+deployment.decode.turbo=true"], ["deployment.decode.turbo", "unknown key"]),
    (["+surprise=1"], ["surprise", "unknown key"]),
    # a missing file
    (["workload.source=jsonl", "+workload.path=/nonexistent/sessions.jsonl"],
     ["workload", "no such file", "/nonexistent/sessions.jsonl"]),
    (["perf.model=calibrated", "perf.profile=/nope.yaml"], ["perf", "no such file"]),
    (["perf.model=measured", "perf.profile=null"], ["perf", "model 'measured' needs 'profile'"]),
    (["workload=mooncake_conversation", "workload.path=traces/missing.jsonl"],
     ["workload", "no such file", "traces/missing.jsonl"]),
    (["++workload.agentx.context_window=200000"], ["workload.agentx.context_window", "lower it"]),
    (["+workload.agentx.turns.kind=normal"], ["workload.agentx.turns"]),
    # wrong type / enum
    (["deployment.router=random"], ["deployment.router"]),
    (["perf.weight_dtype=fp2"], ["perf.weight_dtype", "fp2"]),
])
def test_bad_scenarios_name_the_field(overrides, expect):
    with pytest.raises(ConfigError) as err:
        compose_scenario(["experiment=smoke", *overrides])
    msg = str(err.value)
    for part in expect:
        assert part in msg, msg


def test_a_rule_across_fields_is_printed_as_its_own_message():
    """A cross-field rule has no location of its own: its message leads its line."""
    with pytest.raises(ConfigError) as err:
        compose_scenario(["experiment=smoke", "deployment.decode.gpus=5"])
    assert str(err.value).splitlines()[1].startswith("  deployment.decode.gpus=5: ")


def test_unknown_override_key_is_named_with_the_fix():
    """From Python (notebooks, racksim-fidelity --override) as on the command line."""
    with pytest.raises(ScenarioError, match=r"^deployment.decode.turbo: no such scenario key; "
                                            r"check its spelling"):
        compose_scenario(["deployment.decode.turbo=true"])


def test_missing_group_option_lists_the_options():
    with pytest.raises(ScenarioError, match=r"^hardware=tpu_v9: no such option in "
                                            r"scenarios/hardware/; choose one of .*gb300"):
        compose_scenario(["hardware=tpu_v9"])


def test_reference_scenario_is_valid():
    cfg = compose_scenario([])
    assert cfg.deployment.num_gpus == 48
    assert cfg.deployment.decode.gpus == 32 and cfg.deployment.prefill.gpus_per_instance == 2


def _racksim(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from rackSim.cli import run; run()", f"hydra.run.dir={tmp_path}",
         "progress=false", *overrides], capture_output=True, text=True, timeout=120)


def test_cli_bad_input_exits_nonzero_and_writes_no_result(tmp_path):
    p = _racksim(tmp_path, "experiment=smoke", "deployment.decode.gpus=5")
    assert p.returncode == 2
    assert "deployment.decode.gpus=5" in p.stderr
    assert not (tmp_path / "summary.json").exists()


def test_cli_unknown_key_exits_nonzero(tmp_path):
    p = _racksim(tmp_path, "experiment=smoke", "deployment.decode.turbo=true")
    assert p.returncode != 0
    assert "turbo" in p.stderr
    assert not (tmp_path / "summary.json").exists()
