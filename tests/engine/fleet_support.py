"""Helpers of the fleet and colocated invariant tests: a small synthetic workload, the
hypothesis depth, and one simulation run."""

from __future__ import annotations

from hypothesis import settings

from rackSim.engine.simulation import Simulation
from rackSim.workload.sources import load_sessions

DEEP = settings.default.max_examples >= 1000  # HYPOTHESIS_PROFILE=deep (tests/conftest.py)

SMALL_SYNTHETIC = {"turns_mean": 4, "first_prompt_tokens_mean": 3000,
                   "new_tokens_per_turn_mean": 500, "output_tokens_mean": 40,
                   "tool_delay_s_mean": 0.5, "subagent_prob": 0.5, "subagent_fanout_max": 3,
                   "subagent_turns_mean": 2, "max_context_tokens": 131072}


def run_sim(cfg):
    """(the Simulation, its output) of `cfg` on its own workload."""
    sim = Simulation(cfg, load_sessions(cfg.workload, cfg.seed))
    return sim, sim.run(progress=False)


def assert_same_run_twice(cfg) -> None:
    """Two runs of `cfg` give the same records, step rows and ITL histogram."""
    a, b = run_sim(cfg)[1], run_sim(cfg)[1]
    assert [r.as_row() for r in a.requests] == [r.as_row() for r in b.requests]
    assert a.steps == b.steps
    assert (a.itl.weights == b.itl.weights).all()
