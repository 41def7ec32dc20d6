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


def profile_path(hardware: str, model: str) -> Path:
    """The calibration profile of a GPU x model pair: `calibration/<hardware>__<model>.yaml`
    (`racksim-calibrate profile` writes these), the reference pair's own profile for it."""
    path = CALIBRATION / f"{hardware}__{model}.yaml"
    if (hardware, model) == ("gb300_nvl72", "deepseek_v4_1_flash"):
        return DEFAULT_PROFILE
    if not path.exists():
        raise FileNotFoundError(f"no calibration profile {path.name} in calibration/; fit one "
                                f"with `racksim-calibrate profile --model {model} "
                                f"--hardware {hardware}`")
    return path


def model_adjustments(model: str) -> tuple[str, dict[str, Any]]:
    """What a scenario built for the reference model must change for `model`: the workload
    option and dotted key -> value changes. No speculative decoding without a draft model; a
    model whose context window is smaller than the AgentX workload's (whose compaction needs
    its full window) gets the synthetic workload capped at its window. The reference model
    keeps everything."""
    spec = _read("model", model)
    workload = default_choice("workload")
    out: dict[str, Any] = {}
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
    workload, dotted = model_adjustments(model)
    tree = {"model": _read("model", model), "hardware": _read("hardware", hardware),
            "deployment": dep, "workload": _read("workload", workload),
            "pricing": _read("pricing", default_choice("pricing")), "perf": perf, "progress": False}
    _apply(tree, dotted)
    return load_run_config(tree)
