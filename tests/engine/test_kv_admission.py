"""Decode admission in the engine: what each step admits per DP rank, the pull stall it pays
(asked of perf/kv_transfer.py), and the per-rank KV-load cap."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from rackSim.config import with_changes
from rackSim.engine.simulation import Simulation
from rackSim.perf.kv_transfer import decode_stall_ms, kv_blocks
from rackSim.workload.sources import load_sessions


def _sim(cfg):
    return Simulation(cfg, load_sessions(cfg.workload, cfg.seed))


def _busy(smoke_cfg, **deployment):
    """The smoke slice with enough clients that several KV loads arrive in one step."""
    return with_changes(smoke_cfg, deployment=deployment, workload={
        "num_sessions": 100, "replay": {"concurrency": 300, "window_s": 20.0}})


def test_the_pull_stall_of_a_step_is_the_perf_models_for_what_it_admits(smoke_cfg):
    cfg = _busy(smoke_cfg, kv_transfer={"mode": "pull"})
    sim = _sim(cfg)
    out = sim.run(progress=False)
    # requests admitted by each decode step, by rank (admission happens at the step's start)
    by_step: dict[float, dict[int, list]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for r in out.requests:
        if r.phase != "primer" and r.decode_start_s == r.decode_start_s:  # not NaN
            acc = by_step[r.decode_start_s][r.decode_rank]
            acc[0] += kv_blocks(round(r.kv_bytes_moved / cfg.model.kv_bytes_per_token))
            acc[1] += r.kv_bytes_moved
    s = cfg.deployment.kv_transfer
    steps = [row for row in out.steps if row[0] == "decode" and row[9] > 0]
    assert len(steps) > 100
    multi = 0
    for row in steps:
        reads = by_step[row[2]]
        multi += len(reads) > 1
        want = decode_stall_ms(reads.values(), cfg.model.num_layers, sim.transfer.bandwidth(),
                               s.descriptor_latency_us / 1e3, s.descriptor_post_us / 1e3,
                               s.post_threads, s.descriptors_in_flight)
        assert row[-1] == pytest.approx(want, rel=1e-12)  # kv_stall_ms
    assert multi > 10  # steps where several ranks read: the stall is their max


def test_push_stalls_nothing_and_hands_each_ranks_admissions_to_the_step_model(smoke_cfg):
    cfg = _busy(smoke_cfg)
    sim = _sim(cfg)
    seen = []
    price = sim.decodes[0].model.decode_step

    def record(batch):
        seen.append((batch.new_loads, batch.admitted_prompt_tokens,
                     tuple(batch.rank_admissions)))
        return price(batch)

    sim.decodes[0].model.decode_step = record
    out = sim.run(progress=False)
    assert all(row[-1] == 0.0 for row in out.steps if row[0] == "decode")
    admitting = [s for s in seen if s[0]]
    assert len(admitting) > 100
    for loads, tokens, ranks in admitting:
        assert sum(r[0] for r in ranks) == loads
        assert sum(r[1] for r in ranks) == tokens
    assert all(not s[2] for s in seen if not s[0])


@pytest.mark.parametrize("cap", [1, 4])
def test_the_kv_load_cap_applies_to_each_ranks_scheduler(smoke_cfg, cap):
    cfg = _busy(smoke_cfg, decode={"kv_load_cap_per_step": cap})
    out = _sim(cfg).run(progress=False)
    admitted = [r for r in out.requests if r.phase != "primer"
                and r.decode_start_s == r.decode_start_s]
    per_rank = Counter((r.decode_start_s, r.decode_rank) for r in admitted)
    per_step = Counter(r.decode_start_s for r in admitted)
    assert max(per_rank.values()) == cap
    # the instance admits more than `cap` in one step: each of its 4 ranks admits up to `cap`
    assert cap < max(per_step.values()) <= 4 * cap


def test_a_full_instance_refills_every_freed_slot(smoke_cfg):
    """Each DP rank admits its own ready requests into its free slots, as vLLM's per-rank
    schedulers do: with far more clients than slots (16 ranks of 2, 1,500 clients) every
    step of the run's second half holds all 32 slots. (One FIFO scan over every rank's
    requests that gave up after 64 skipped ones held 27.6 on average, full in 0.4 % of the
    steps.) And a rank takes its requests in the order their KV arrived."""
    cfg = with_changes(smoke_cfg, deployment={"decode": {"gpus": 16, "max_num_seqs_per_rank": 2}},
                       workload={"num_sessions": 200,
                                 "replay": {"concurrency": 1500, "window_s": 20.0,
                                            "drain_s": 0.0}})  # no drain's emptying steps
    out = _sim(cfg).run(progress=False)
    steps = out.steps.frame()
    decode = steps[steps["instance"] == "decode"]
    late = decode[decode["start_s"] > decode["start_s"].max() / 2]
    assert len(late) > 1000 and (late["decode_requests"] == 32).all()
    by_rank = defaultdict(list)
    for r in out.requests:
        if r.decode_start_s == r.decode_start_s:  # admitted (not NaN)
            by_rank[r.decode_rank].append((r.kv_ready_s, r.decode_start_s))
    assert len(by_rank) == 16
    for admitted in by_rank.values():
        starts = [start for _, start in sorted(admitted)]
        assert starts == sorted(starts)
