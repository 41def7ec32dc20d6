"""Colocated fleets (no P/D disaggregation): invariants on many small random fleets
(hypothesis), the mixed step's pricing, and the layout's error paths.

Invariants: no request lost or duplicated, every request prefilled and decoded by the same
instance on one rank, causality (send <= prefill start <= prefill end = first token <= finish,
token times in order), prefix hits in whole server blocks below the prompt, tokens conserved
(first tokens plus decode tokens of the step rows = output tokens asked), determinism per seed.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from fleet_support import (
    COLOCATED,
    DEEP,
    SMALL_SYNTHETIC,
    assert_same_run_twice,
    moe_scenario,
    run_sim,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rackSim.config import with_changes
from rackSim.metrics.summary import FleetLayout, summarize
from rackSim.perf import build_step_model
from rackSim.perf.step import DecodeBatch, PrefillBatch
from rackSim.run import decode_width, layout_name, simulate

fleets = st.fixed_dictionaries({
    "racks": st.integers(1, 2),
    "instances": st.integers(1, 2),
    "width": st.sampled_from([(2, "DEP"), (4, "DEP"), (2, "TP")]),
    "budget": st.sampled_from([40, 512, 4096]),
    "max_seqs": st.sampled_from([1, 2, 8]),
    "router": st.sampled_from(["round_robin", "least_loaded", "session_affinity",
                               "prefix_affinity"]),
    "fleet_policy": st.sampled_from(["round_robin", "least_work", "session_affinity",
                                     "prefix_affinity"]),
    "concurrency": st.integers(1, 12),
    "sessions": st.integers(1, 6),
    "primer": st.booleans(),
    "seed": st.integers(0, 2**16),
})


def _colocated(base, p=None, colocated=None, **workload):
    """`base` as a colocated fleet drawn by `p` (`fleets`); `colocated`: more settings of its
    instances."""
    p = p or {"racks": 1, "instances": 1, "width": (4, "DEP"), "budget": 4096, "max_seqs": 8,
              "router": "prefix_affinity", "fleet_policy": "session_affinity",
              "concurrency": 8, "sessions": 6, "primer": True, "seed": 0}
    width, par = p["width"]
    col = dict(COLOCATED, instances=p["instances"], gpus=width, parallelism=par,
               max_num_batched_tokens=p["budget"], max_num_seqs_per_rank=p["max_seqs"],
               **(colocated or {}))
    return with_changes(
        base, seed=p["seed"], trace_tokens=True,
        deployment={"racks": p["racks"], "router": p["router"],
                    "fleet_router": {"policy": p["fleet_policy"]},
                    "prefill": {"instances": 0}, "decode": {"instances": 0}, "colocated": col},
        workload={"num_sessions": p["sessions"], "source": "synthetic",
                  "synthetic": SMALL_SYNTHETIC,
                  "replay": {"concurrency": p["concurrency"], "warmup_requests_per_lane": 1,
                             "primer": p["primer"], "window_s": 5.0, "drain_s": 600.0,
                             **workload}})


@settings(max_examples=1000 if DEEP else 15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(p=fleets)
def test_colocated_invariants(smoke_cfg, p):
    _check(_colocated(smoke_cfg, p))


@settings(max_examples=1000 if DEEP else 6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(p=fleets, threshold=st.sampled_from([2, 64, 512]))
def test_colocated_invariants_with_dual_batch_overlap(p, threshold):
    """The same invariants when colocated DEP4 instances of a model on DeepEP kernels
    (Qwen3-235B on H200) run their steps as two microbatches wherever every rank holds the
    threshold's tokens (mixed steps: `prefill_token_threshold`, decode-only steps:
    `decode_token_threshold`)."""
    dbo = {"enabled": True, "decode_token_threshold": threshold,
           "prefill_token_threshold": threshold}
    _check(_colocated(moe_scenario(), {**p, "width": (4, "DEP")}, {
        "dbo": dbo, "speculative": {"num_draft_tokens": 0, "accepted_tokens_per_step": 1}}))


def _check(cfg) -> None:
    """Run `cfg` (a colocated fleet) and check the module's invariants."""
    sim, out = run_sim(cfg)
    recs = [r for r in out.requests if r.phase != "primer"]
    assert recs
    keys = [(r.session_key, r.rid) for r in recs]
    assert len(keys) == len(set(keys))
    assert sim.clients.in_flight == 0
    instances = {c.index: c for c in sim.fleet.colocated}
    assert not sim.prefills and not sim.decodes and sim.transfer.bytes_moved == 0
    for r in recs:
        inst = instances[r.prefill_instance]
        assert r.decode_instance == r.prefill_instance
        assert inst.rack == r.prefill_rack == r.decode_rack
        assert 0 <= r.decode_rank < inst.ranks
        assert r.send_s <= r.prefill_start_s <= r.prefill_end_s == r.first_token_s <= r.finish_s
        assert r.token_times_s == sorted(r.token_times_s)
        assert r.token_times_s[0] == r.first_token_s and r.token_times_s[-1] == r.finish_s
        assert len(r.token_times_s) == r.output_tokens
        assert r.cached_tokens % 64 == 0 and 0 <= r.cached_tokens <= r.prompt_tokens - 1
        assert r.kv_bytes_moved == 0
    # every instance's caches and slots are back to empty after the drain
    for inst in instances.values():
        assert inst.queued_tokens == 0 and not inst.running and not inst._busy
        assert all(c.gpu.pinned == 0 for c in inst.tiers)
        assert inst.free_slots == inst.ranks * inst.max_seqs
    # tokens conserved: first tokens + decode tokens of every step = output tokens asked
    emitted = sum(s[7] + s[9] for s in out.steps if s[0].startswith("colocated"))
    assert emitted == pytest.approx(sum(r.output_tokens for r in out.requests
                                        if r.phase != "primer"), rel=1e-9)
    prefilled = sum(s[5] for s in out.steps)
    assert prefilled == sum(r.prompt_tokens - r.cached_tokens for r in recs)
    # per-rack tables add up to the fleet; each instance reports its ITL
    res = summarize(out.requests, out.steps, out.itl, out.window_start_s, out.window_end_s,
                    out.num_gpus, cfg.pricing,
                    fleet=FleetLayout(out.instance_racks, out.rack_gpus, out.decode_itl))
    assert res.racks["gpus"].sum() == cfg.deployment.num_gpus
    assert set(res.instances["role"]) <= {"colocated"}
    assert res.racks["requests"].sum() == res.summary["requests_sent"]
    assert out.itl.total == pytest.approx(sum(h.total for h in out.decode_itl.values()))


