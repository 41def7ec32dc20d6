"""From a composed Hydra tree (`scenarios/config.yaml` + `plan=<name>`) to validated planner
inputs: the plan, the base scenario its candidates vary, and each hardware option's spec.

Everything is checked before anything runs; a `PlanError` names each bad field
(`plan.hardware[1].name: unknown hardware 'h100'; ...`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pydantic import ValidationError

from rackSim.config import ConfigError, load_run_config, scenario_options
from rackSim.config.errors import ScenarioError
from rackSim.config.loading import describe_fields
from rackSim.config.scenarios import load_hardware
from rackSim.config.specs import HardwareSpec, RunConfig, resolve_path
from rackSim.perf.profile import Profile
from rackSim.plan.layout import RackLayout, smallest_layouts
from rackSim.plan.spec import PlanSpec, Space


class PlanError(ScenarioError):
    """A planning question that cannot be answered as posed; the message names the field."""


@dataclass(frozen=True)
class PlanInputs:
    plan: PlanSpec
    scenario: RunConfig
    hardware: dict[str, HardwareSpec]


def load_plan_inputs(tree: Mapping[str, Any] | DictConfig) -> PlanInputs:
    """Validate the `plan` node and the scenario around it; raise `PlanError` listing every
    bad field."""
    if isinstance(tree, DictConfig):
        tree = OmegaConf.to_container(tree, resolve=True)
    tree = dict(tree)
    node = tree.pop("plan", None)
    if node is None:
        raise PlanError("no plan chosen: pick one of scenarios/plan/, e.g. "
                        "`racksim-plan plan=agentx_reference`")
    problems: list[str] = []
    try:
        plan = PlanSpec.model_validate(node)
    except ValidationError as err:
        raise PlanError("invalid plan:\n" + "\n".join(describe_fields(err, "plan"))) from None
    try:
        scenario = load_run_config(tree)
    except ConfigError as err:
        raise PlanError(f"the scenario the plan varies is invalid: {err}") from None
    hardware: dict[str, HardwareSpec] = {}
    known = scenario_options("hardware")
    for i, opt in enumerate(plan.hardware):
        spec = load_hardware(opt.name)
        if spec is None:
            problems.append(f"  plan.hardware[{i}].name: unknown hardware '{opt.name}'; "
                            f"pick one of {known} (scenarios/hardware/)")
        elif scenario.perf.weight_dtype not in spec.flops:
            problems.append(f"  plan.hardware[{i}].name: '{opt.name}' has no "
                            f"{scenario.perf.weight_dtype} peak (perf.weight_dtype)")
        else:
            hardware[opt.name] = spec
        if opt.profile is not None and resolve_path(opt.profile) is None:
            problems.append(f"  plan.hardware[{i}].profile: no such file '{opt.profile}'; fit "
                            "one with `racksim-calibrate profile` (calibration/)")
    names = [o.name for o in plan.hardware]
    for name in {n for n in names if names.count(n) > 1}:
        problems.append(f"  plan.hardware: '{name}' listed twice; give each option once")
    # a space none of whose layouts fits a rack is refused; of one where some fit, the
    # screen lists the others per family as not fitting
    if not problems:
        rack_gpus = max(hw.gpus_per_rack for hw in hardware.values())
        if all(lay.gpus > rack_gpus for lay in smallest_layouts(plan.space)):
            problems = unfit_space(plan.space, rack_gpus)
    if problems:
        raise PlanError("invalid plan:\n" + "\n".join(problems))
    for i, opt in enumerate(plan.hardware):  # each prices the plan's model (profile class)
        if opt.profile is not None:
            Profile.load(resolve_path(opt.profile), f"plan.hardware[{i}].profile"
                         ).require_model(scenario.model.name)
    return PlanInputs(plan, scenario, hardware)


#: the space's fields that size the smallest layout of each family
SIZED_BY = {"disaggregated": "decode_gpus x decode_instances + prefill_gpus_per_instance",
            "colocated": "colocated_gpus"}


def unfit_space(space: Space, rack_gpus: int) -> list[str]:
    """A line per family of `space` whose smallest layout takes more than `rack_gpus` GPUs
    (the plan's largest rack): every instance lives in one rack."""
    least: dict[str, RackLayout] = {}
    for lay in smallest_layouts(space):
        if lay.family not in least or lay.gpus < least[lay.family].gpus:
            least[lay.family] = lay
    return [f"  plan.space ({SIZED_BY[family]}): the smallest {family} layout, {lay.name}, "
            f"takes {lay.gpus} GPUs; the plan's largest rack holds {rack_gpus}: pick smaller "
            "widths" for family, lay in least.items() if lay.gpus > rack_gpus]
