"""Helpers of the engine, fleet and colocated tests: small synthetic workloads, a colocated
instance's settings, a model served with DeepEP kernels, the hypothesis depth, simulation runs,
and the checks that two runs agree."""

from __future__ import annotations

import functools

from hypothesis import settings

from rackSim.config import compose_scenario, with_changes
from rackSim.engine.simulation import Simulation
from rackSim.workload.sources import load_sessions

DEEP = settings.default.max_examples >= 1000  # HYPOTHESIS_PROFILE=deep (tests/conftest.py)

SMALL_SYNTHETIC = {"turns_mean": 4, "first_prompt_tokens_mean": 3000,
                   "new_tokens_per_turn_mean": 500, "output_tokens_mean": 40,
                   "tool_delay_s_mean": 0.5, "subagent_prob": 0.5, "subagent_fanout_max": 3,
                   "subagent_turns_mean": 2, "max_context_tokens": 131072}


#: Short sessions (six turns, 0.2-s tool calls): many start within a minute (routing tests).
SHORT_SESSIONS = {"turns_mean": 6, "first_prompt_tokens_mean": 6000,
                  "new_tokens_per_turn_mean": 800, "output_tokens_mean": 60,
                  "tool_delay_s_mean": 0.2, "subagent_prob": 0.2, "subagent_fanout_max": 3,
                  "subagent_turns_mean": 2, "max_context_tokens": 131072}

#: A colocated instance's settings (`deployment.colocated`): one DEP4 instance.
COLOCATED = {"instances": 1, "gpus": 4, "parallelism": "DEP", "max_num_batched_tokens": 4096,
             "max_num_seqs_per_rank": 8,
             "speculative": {"num_draft_tokens": 3, "accepted_tokens_per_step": 3.25}}


def run_short_sessions(base, concurrency=24, primer=True, window_s=20.0, **deployment):
    """The request records (primers left out) of `base` with `deployment` changes, replaying
    12 `SHORT_SESSIONS` on `concurrency` lanes with no warm-up requests."""
    cfg = with_changes(base, deployment=deployment, workload={
        "num_sessions": 12, "source": "synthetic", "synthetic": SHORT_SESSIONS,
        "replay": {"concurrency": concurrency, "warmup_requests_per_lane": 0, "primer": primer,
                   "window_s": window_s, "drain_s": 600.0}})
    sim = Simulation(cfg, load_sessions(cfg.workload, cfg.seed))
    return [r for r in sim.run(progress=False).requests if r.phase != "primer"]


@functools.cache
def moe_scenario():
    """Qwen3-235B-A22B on one H200 node (DeepEP all-to-all kernels, so dual-batch overlap
    applies): DEP4 prefill + DEP4 decode, no drafts."""
    return compose_scenario([
        "experiment=smoke", "progress=false", "model=qwen3_235b_a22b", "hardware=h200_hgx",
        "perf.profile=calibration/h200_hgx__qwen3_235b_a22b.yaml", "perf.weight_dtype=fp8",
        "workload=synthetic", "workload.synthetic.max_context_tokens=32768",
        "deployment.prefill.instances=1", "deployment.prefill.gpus_per_instance=4",
        "deployment.decode.speculative.num_draft_tokens=0",
        "deployment.decode.speculative.accepted_tokens_per_step=1"])


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


TICK_S = 0.5e-3  # shorter than any decode step (checked by the assertion below)


def _ticking(env, ticks: list[int]):
    """A process that only wakes every TICK_S (counting its timeouts in `ticks`)."""
    while True:
        ticks[0] += 1
        yield env.timeout(TICK_S)


def assert_same_with_an_event_in_every_step(cfg, sessions=None) -> tuple:
    """A decode instance runs the steps before the next event without yielding to SimPy
    (engine/decode.py). With an unrelated event inside every step none can, so each step
    becomes its own event: `cfg` must give the same records, step rows and ITL histogram to
    the bit both ways, and never fewer events with the ticks. Returns (output without ticks,
    output with them, the ticks' events)."""
    sessions = sessions or load_sessions(cfg.workload, cfg.seed)
    fused = Simulation(cfg, sessions).run(progress=False)
    sim = Simulation(cfg, sessions)
    ticks = [0]
    sim.env.process(_ticking(sim.env, ticks))
    ticked = sim.run(progress=False)
    n_ticks = ticks[0] + 1  # and the process's start
    assert min(s[3] for s in ticked.steps if s[0].startswith("decode")) > TICK_S * 1e3
    assert [r.as_row() for r in fused.requests] == [r.as_row() for r in ticked.requests]
    assert fused.steps == ticked.steps
    assert (fused.itl.weights == ticked.itl.weights).all()
    assert fused.events <= ticked.events - n_ticks
    return fused, ticked, n_ticks
