"""Engine invariants, checked on many small random scenarios (hypothesis).

No request lost or duplicated, tokens conserved, causality (stage times ordered, a request is
sent only after what it waits on), token times monotonic, determinism per seed. Scenarios
cover every router, push and pull, KV-load caps, host offload on and off, dual-batch overlap
(on a model served with DeepEP kernels), and every workload source: closed loop (synthetic,
AgentX, a JSONL pool) and open loop (the Mooncake and Azure traces). The quick profile runs a
few dozen; `HYPOTHESIS_PROFILE=deep` runs 1,000 per test.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import signal
import time
from pathlib import Path

import pytest
from fleet_support import (
    DEEP,
    SMALL_SYNTHETIC,
    assert_same_with_an_event_in_every_step,
    moe_scenario,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rackSim.config import compose_scenario, with_changes
from rackSim.config.errors import ScenarioError
from rackSim.engine.simulation import CHUNK_S, Simulation
from rackSim.workload.jsonl import save_jsonl
from rackSim.workload.sources import load_sessions

scenarios = st.fixed_dictionaries({
    "concurrency": st.integers(1, 10),
    "sessions": st.integers(1, 5),
    "router": st.sampled_from(["round_robin", "least_loaded", "session_affinity",
                               "prefix_affinity"]),
    "mode": st.sampled_from(["push", "pull"]),
    "cap": st.sampled_from([None, 1, 4]),
    "accepted": st.sampled_from([1.0, 2.5, 3.25, 4.0]),
    "warmup": st.integers(0, 2),
    "primer": st.booleans(),
    "start": st.sampled_from(["steady", "fresh"]),
    "seed": st.integers(0, 2**16),
    "source": st.sampled_from(["synthetic", "agentx", "jsonl"]),
    "host_offload": st.booleans(),
})

def _cfg(base, p, pool_dir: Path | None = None):
    source = p["source"]
    workload = {"num_sessions": p["sessions"], "source": source, "synthetic": SMALL_SYNTHETIC,
                "replay": {"concurrency": p["concurrency"], "warmup_requests_per_lane":
                           p["warmup"], "primer": p["primer"],
                           "start": p.get("start", "steady"), "window_s": 5.0,
                           "drain_s": 600.0}}
    if source == "jsonl":  # a pool written from generated sessions, replayed from the file
        gen = with_changes(base, seed=p["seed"], workload={**workload, "source": "synthetic"})
        path = (pool_dir or Path(".")) / f"pool-{p['seed']}-{p['sessions']}.jsonl"
        save_jsonl(load_sessions(gen.workload, gen.seed), path)
        workload["path"] = str(path)
    return with_changes(
        base, seed=p["seed"], trace_tokens=True,
        deployment={"router": p["router"], "kv_transfer": {"mode": p["mode"]},
                    "cache": {"host_offload": p["host_offload"]},
                    "decode": {"kv_load_cap_per_step": p["cap"], "speculative": {
                        "accepted_tokens_per_step": p["accepted"]}}},
        workload=workload)


def _run(cfg, sessions=None):
    sim = Simulation(cfg, sessions or load_sessions(cfg.workload, cfg.seed))
    out = sim.run(progress=False)
    return sim, out


def _check(sessions, sim, out) -> None:
    """The invariants every run keeps, closed or open loop."""
    recs = out.requests
    # No request lost or duplicated: each (replay, request) sent once, and all finished after
    # the drain (nothing is sent after the window, so the drain empties the system).
    keys = [(r.session_key, r.rid) for r in recs]
    assert len(keys) == len(set(keys))
    assert sim.clients.in_flight == 0
    assert all(not math.isnan(r.finish_s) for r in recs)
    # Tokens conserved: every token each request asked for was emitted once, and the decode
    # step rows account for exactly the same total.
    assert all(len(r.token_times_s) == r.output_tokens for r in recs)
    emitted = sum(s[7] for s in out.steps if s[0] == "decode")
    assert emitted == pytest.approx(sum(r.output_tokens for r in recs), rel=1e-9)
    assert all(0 <= r.cached_tokens < r.prompt_tokens for r in recs)
    # Causality: stages in order, token times monotonic and bracketed by first/last token.
    for r in recs:
        stages = [r.send_s, r.prefill_start_s, r.prefill_end_s, r.kv_ready_s,
                  r.decode_start_s, r.first_token_s, r.finish_s]
        assert stages == sorted(stages), r
        t = r.token_times_s
        assert t == sorted(t)
        assert t[0] == r.first_token_s and t[-1] == r.finish_s
    # A request is sent only after everything it waits on finished, plus its delay.
    by_key = {(r.session_key, r.rid): r for r in recs}
    graphs = {g.session_id: g for g in sessions}
    for r in recs:
        spec = graphs[r.session_id].requests[r.rid]
        for dep in spec.after:
            d = by_key.get((r.session_key, dep))
            if d is not None:  # deps before a lane's (random) starting turn were not replayed
                assert r.send_s >= d.finish_s + spec.delay_s - 1e-9


@settings(max_examples=1000 if DEEP else 25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(p=scenarios)
def test_invariants(smoke_cfg, tmp_path, p):
    cfg = _cfg(smoke_cfg, p, tmp_path)
    sessions = load_sessions(cfg.workload, cfg.seed)
    sim, out = _run(cfg, sessions)
    assert len(out.requests) >= p["concurrency"]  # every lane sent at least once
    _check(sessions, sim, out)


overlap = st.fixed_dictionaries({
    "concurrency": st.integers(1, 12),
    "router": st.sampled_from(["least_loaded", "prefix_affinity"]),
    "mode": st.sampled_from(["push", "pull"]),
    "prefill_dbo": st.booleans(),
    "decode_dbo": st.booleans(),
    "decode_threshold": st.sampled_from([2, 8, 32]),
    "prefill_threshold": st.sampled_from([2, 512]),
    "seed": st.integers(0, 2**16),
})


def _overlap_cfg(p):
    syn = {**SMALL_SYNTHETIC, "max_context_tokens": 32768}
    dbo = {"decode_token_threshold": p["decode_threshold"],
           "prefill_token_threshold": p["prefill_threshold"]}
    return with_changes(
        moe_scenario(), seed=p["seed"], trace_tokens=True,
        deployment={"router": p["router"], "kv_transfer": {"mode": p["mode"]},
                    "prefill": {"dbo": {**dbo, "enabled": p["prefill_dbo"]}},
                    "decode": {"dbo": {**dbo, "enabled": p["decode_dbo"]}}},
        workload={"num_sessions": 4, "synthetic": syn,
                  "replay": {"concurrency": p["concurrency"], "warmup_requests_per_lane": 0,
                             "window_s": 5.0, "drain_s": 600.0}})


@settings(max_examples=1000 if DEEP else 8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(p=overlap)
def test_invariants_with_dual_batch_overlap(p):
    """A model served with DeepEP kernels, dual-batch overlap on or off per instance, at
    thresholds low enough that decode steps split too: the same invariants, and steps that
    run without events (a split decode step is priced afresh each step, never repeated) as
    they would with one each."""
    cfg = _overlap_cfg(p)
    sessions = load_sessions(cfg.workload, cfg.seed)
    sim, out = _run(cfg, sessions)
    _check(sessions, sim, out)
    assert_same_with_an_event_in_every_step(cfg)


traces = st.fixed_dictionaries({
    "trace": st.sampled_from(["mooncake_conversation", "azure_code"]),
    "offset_s": st.floats(0.0, 3000.0),
    "speedup": st.sampled_from([1.0, 4.0]),
    "router": st.sampled_from(["round_robin", "least_loaded", "session_affinity",
                               "prefix_affinity"]),
    "mode": st.sampled_from(["push", "pull"]),
    "cap": st.sampled_from([None, 4]),
    "host_offload": st.booleans(),
    "seed": st.integers(0, 2**16),
})


@functools.cache
def _trace_scenario(trace: str):
    return compose_scenario(["experiment=smoke", "progress=false", f"workload={trace}",
                             "workload.replay.window_s=5", "workload.replay.warmup_s=0",
                             "workload.replay.drain_s=600"])


@settings(max_examples=1000 if DEEP else 6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(p=traces)
def test_open_loop_trace_invariants(p):
    """Open loop: sessions of a real trace start at their (shifted, sped-up) arrival times."""
    cfg = with_changes(_trace_scenario(p["trace"]), seed=p["seed"], trace_tokens=True,
                       workload={"open_loop": {"offset_s": p["offset_s"],
                                               "speedup": p["speedup"]}},
                       deployment={
        "router": p["router"], "kv_transfer": {"mode": p["mode"]},
        "cache": {"host_offload": p["host_offload"]},
        "decode": {"kv_load_cap_per_step": p["cap"]}})
    sessions = _trace_sessions(p["trace"], p["seed"] % 8)
    try:
        sim, out = _run(cfg, sessions)
    except ScenarioError as err:  # refused only when no request arrives in the 5-s window
        assert "workload.replay.window_s=5: no request of the trace arrives" in str(err)
        sends = ((g.start_s - p["offset_s"]) / p["speedup"] for g in sessions)
        assert not any(0 <= t < 5 for t in sends)
        return
    _check(sessions, sim, out)


@functools.cache
def _trace_sessions(trace: str, seed: int):
    """A trace's sessions (arrival jitter drawn with `seed`), loaded once per trace and seed:
    reading a whole trace costs more than simulating a 5-s window of it."""
    cfg = _trace_scenario(trace)
    return load_sessions(cfg.workload, seed)


@settings(max_examples=1000 if DEEP else 5, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(p=scenarios)
def test_same_seed_same_result(smoke_cfg, tmp_path, p):
    cfg = _cfg(smoke_cfg, p, tmp_path)
    a, b = _run(cfg)[1], _run(cfg)[1]
    assert [r.as_row() for r in a.requests] == [r.as_row() for r in b.requests]
    assert a.steps == b.steps
    assert (a.itl.weights == b.itl.weights).all()


@settings(max_examples=1000 if DEEP else 8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(p=scenarios)
def test_steps_run_without_events_as_they_would_with_one_each(smoke_cfg, tmp_path, p):
    assert_same_with_an_event_in_every_step(_cfg(smoke_cfg, p, tmp_path))


def test_a_lone_agent_decodes_with_few_events(smoke_cfg):
    """One client: while a request decodes nothing else happens, so its steps run without
    events (one per request and step with a tick in every step)."""
    cfg = with_changes(smoke_cfg, workload={"replay": {"concurrency": 1, "window_s": 30.0}})
    fused, ticked, ticks = assert_same_with_an_event_in_every_step(cfg)
    decode_steps = sum(1 for s in fused.steps if s[0] == "decode")
    assert decode_steps > 20 * len(fused.requests)
    assert fused.events < 0.2 * (ticked.events - ticks)


def test_different_seed_differs(smoke_cfg):
    base = _cfg(smoke_cfg, {"concurrency": 4, "sessions": 3, "router": "prefix_affinity",
                            "mode": "push", "cap": 4, "accepted": 3.25, "warmup": 1,
                            "primer": True, "seed": 1, "source": "synthetic",
                            "host_offload": True})
    a = _run(base)[1]
    b = _run(with_changes(base, seed=2))[1]
    assert [r.send_s for r in a.requests] != [r.send_s for r in b.requests]


@pytest.mark.parametrize("enabled", [True, False])
def test_run_leaves_the_garbage_collector_as_it_found_it(smoke_cfg, enabled):
    """The run turns automatic collection off and restores the caller's setting, also when
    interrupted."""
    cfg = with_changes(smoke_cfg, workload={"replay": {"window_s": 5.0}})
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        _run(cfg)
        assert gc.isenabled() is enabled
        sim = Simulation(cfg, load_sessions(cfg.workload, cfg.seed))

        def interrupt(_event):
            raise KeyboardInterrupt

        sim.env.timeout(1.0).callbacks.append(interrupt)
        out = sim.run(progress=False)
        assert out.partial and gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_ctrl_c_stops_at_a_chunk_boundary_and_gives_the_handler_back(smoke_cfg):
    """A real SIGINT mid-run ends the run as partial with its records consistent (every
    finished request finished inside the simulated time), and Ctrl-C is an exception again
    afterwards."""
    cfg = with_changes(smoke_cfg, workload={"replay": {"window_s": 60.0}})
    # Python's own handler, whatever earlier tests (Ray, kernels) left installed
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sim = Simulation(cfg, load_sessions(cfg.workload, cfg.seed))
        sim.env.timeout(2.0).callbacks.append(lambda _e: os.kill(os.getpid(), signal.SIGINT))
        out = sim.run(progress=False)
        assert out.partial
        assert out.sim_s < 2.0 + CHUNK_S  # stopped at the first chunk boundary after the press
        assert all(math.isnan(r.finish_s) or r.finish_s <= out.sim_s for r in out.requests)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
    finally:
        signal.signal(signal.SIGINT, outer)
