"""Compose a scenario from the Hydra tree without the CLI (tests, notebooks, sweeps)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rackSim.config.errors import ScenarioError
from rackSim.config.flags import unwritable
from rackSim.config.loading import load_run_config
from rackSim.config.specs import HardwareSpec, RunConfig

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios"


def load_hardware(name: str) -> HardwareSpec | None:
    """The spec of `scenarios/hardware/<name>.yaml`, or None if there is no such file."""
    import yaml

    path = SCENARIOS_DIR / "hardware" / f"{name}.yaml"
    if not path.is_file():
        return None
    return HardwareSpec.model_validate(yaml.safe_load(path.read_text()))


def scenario_options(group: str) -> list[str]:
    """The options of a config group: the names of `scenarios/<group>/*.yaml`, sorted."""
    return sorted(p.stem for p in (SCENARIOS_DIR / group).glob("*.yaml"))


def compose_scenario(overrides: Sequence[str] = (), config_dir: Path | str | None = None
                     ) -> RunConfig:
    """The validated RunConfig of `scenarios/config.yaml` with Hydra `overrides` applied,
    e.g. `compose_scenario(["experiment=smoke", "deployment.decode.gpus=8"])`. An unknown
    key or group option is a ScenarioError naming it and the fix, as on the command line."""
    return load_run_config(_compose(overrides, config_dir))


def check_overrides(args: Sequence[str], config_dir: Path | str | None = None) -> None:
    """Compose the scenario the command line asks for, before Hydra runs it, so that an
    unknown key or group option ends in one plain ScenarioError naming it and the fix (Hydra's
    own report is a traceback line and a hint). A run or sweep directory
    (`hydra.run.dir`, `hydra.sweep.dir`) that cannot be made is refused too, multirun or not
    (Hydra would end in an OSError traceback). Multirun and Hydra's other flags are left to
    Hydra (each sweep job validates its scenario)."""
    from hydra.core.global_hydra import GlobalHydra

    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and value:
            reason = unwritable(Path(value), "directory")
            if reason is not None:
                raise ScenarioError(f"{key}={value}: {reason}")
    if any(a.startswith("-") for a in args):
        return
    try:
        _compose([a for a in args if not a.lstrip("+~").startswith("hydra")], config_dir)
    finally:
        GlobalHydra.instance().clear()


def _compose(overrides: Sequence[str], config_dir: Path | str | None):
    """The Hydra tree of `scenarios/config.yaml` (or `config_dir`) with `overrides`; an
    unknown key or group option is a ScenarioError (`_plain_hydra_error`)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir or SCENARIOS_DIR),
                                   version_base=None):
            return compose("config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ScenarioError(_plain_hydra_error(err, overrides)) from None


def _plain_hydra_error(err: Exception, overrides: Sequence[str]) -> str:
    """One line: which override is wrong, why, and the fix."""
    import re

    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    group = re.search(r"Could not find '([^']+)'", text)
    if group is not None:
        name = group[1]
        base, _, option = name.rpartition("/")
        options = scenario_options(base) if base else []
        return (f"{base or name}={option}: no such option in scenarios/{base}/; "
                f"choose one of {', '.join(options)}" if options else
                f"{name}: no such config; check the group name (scenarios/)")
    key = re.search(r"Key '([^']+)' is not in struct|Could not override '([^']+)'", text)
    if key is not None:
        name = key[1] or key[2]
        cause = str(err.__cause__ or "")  # Hydra keeps OmegaConf's own words there
        missing = re.search(r"Key '([^'.]+)' is not in struct", f"{text}\n{cause}")
        if missing is not None and name.startswith(missing[1] + "."):
            unchosen = missing[1]
            options = scenario_options(unchosen)
            if options:  # a key of a config group none of whose options is chosen
                return (f"{name}: no {unchosen} chosen, so it has no keys; choose one first "
                        f"({unchosen}=<one of {', '.join(options)}>)")
        absent = re.search(r"full_key: (\S+)", cause)
        absent = absent[1] if absent is not None else name
        default = _spec_default(absent)
        if default is not None and absent == name:  # Hydra adds a key it lacks with a '+'
            return (f"{name}: not in the composed YAML, which leaves it at its default "
                    f"({default}); set it with a leading '+': +{name}={_value_of(name, overrides)}")
        if default is not None:  # a section left at its default has no keys to override
            example = default if default.startswith("{") else "{key: value, ...}"
            return (f"{name}: its section {absent} is not in the composed YAML, which leaves "
                    f"it at its default ({default}); give the whole section with a leading "
                    f"'+': '+{absent}={example}' with your values")
        return (f"{name}: no such scenario key; check its spelling (`racksim --cfg job` "
                "lists the keys)")
    return f"invalid override ({first}); overrides given: {' '.join(overrides)}"


def _spec_default(name: str) -> str | None:
    """The default of dotted key `name` as text when it is a field of the scenario's specs
    (`RunConfig`, or the planner's `PlanSpec` under `plan.`), else None."""
    import typing

    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    head, _, rest = name.partition(".")
    if head == "plan":
        from rackSim.plan.spec import PlanSpec  # the planner's question, racksim-plan only

        model, parts = PlanSpec, rest.split(".")
    else:
        model, parts = RunConfig, name.split(".")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        if i == len(parts) - 1:
            if field.default is PydanticUndefined:
                return "its default" if field.default_factory is not None else "required"
            if isinstance(field.default, BaseModel):  # in Hydra's syntax, as a user gives it
                return "{" + ", ".join(f"{k}: {v}" for k, v in field.default.model_dump(
                    mode="json", exclude_none=True).items()) + "}"
            return repr(field.default) if isinstance(field.default, str) else str(field.default)
        kinds = typing.get_args(field.annotation) or (field.annotation,)
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)),
                     None)
    return None


def _value_of(name: str, overrides: Sequence[str]) -> str:
    """The value the command line gave `name` (`<value>` when it is not there)."""
    for arg in overrides:
        key, eq, value = arg.lstrip("+~").partition("=")
        if key == name and eq:
            return value
    return "<value>"


def with_changes(cfg: RunConfig, **sections: object) -> RunConfig:
    """A re-validated copy of `cfg` with nested fields replaced, e.g.
    `with_changes(cfg, workload={"replay": {"concurrency": 4}}, seed=3)`."""
    data = cfg.model_dump()

    def merge(dst: dict, src: dict) -> None:
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(dst.get(k), dict):
                merge(dst[k], v)
            else:
                dst[k] = v

    merge(data, sections)
    return RunConfig.model_validate(data)