@settings(max_examples=1000 if DEEP else 4, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(p=fleets)
def test_same_seed_same_colocated_result(smoke_cfg, p):
    assert_same_run_twice(_colocated(smoke_cfg, p))


def test_colocated_and_disaggregated_both_conserve_tokens(smoke_cfg):
    """The same small workload on the smoke layout (P2xDEP2+DEP4, 8 GPUs) and on two
    colocated DEP4 instances (8 GPUs): both finish every request and emit every token;
    colocated decode steps carry prefill chunks, so its ITL P90 is longer."""
    small = {"window_s": 30.0}
    col = _colocated(smoke_cfg, {"racks": 1, "instances": 2, "width": (4, "DEP"),
                                 "budget": 4096, "max_seqs": 8, "router": "prefix_affinity",
                                 "fleet_policy": "session_affinity", "concurrency": 12,
                                 "sessions": 6, "primer": True, "seed": 3}, **small)
    dis = with_changes(smoke_cfg, seed=3, trace_tokens=True, workload=col.workload.model_dump())
    results = {}
    for name, cfg in (("colocated", col), ("disaggregated", dis)):
        assert cfg.deployment.num_gpus == 8
        res = simulate(cfg, progress=False)
        req = res.requests[res.requests["phase"] != "primer"]
        assert req["finish_s"].notna().all(), name
        assert (req["token_times_s"].map(len) == req["output_tokens"]).all(), name
        results[name] = res.summary
    assert results["colocated"]["itl_p90_ms"] > results["disaggregated"]["itl_p90_ms"]
    assert layout_name(col.deployment) == "C2xDEP4"
    assert results["colocated"]["decode_gpus"] == decode_width(col.deployment) == 4


def test_decode_width_of_a_colocated_layout_is_its_instances(smoke_cfg):
    """The summary's decode_gpus is the width of the instances that decode: a colocated
    layout's, not the unused decode section's (4 in the smoke scenario)."""
    col = _colocated(smoke_cfg, {"racks": 1, "instances": 2, "width": (2, "DEP"),
                                 "budget": 4096, "max_seqs": 8, "router": "prefix_affinity",
                                 "fleet_policy": "session_affinity", "concurrency": 8,
                                 "sessions": 6, "primer": True, "seed": 0})
    assert col.deployment.decode.gpus == 4 and decode_width(col.deployment) == 2
    assert decode_width(smoke_cfg.deployment) == 4


# -- the mixed step -------------------------------------------------------------------------------
def _batches(cfg, prefill_tokens: int, decode_reqs: int):
    ranks = cfg.deployment.colocated.gpus
    reqs = [decode_reqs] * ranks
    decode = DecodeBatch(reqs, [30000.0 * decode_reqs] * ranks, 3.25, 3, 0, 0, 7)
    prefill = PrefillBatch(new_tokens=prefill_tokens, attended_tokens=prefill_tokens + 20000,
                           num_requests=max(prefill_tokens // 4096, 1), admitted_prompt_tokens=0,
                           ranks=ranks)
    return prefill, decode


@pytest.mark.parametrize("perf", ["calibrated", "roofline"])
def test_mixed_step_shares_weights_and_launches(smoke_cfg, perf):
    """Decode alone is the decode step; prefill alone the prefill step; together, more than
    either part (more tokens, more attention) and less than both apart (weights and per-call
    costs paid once). Calibrated at fixed balancedness, without the straggler draw."""
    cfg = _colocated(smoke_cfg)
    cfg = with_changes(cfg, perf={"model": perf})

    def model():
        m = build_step_model(cfg, "colocated")
        if perf == "calibrated":
            m._fixed_b = (1.0, 1.0)
        return m

    def ms(cost):
        return cost.total_ms - cost.straggler

    prefill, decode = _batches(cfg, 16384, 16)
    empty_p, _ = _batches(cfg, 0, 16)
    _, empty_d = _batches(cfg, 16384, 0)
    assert ms(model().mixed_step(empty_p, decode)) == pytest.approx(
        ms(model().decode_step(decode)))
    alone_p = ms(model().mixed_step(prefill, empty_d))
    assert alone_p == pytest.approx(ms(model().prefill_step(prefill)))
    alone_d = ms(model().decode_step(decode))
    both = ms(model().mixed_step(prefill, decode))
    assert max(alone_p, alone_d) < both < alone_p + alone_d


def test_busiest_rank_sets_the_per_rank_parts(smoke_cfg):
    """A prefill chunk on one rank of four costs that rank's attention and GEMMs in full: the
    step is longer than the same tokens spread evenly."""
    cfg = _colocated(smoke_cfg)
    m = build_step_model(cfg, "colocated")
    m._fixed_b = (1.0, 1.0)
    prefill, decode = _batches(cfg, 8192, 4)
    even = m.mixed_step(prefill, decode)
    one = m.mixed_step(replace(prefill, busiest_rank_tokens=8192), decode)
    assert one.attention > even.attention and one.dense > even.dense
    assert one.moe == pytest.approx(even.moe)


# -- bad layouts ---------------------------------------------------------------------------------
def test_colocated_and_pd_instances_do_not_mix(smoke_cfg):
    """One layout (`experiment=smoke deployment=colocated_dep16` is the usual way in): the
    message names the overrides that mend it, and they do. A fleet's group is named."""
    with pytest.raises(ValueError, match=r"colocated.instances=1 but the deployment also has "
                                         r"2 prefill and 1 decode instances .*add "
                                         r"deployment.prefill.instances=0 "
                                         r"deployment.decode.instances=0, or set "
                                         r"deployment.colocated.instances=0"):
        with_changes(smoke_cfg, deployment={"colocated": COLOCATED})
    mended = with_changes(smoke_cfg, deployment={"colocated": COLOCATED, "prefill": {
        "instances": 0}, "decode": {"instances": 0}})
    assert mended.deployment.is_colocated
    with pytest.raises(ValueError, match=r"colocated.instances: rack group\(s\) \['b'\] also "
                                         r"have prefill or decode instances; a fleet either "
                                         r"disaggregates or colocates"):
        with_changes(smoke_cfg, deployment={
            "colocated": COLOCATED, "prefill": {"instances": 0}, "decode": {"instances": 0},
            "racks": None, "groups": [{"name": "a", "racks": 1},
                                      {"name": "b", "racks": 1, "prefill": {"instances": 1}}]})


def test_budget_must_leave_room_for_prefill(smoke_cfg):
    col = dict(COLOCATED, max_num_batched_tokens=32)  # 8 requests x (1 + 3 drafts)
    with pytest.raises(ValueError, match=r"colocated.max_num_batched_tokens=32: a full batch "
                                         r"of 8 decoding requests takes 32 tokens"):
        with_changes(smoke_cfg, deployment={"prefill": {"instances": 0},
                                            "decode": {"instances": 0}, "colocated": col})


def test_colocated_instances_must_fit_the_rack(smoke_cfg):
    col = dict(COLOCATED, instances=3, gpus=32)
    with pytest.raises(ValueError, match=r"deployment.prefill/decode: one rack's layout needs "
                                         r"96 GPUs .*3 colocated x 32"):
        with_changes(smoke_cfg, deployment={"prefill": {"instances": 0},
                                            "decode": {"instances": 0}, "colocated": col})


def test_colocated_width_must_spread_the_experts(smoke_cfg):
    col = dict(COLOCATED, gpus=3)
    with pytest.raises(ValueError, match=r"deployment.colocated.gpus=3: .* cannot be spread"):
        with_changes(smoke_cfg, deployment={"prefill": {"instances": 0},
                                            "decode": {"instances": 0}, "colocated": col})


def test_fleet_without_any_instance_is_refused(smoke_cfg):
    with pytest.raises(ValueError, match=r"prefill.instances: the fleet has no prefill "
                                         r"instance.*colocated.instances"):
        with_changes(smoke_cfg, deployment={"prefill": {"instances": 0}})


def test_colocated_step_model_needs_the_layout(smoke_cfg):
    from rackSim.perf.calibrated import CalibratedStepModel

    with pytest.raises(ValueError, match=r"deployment.colocated: a colocated step model"):
        CalibratedStepModel(smoke_cfg, "colocated")
    assert math.isfinite(build_step_model(_colocated(smoke_cfg), "colocated")
                         .mixed_step(*_batches(_colocated(smoke_cfg), 4096, 2)).total_ms)


def test_a_context_ending_on_a_block_keeps_that_block_out_of_reuse():
    """A finished request leaves its context reusable but for its last sampled token, whose KV
    is never computed: a context of whole blocks loses its last block (the node's count drops,
    or the node goes when that was its only block); any other length keeps every full block."""
    from rackSim.workload.graph import computed_path

    path = ((7, 3), (9, 2))
    assert computed_path(path, 5 * 64 + 10) == path
    assert computed_path(path, 5 * 64) == ((7, 3), (9, 1))
    assert computed_path(((7, 3), (9, 1)), 4 * 64) == ((7, 3),)
    assert computed_path((), 0) == ()
