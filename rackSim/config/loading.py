"""Turn a composed Hydra/OmegaConf tree (or a plain dict) into a validated `RunConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from rackSim.config.errors import ScenarioError, WorkloadFileError, read_yaml_mapping
from rackSim.config.specs import RunConfig, WorkloadSpec


class ConfigError(ScenarioError):
    """A scenario that cannot be simulated; the message names each bad field and the fix."""


def describe_fields(err: ValidationError, prefix: str = "") -> list[str]:
    """One line per bad field of a pydantic error: its dotted path (under `prefix`, list
    items as `[i]`) and what to do."""
    out = []
    for e in err.errors():
        parts = [prefix] if prefix else []
        where = ".".join([*parts, *(f"[{p}]" if isinstance(p, int) else str(p)
                                    for p in e["loc"])]).replace(".[", "[")
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key; remove it or check its spelling"
        elif e["type"] == "missing":
            msg = "required field is missing"
        # a rule across fields (no location) names its fields itself
        out.append(f"  {where}: {msg}" if where else f"  {msg}")
    return out


def _describe(err: ValidationError) -> str:
    return "invalid scenario:\n" + "\n".join(describe_fields(err))


def load_run_config(tree: Mapping[str, Any] | Any) -> RunConfig:
    """Validate a composed scenario. Accepts an OmegaConf DictConfig or a plain mapping."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(tree, DictConfig):
            tree = OmegaConf.to_container(tree, resolve=True)
    except ImportError:  # pragma: no cover - hydra-core is a hard dependency
        pass
    data = {k: v for k, v in dict(tree).items() if k not in ("hydra", "experiment")}
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def load_workload_file(path: Any, defaults: Mapping[str, Any] | None = None) -> WorkloadSpec:
    """A WorkloadSpec YAML file, validated; WorkloadFileError names the file, the line (YAML
    syntax) or the fields, and the fix. `defaults`: top-level fields the file may leave out
    (a caller that does not read them)."""
    data = read_yaml_mapping(path, "workload", WorkloadFileError,
                             "WorkloadSpec fields (name, source, replay, ...; docs/workload.md)")
    try:
        return WorkloadSpec.model_validate({**(defaults or {}), **data})
    except ValidationError as err:
        raise WorkloadFileError(f"workload {path}: invalid workload:\n"
                                + "\n".join(describe_fields(err))) from None
