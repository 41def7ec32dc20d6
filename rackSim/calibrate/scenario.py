"""Scenarios for calibration operating points, built from the `scenarios/` YAML tree."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from rackSim.config.errors import ProfileInputError
from rackSim.config.loading import ConfigError, load_run_config
from rackSim.config.scenarios import scenario_options
from rackSim.config.specs import ModelSpec, RunConfig
from rackSim.perf.profile import Profile

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
CALIBRATION = ROOT / "calibration"
DEFAULT_PROFILE = CALIBRATION / "gb300__deepseek_v4_1_flash.yaml"
#: the model DEFAULT_PROFILE is fitted for (a `scenarios/model/` option)
REFERENCE_MODEL = "deepseek_v4_1_flash"


def profile_path(hardware: str, model: str) -> Path:
    """The calibration profile of a GPU x model pair: `calibration/<hardware>__<model>.yaml`
    (`racksim-calibrate profile` writes these), the reference pair's own profile for it."""
    path = CALIBRATION / f"{hardware}__{model}.yaml"
    if (hardware, model) == ("gb300_nvl72", REFERENCE_MODEL):
        return DEFAULT_PROFILE
    if not path.exists():
        raise FileNotFoundError(f"no calibration profile {path.name} in calibration/; fit one "
                                f"with `racksim-calibrate profile --model {model} "
                                f"--hardware {hardware}`")
    return path


def profile_options(profile: Profile, label: str = "--profile") -> tuple[str, str | None]:
    """The `scenarios/` model and hardware options a profile was fitted for (by the model
    and hardware names it records): (model, hardware or None if it names no hardware option).
    A profile that names no model is the reference model's; one whose model no
    `scenarios/model/` option describes is refused (ProfileInputError naming `label`)."""
    def option(group: str, name: object) -> str | None:
        return next((o for o in scenario_options(group)
                     if str(_read(group, o).get("name")) == str(name)), None)

    model = profile.meta.get("model")
    found = option("model", model) if model is not None else REFERENCE_MODEL
    if found is None:
        raise ProfileInputError(
            f"{label}: profile '{profile.name}' was fitted for model {model}, which no "
            f"scenarios/model/ option describes; add its spec (`racksim-calibrate model "
            f"config.json`) or give another profile")
    hardware = profile.meta.get("hardware")
    return found, option("hardware", hardware) if hardware is not None else None


def model_adjustments(model: str) -> tuple[str, dict[str, Any]]:
    """What a scenario built for the reference model must change for `model`: the workload
    option and dotted key -> value changes. No speculative decoding without a draft model; a
    model whose context window is smaller than the AgentX workload's (whose compaction needs
    its full window) gets the synthetic workload capped at its window; a model whose spec
    states the precision it is served in (`gemm_dtype`, as `racksim-calibrate model` writes
    it, with the `provenance` of each value) runs its experts at that precision
    (`perf.weight_dtype`, as its profile's `scenario_needs` says), not at the reference's
    MXFP4. The reference model keeps everything."""
    spec = _read("model", model)
    workload = default_choice("workload")
    out: dict[str, Any] = {}
    if "provenance" in spec:
        out["perf.weight_dtype"] = spec.get("gemm_dtype",
                                            ModelSpec.model_fields["gemm_dtype"].default)
    if not spec.get("draft"):
        out["deployment.decode.speculative.num_draft_tokens"] = 0
        out["deployment.decode.speculative.accepted_tokens_per_step"] = 1.0
    window = _read("workload", workload).get("agentx", {}).get("context_window", 131_072)
    if spec["context_window"] < window:
        workload = "synthetic"
        out["workload.synthetic.max_context_tokens"] = int(spec["context_window"])
    return workload, out


def model_overrides(model: str) -> list[str]:
    """`model_adjustments` as Hydra overrides (`compose_scenario`, `racksim`)."""
    workload, dotted = model_adjustments(model)
    return [f"model={model}", f"workload={workload}", *(f"{k}={v}" for k, v in dotted.items())]


