"""Step-time models: pure cost functions the engine asks for every step it simulates."""

from __future__ import annotations

from rackSim.config.specs import RunConfig
from rackSim.perf.step import COMPONENTS, DecodeBatch, PrefillBatch, StepBreakdown, StepModel


def build_step_model(cfg: RunConfig, role: str, seed: int = 0) -> StepModel:
    """A fresh step model for one instance (`role` is 'prefill' or 'decode'); `seed` drives
    its stochastic parts (stragglers, expert-popularity drift)."""
    if cfg.perf.model == "measured":
        from rackSim.perf.measured import MeasuredStepModel

        return MeasuredStepModel(cfg, role=role, seed=seed)
    if cfg.perf.model == "calibrated":
        from rackSim.perf.calibrated import CalibratedStepModel

        return CalibratedStepModel(cfg, role=role, seed=seed)
    from rackSim.perf.roofline import RooflineStepModel

    return RooflineStepModel(cfg)


__all__ = ["COMPONENTS", "DecodeBatch", "PrefillBatch", "StepBreakdown", "StepModel",
           "build_step_model"]
