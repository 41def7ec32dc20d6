"""Shared fixtures: small validated scenarios built from the real Hydra tree."""

from __future__ import annotations

import pytest

from rackSim.config import RunConfig, compose_scenario


@pytest.fixture(scope="session")
def smoke_cfg() -> RunConfig:
    return compose_scenario(["experiment=smoke", "progress=false"])

