"""Planner fixtures (helpers in plan_support.py)."""

from __future__ import annotations

import pytest
from plan_support import SMALL, compose_plan

from rackSim.plan.inputs import PlanInputs


@pytest.fixture(scope="session")
def small_inputs() -> PlanInputs:
    return compose_plan(SMALL)
