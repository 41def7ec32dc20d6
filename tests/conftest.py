"""Shared fixtures: small validated scenarios built from the real Hydra tree, and the
hypothesis profiles: `quick` (default, what CI runs) and `deep` (HYPOTHESIS_PROFILE=deep: the
engine and fleet invariants over at least 1,000 generated scenarios each; README, Tests)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from rackSim.config import RunConfig, compose_scenario

settings.register_profile("quick")
settings.register_profile("deep", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture(scope="session")
def smoke_cfg() -> RunConfig:
    return compose_scenario(["experiment=smoke", "progress=false"])