def _apply(tree: dict[str, Any], dotted: dict[str, Any]) -> None:
    for key, value in dotted.items():
        *path, leaf = key.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value


def default_choice(group: str) -> str:
    """The option `scenarios/config.yaml` picks for a config group (e.g. 'workload')."""
    tree = yaml.safe_load((SCENARIOS / "config.yaml").read_text())
    for item in tree.get("defaults", []):
        if isinstance(item, dict) and group in item:
            return str(item[group])
    raise KeyError(f"scenarios/config.yaml has no default for '{group}'")


def _read(group: str, name: str) -> dict[str, Any]:
    data = yaml.safe_load((SCENARIOS / group / f"{name}.yaml").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


@lru_cache(maxsize=256)
def operating_point(*, hardware: str = "gb300_nvl72", decode_gpus: int = 32,
                    prefill_gpus: int = 2, eplb: bool = True, redundant_experts: int = 0,
                    allreduce: str = "recursive_doubling", profile: Path | None = None,
                    model: str = REFERENCE_MODEL,
                    deployment: str = "agentx_p8_dep32", parallelism: str = "DEP",
                    domains_per_rack: int | None = None) -> RunConfig:
    """A validated RunConfig for one layout: one prefill instance of `prefill_gpus` GPUs and
    one decode instance of `decode_gpus` GPUs (so any DEP width up to 64 fits one rack), both
    with `parallelism` ('DEP' or 'TP'). `domains_per_rack`: the rack holds that many of the
    hardware's NVLink domains (an HGX node is one; two let an 8-wide instance sit beside
    another).
    Cached: RunConfig is frozen, and fits evaluate the same points many times."""
    dep = _read("deployment", deployment)
    dep["prefill"] = {**dep["prefill"], "instances": 1, "gpus_per_instance": prefill_gpus,
                      "parallelism": parallelism}
    dep["decode"] = {**dep["decode"], "gpus": decode_gpus, "parallelism": parallelism}
    dep["eplb"] = {**dep["eplb"], "enabled": eplb, "redundant_experts": redundant_experts}
    dep["allreduce"] = allreduce
    perf: dict[str, Any] = {"model": "roofline", "profile": None}
    if profile is not None:
        perf = {"model": "calibrated", "profile": str(profile)}
    workload, dotted = model_adjustments(model)
    hw = _read("hardware", hardware)
    if domains_per_rack is not None:
        hw["gpus_per_rack"] = domains_per_rack * (hw.get("nvlink_domain_gpus")
                                                  or hw["gpus_per_rack"])
    tree = {"model": _read("model", model), "hardware": hw,
            "deployment": dep, "workload": _read("workload", workload),
            "pricing": _read("pricing", default_choice("pricing")), "perf": perf, "progress": False}
    _apply(tree, dotted)
    return load_run_config(tree)


def instance_point(role: str, gpus: int, *, hardware: str, model: str = REFERENCE_MODEL,
                   **layout: Any) -> RunConfig:
    """`operating_point` for pricing one instance, `role` 'prefill' or 'decode', of `gpus`
    GPUs: beside it the narrowest instance of the other role (2, 4 or 8 GPUs) that holds the
    model's weights and fits the rack, or, when none does (an instance as wide as an HGX
    node), fits a rack of two of its NVLink domains. That one is not priced (an instance's
    price depends on its own NVLink domain, not on the rack); the scenario only needs it to
    validate. If none fits, the ConfigError of the widest layout in the real rack (the
    instance alone may not fit)."""
    in_the_rack: ConfigError | None = None
    for domains in (None, 2):
        for other in (2, 4, 8):
            widths = ({"decode_gpus": gpus, "prefill_gpus": other} if role == "decode"
                      else {"prefill_gpus": gpus, "decode_gpus": other})
            try:
                return operating_point(hardware=hardware, model=model, **widths, **layout,
                                       domains_per_rack=domains)
            except ConfigError as err:
                if domains is None:
                    in_the_rack = err
    assert in_the_rack is not None
    raise in_the_rack
