"""Scenarios for calibration operating points, built from the `scenarios/` YAML tree."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from rackSim.config.loading import load_run_config
from rackSim.config.specs import RunConfig

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
CALIBRATION = ROOT / "calibration"
DEFAULT_PROFILE = CALIBRATION / "gb300__deepseek_v4_1_flash.yaml"


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
                    model: str = "deepseek_v4_1_flash",
                    deployment: str = "agentx_p8_dep32", parallelism: str = "DEP") -> RunConfig:
    """A validated RunConfig for one layout: one prefill instance of `prefill_gpus` GPUs and
    one decode instance of `decode_gpus` GPUs (so any DEP width up to 64 fits one rack), both
    with `parallelism` ('DEP' or 'TP').
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
    tree = {"model": _read("model", model), "hardware": _read("hardware", hardware),
            "deployment": dep, "workload": _read("workload", default_choice("workload")),
            "pricing": _read("pricing", default_choice("pricing")), "perf": perf, "progress": False}
    return load_run_config(tree)
