"""Scenarios built for a profile: the model and GPU it was fitted for, the precision its model
is served in, and an instance priced beside the narrowest other instance that fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from rackSim.calibrate.scenario import (
    CALIBRATION,
    DEFAULT_PROFILE,
    instance_point,
    model_adjustments,
    operating_point,
    profile_options,
)
from rackSim.config.errors import ProfileInputError
from rackSim.config.loading import ConfigError
from rackSim.perf.profile import Profile

#: the profiles `racksim-calibrate profile` writes are named <hardware>__<model>.yaml
GENERATED = sorted(p for p in CALIBRATION.glob("*__*.yaml")
                   if p != DEFAULT_PROFILE and not p.name.startswith(("targets", "cpu-")))


def test_every_profile_names_its_scenario_options() -> None:
    assert GENERATED  # the table profiles of the three generated models
    for path in GENERATED:
        hardware, model = path.stem.split("__")
        assert profile_options(Profile.load(path)) == (model, hardware)
    assert profile_options(Profile.load(DEFAULT_PROFILE)) == ("deepseek_v4_1_flash",
                                                              "gb300_nvl72")


def test_a_profile_of_a_model_without_a_spec_is_refused(tmp_path: Path) -> None:
    p = Profile.load(DEFAULT_PROFILE)
    p.meta["model"] = "mistral_large_3"
    with pytest.raises(ProfileInputError, match=(
            "^--profile: profile 'gb300__deepseek_v4_1_flash' was fitted for model "
            "mistral_large_3, which no scenarios/model/ option describes")):
        profile_options(p)
    del p.meta["model"], p.meta["hardware"]  # names neither: the reference model's, any GPU
    assert profile_options(p) == ("deepseek_v4_1_flash", None)


def test_a_generated_model_runs_its_experts_at_its_served_precision() -> None:
    """The reference runs MXFP4 experts (`perf.weight_dtype: fp4`); a generated spec served in
    FP8 was priced at FP4 peak FLOP/s by the operating points of explain and the notebook."""
    assert "perf.weight_dtype" not in model_adjustments("deepseek_v4_1_flash")[1]
    for model in ("deepseek_v3", "qwen3_235b_a22b", "meta_llama_3_1_70b"):
        assert model_adjustments(model)[1]["perf.weight_dtype"] == "fp8"
        cfg = operating_point(model=model, hardware="gb300_nvl72", prefill_gpus=8,
                              decode_gpus=8)
        assert cfg.perf.weight_dtype == "fp8"
    assert operating_point().perf.weight_dtype == "fp4"


def test_an_instance_is_priced_beside_the_narrowest_instance_that_fits() -> None:
    # the reference: a 2-GPU instance beside either role, as before
    assert instance_point("decode", 32, hardware="gb300_nvl72") == operating_point()
    cfg = instance_point("prefill", 4, hardware="gb300_nvl72")
    assert (cfg.deployment.prefill.gpus_per_instance, cfg.deployment.decode.gpus) == (4, 2)
    # DeepSeek-V3 in FP8 needs 8 GB200 GPUs per instance: a DEP64 decode instance keeps 8
    # GPUs of the rack for its prefill instance
    cfg = instance_point("decode", 64, hardware="gb200_nvl72", model="deepseek_v3")
    assert (cfg.deployment.prefill.gpus_per_instance, cfg.deployment.decode.gpus) == (8, 64)
    # nothing fits beside an 8-GPU instance in an 8-GPU HGX node: the other instance goes to
    # a second NVLink domain of the rack (the priced instance still has one domain, as a node)
    cfg = instance_point("decode", 8, hardware="h200_hgx", model="qwen3_235b_a22b")
    assert (cfg.deployment.decode.gpus, cfg.hardware.domain_gpus) == (8, 8)
    assert cfg.hardware.gpus_per_rack == 16
    assert instance_point("prefill", 4, hardware="h200_hgx", model="qwen3_235b_a22b"
                          ).hardware.gpus_per_rack == 8
    # an instance wider than a node fits no rack: the message of the real rack
    with pytest.raises(ConfigError, match=r"1 prefill x 16 \+ 1 decode x 8\) but "
                                          r"hardware.gpus_per_rack=8"):
        instance_point("prefill", 16, hardware="h200_hgx", model="qwen3_235b_a22b")
