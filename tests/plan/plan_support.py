"""Planner test helpers: plans composed from the real Hydra tree (scenarios/plan/), small ones
on the smoke scenario so the screen and the simulations stay fast."""

from __future__ import annotations

from collections.abc import Sequence

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from rackSim.config import SCENARIOS_DIR
from rackSim.plan.inputs import PlanInputs, load_plan_inputs

#: A small question on the smoke scenario (24 sessions): 40 agents on GB300, racks of up to
#: 3 x DEP2 prefill + DEP4 / DEP8 decode, or 1-2 colocated DEP4 / DEP8 instances.
SMALL = ["experiment=smoke", "plan=agentx_reference", "plan.demand.agents=40",
         "plan.hardware=[{name: gb300_nvl72, rental_usd_per_gpu_hour: 5.0}]",
         "plan.limits.max_racks=2", "plan.space.prefill_gpus_per_instance=[2]",
         "plan.space.prefill_instances_max=3", "plan.space.decode_gpus=[4,8]",
         "plan.space.colocated_gpus=[4,8]", "plan.space.colocated_instances_max=2",
         "plan.confirm.window_s=15", "plan.confirm.top_k=2"]


def compose_tree(overrides: Sequence[str]) -> DictConfig:
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(SCENARIOS_DIR), version_base=None):
        return compose("config", overrides=list(overrides))


def compose_plan(overrides: Sequence[str]) -> PlanInputs:
    return load_plan_inputs(compose_tree(overrides))


