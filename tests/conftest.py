"""Shared fixtures: small validated scenarios built from the real Hydra tree."""

from __future__ import annotations

import pytest

from rackSim.config import RunConfig, compose_scenario


@pytest.fixture(scope="session")
def smoke_cfg() -> RunConfig:
    return compose_scenario(["experiment=smoke", "progress=false"])


def with_changes(cfg: RunConfig, **sections: dict) -> RunConfig:
    """A copy of `cfg` with nested fields replaced, re-validated:
    `with_changes(cfg, workload={"replay": {"concurrency": 4}})`."""
    data = cfg.model_dump()

    def merge(dst: dict, src: dict) -> None:
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(dst.get(k), dict):
                merge(dst[k], v)
            else:
                dst[k] = v

    merge(data, sections)
    return RunConfig.model_validate(data)
