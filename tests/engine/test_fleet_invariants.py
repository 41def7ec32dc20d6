"""Fleet invariants, checked on many small random fleets (hypothesis).

No request lost or duplicated across racks, tokens conserved per decode instance and over the
fleet, placement consistent (a record's rack and instance ids agree with each other and with the
KV that crossed racks), per-rack tables adding up to the fleet, determinism per seed.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from fleet_support import (
    DEEP,
    SMALL_SYNTHETIC,
    assert_same_run_twice,
    assert_same_with_an_event_in_every_step,
    run_sim,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rackSim.config import with_changes
from rackSim.metrics.summary import FleetLayout, summarize

fleets = st.fixed_dictionaries({
    "layout": st.sampled_from(["racks", "groups", "split"]),
    "racks": st.integers(1, 3),
    "decode_instances": st.integers(1, 2),
    "policy": st.sampled_from(["round_robin", "least_work", "session_affinity",
                               "prefix_affinity"]),
    "spill": st.sampled_from([None, 1.0, 4096.0]),
    "decode_spill": st.booleans(),
    "max_seqs": st.sampled_from([1, 2, 96]),
    "mode": st.sampled_from(["push", "pull"]),
    "concurrency": st.integers(1, 12),
    "sessions": st.integers(1, 6),
    "primer": st.booleans(),
    "seed": st.integers(0, 2**16),
})


def _cfg(base, p):
    dep: dict = {"fleet_router": {"policy": p["policy"], "spill_tokens_per_gpu": p["spill"],
                                  "decode_spill": p["decode_spill"]},
                 "kv_transfer": {"mode": p["mode"]},
                 "decode": {"instances": p["decode_instances"],
                            "max_num_seqs_per_rank": p["max_seqs"]}}
    if p["layout"] == "racks":
        dep["racks"] = p["racks"]
        return _with(base, p, dep)
    dep["racks"] = None  # the groups' sum
    if p["layout"] == "groups":
        dep["groups"] = [{"name": "a", "racks": p["racks"]},
                         {"name": "b", "racks": 1, "prefill": {"instances": 1},
                          "decode": {"instances": 1}}]
    else:  # prefill racks and decode racks: every KV crosses racks
        dep["groups"] = [{"name": "p", "racks": p["racks"], "decode": {"instances": 0}},
                         {"name": "d", "racks": 1, "prefill": {"instances": 0}}]
    return _with(base, p, dep)


def _with(base, p, dep):
    return with_changes(
        base, seed=p["seed"], trace_tokens=True, deployment=dep,
        workload={"num_sessions": p["sessions"], "source": "synthetic",
                  "synthetic": SMALL_SYNTHETIC,
                  "replay": {"concurrency": p["concurrency"], "warmup_requests_per_lane": 1,
                             "primer": p["primer"], "window_s": 5.0, "drain_s": 600.0}})


@settings(max_examples=1000 if DEEP else 15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(p=fleets)
def test_fleet_invariants(smoke_cfg, p):
    cfg = _cfg(smoke_cfg, p)
    sim, out = run_sim(cfg)
    recs = [r for r in out.requests if r.phase != "primer"]
    n_racks = cfg.deployment.num_racks
    assert len(sim.racks) == n_racks
    # no request lost or duplicated across racks: each sent once, all finished after the drain
    keys = [(r.session_key, r.rid) for r in recs]
    assert len(keys) == len(set(keys))
    assert sim.clients.in_flight == 0
    assert all(not math.isnan(r.finish_s) for r in recs)
    # placement: ids in range and consistent with each other
    decodes = {d.index: d for d in sim.decodes}
    for r in recs:
        assert 0 <= r.prefill_rack < n_racks and 0 <= r.decode_rack < n_racks
        assert sim.racks[r.prefill_rack].prefills  # prefilled where prefill instances are
        assert r.prefill_instance in {i.index for i in sim.racks[r.prefill_rack].prefills}
        assert decodes[r.decode_instance].rack == r.decode_rack
        assert 0 <= r.decode_rank < decodes[r.decode_instance].ranks
        assert r.route.endswith("+decode_remote") == (r.decode_rack != r.prefill_rack)
        if not p["decode_spill"] and sim.racks[r.prefill_rack].decodes:
            assert r.decode_rack == r.prefill_rack
        if p["layout"] == "split":
            assert r.decode_rack != r.prefill_rack
    # the KV that crossed racks is exactly what the records say crossed
    crossed = sum(r.kv_bytes_moved for r in out.requests if r.decode_rack != r.prefill_rack)
    assert sim.transfer.bytes_cross_rack == pytest.approx(crossed, rel=1e-12, abs=1e-6)
    # tokens conserved: every token emitted once, by the instance that decoded the request
    assert all(len(r.token_times_s) == r.output_tokens for r in recs)
    emitted: dict[str, float] = defaultdict(float)
    for s in out.steps:
        if s[0].startswith("decode"):
            emitted[s[0]] += s[7]
    asked: dict[str, float] = defaultdict(float)
    for r in recs:
        asked[decodes[r.decode_instance].name] += r.output_tokens
    assert set(asked) <= set(emitted)
    for name, n in emitted.items():
        assert n == pytest.approx(asked.get(name, 0.0), rel=1e-9), name
    # per-rack tables add up to the fleet (input credited where prefilled, output where
    # decoded, each over its rack's GPUs)
    res = summarize(out.requests, out.steps, out.itl, out.window_start_s, out.window_end_s,
                    out.num_gpus, cfg.pricing,
                    fleet=FleetLayout(out.instance_racks, out.rack_gpus, out.decode_itl))
    racks = res.racks
    assert list(racks["rack"]) == list(range(n_racks))
    assert racks["gpus"].sum() == cfg.deployment.num_gpus
    window = out.window_end_s - out.window_start_s
    tokens = (racks["throughput_tok_s_gpu"] * racks["gpus"]).sum() * window
    assert tokens == pytest.approx(res.summary["throughput_tok_s_gpu"] * out.num_gpus * window,
                                   rel=1e-9, abs=1e-6)
    assert racks["requests"].sum() == res.summary["requests_sent"]
    assert racks["requests_decoded"].sum() == res.summary["requests_sent"]
    assert out.itl.total == pytest.approx(sum(h.total for h in out.decode_itl.values()))


@settings(max_examples=1000 if DEEP else 4, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(p=fleets)
def test_same_seed_same_fleet_result(smoke_cfg, p):
    assert_same_run_twice(_cfg(smoke_cfg, p))


@settings(max_examples=1000 if DEEP else 5, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(p=fleets)
def test_fleet_steps_run_without_events_as_they_would_with_one_each(smoke_cfg, p):
    """Several decode instances: each runs its steps without events only until the next
    event of any other (engine/decode.py)."""
    assert_same_with_an_event_in_every_step(_cfg(smoke_cfg, p))
