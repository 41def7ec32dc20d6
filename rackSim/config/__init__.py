"""Scenario configuration: pydantic specs and their loading from Hydra."""

from rackSim.config.loading import ConfigError, load_run_config
from rackSim.config.scenarios import (
    SCENARIOS_DIR,
    compose_scenario,
    scenario_options,
    with_changes,
)
from rackSim.config.specs import (
    DeploymentSpec,
    HardwareSpec,
    ModelSpec,
    PerfSpec,
    PricingSpec,
    RunConfig,
    WorkloadSpec,
    kv_bytes_per_gpu,
    weights_bytes_per_gpu,
)

__all__ = [
    "ConfigError", "DeploymentSpec", "HardwareSpec", "ModelSpec", "PerfSpec", "PricingSpec",
    "RunConfig", "SCENARIOS_DIR", "WorkloadSpec", "compose_scenario", "kv_bytes_per_gpu",
    "load_run_config", "scenario_options", "weights_bytes_per_gpu", "with_changes",
]
