"""Compose a scenario from the Hydra tree without the CLI (tests, notebooks, sweeps)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rackSim.config.loading import load_run_config
from rackSim.config.specs import RunConfig

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios"


def compose_scenario(overrides: Sequence[str] = (), config_dir: Path | str | None = None
                     ) -> RunConfig:
    """The validated RunConfig of `scenarios/config.yaml` with Hydra `overrides` applied,
    e.g. `compose_scenario(["experiment=smoke", "deployment.decode.gpus=8"])`."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir or SCENARIOS_DIR), version_base=None):
        tree = compose("config", overrides=list(overrides))
    return load_run_config(tree)


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
