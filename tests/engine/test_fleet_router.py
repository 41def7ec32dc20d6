"""The global router's policies, as they show in the request records of small fleets."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from fleet_support import run_short_sessions


def _racks_per_session(recs):
    racks = defaultdict(set)
    for r in recs:
        racks[r.session_key].add(r.prefill_rack)
    return Counter(len(v) for v in racks.values())


def test_one_rack_has_nothing_to_choose(smoke_cfg):
    recs = run_short_sessions(smoke_cfg, concurrency=4)
    assert {r.route for r in recs} == {"single_rack"}
    assert {(r.prefill_rack, r.decode_rack, r.decode_instance) for r in recs} == {(0, 0, 0)}


def test_session_affinity_keeps_every_session_in_one_rack(smoke_cfg):
    recs = run_short_sessions(smoke_cfg, racks=3, fleet_router={"policy": "session_affinity"})
    assert set(_racks_per_session(recs)) == {1}
    assert {r.route for r in recs} <= {"affinity", "new_session"}
    assert {r.prefill_rack for r in recs} == {0, 1, 2}  # the primer spread lanes over racks


def test_at_light_load_new_sessions_spread_over_the_racks(smoke_cfg):
    """Two lanes per rack: the prefill queues are empty whenever a session starts, so least
    work ties; the decode occupancy breaks the tie. (Ties to the first rack put 689 / 377 /
    75 requests on the three racks; with the occupancy 489 / 395 / 286, and over seeds 0-2
    the busiest rack has at most 1.9x the requests of the idlest: sessions differ in length.)"""
    recs = run_short_sessions(smoke_cfg, concurrency=6, window_s=60.0, racks=3,
                fleet_router={"policy": "session_affinity"})
    per_rack = Counter(r.prefill_rack for r in recs)
    assert set(per_rack) == {0, 1, 2}
    assert max(per_rack.values()) <= 2.0 * min(per_rack.values()), per_rack
    new = Counter(r.prefill_rack for r in recs if r.route == "new_session")
    assert max(new.values()) <= 2.0 * min(new.values()), new


def test_a_saturated_rack_spills_sessions_to_another(smoke_cfg):
    recs = run_short_sessions(smoke_cfg, concurrency=48, racks=2,
                fleet_router={"policy": "session_affinity", "spill_tokens_per_gpu": 2000.0})
    routes = Counter(r.route for r in recs)
    assert routes["spill"] > 0
    assert max(_racks_per_session(recs)) > 1  # spilled sessions moved rack
    # a moved session's prefix stays where it was computed: its first request in the new
    # rack recomputes what the old rack had cached
    spilled = [r for r in recs if r.route == "spill"]
    assert sum(r.cached_tokens for r in spilled) < sum(r.prompt_tokens for r in spilled) / 2


def test_round_robin_alternates_racks(smoke_cfg):
    recs = sorted(run_short_sessions(smoke_cfg, racks=3, fleet_router={"policy": "round_robin"}),
                  key=lambda r: r.send_s)
    counts = Counter(r.prefill_rack for r in recs)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert {r.route for r in recs} == {"round_robin"}


@pytest.mark.parametrize("policy", ["least_work", "session_affinity"])
def test_new_sessions_start_only_in_entry_groups(smoke_cfg, policy):
    groups = [{"name": "main", "racks": 2}, {"name": "burst", "racks": 1}]
    recs = run_short_sessions(smoke_cfg, primer=False, racks=None, groups=groups,
                fleet_router={"policy": policy, "entry_groups": ["main"]})
    assert {r.prefill_rack for r in recs} == {0, 1}


def test_decode_spills_to_another_rack_only_when_allowed(smoke_cfg):
    tight = {"max_num_seqs_per_rank": 1}
    on = run_short_sessions(smoke_cfg, racks=2, decode=tight, fleet_router={"decode_spill": True})
    off = run_short_sessions(smoke_cfg, racks=2, decode=tight, fleet_router={"decode_spill": False})
    remote = [r for r in on if r.decode_rack != r.prefill_rack]
    assert remote and all(r.route.endswith("+decode_remote") for r in remote)
    assert all(r.decode_rack == r.prefill_rack for r in off)
