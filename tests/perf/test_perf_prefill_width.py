"""DEP4 vs DEP2 prefill at equal work per GPU: the wider instance loses more per GPU, and the
loss is the named parts of the step (issue 10, item 4c). Nothing here is fitted to the
effect size: the all-to-all, EPLB, DP-sync and straggler terms are the calibrated profile's."""

from __future__ import annotations

import pytest

from rackSim.calibrate.figures import expected
from rackSim.calibrate.scenario import DEFAULT_PROFILE, operating_point
from rackSim.config import with_changes
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.comm import COMBINE_BYTES, DISPATCH_BYTES
from rackSim.perf.cpu import max_delay_moments
from rackSim.perf.profile import Profile
from rackSim.perf.step import PrefillBatch, StepBreakdown

PROFILE = Profile.load(DEFAULT_PROFILE)
TOKENS_PER_RANK, REQUESTS_PER_RANK, CACHED = 16384, 16, 4096
PARTS = ("moe", "attention", "indexer", "dense", "comm", "draft", "cpu", "sync", "straggler",
         "kv_stall")


def _steady_model(width: int, profile: Profile = PROFILE) -> CalibratedStepModel:
    """A DEPn prefill instance at its steady-state EPLB balancedness (between two
    rearrangements), so every step of the comparison sees the same balancedness."""
    cfg = operating_point(prefill_gpus=width, profile=DEFAULT_PROFILE)
    interval = cfg.deployment.eplb.interval_steps
    b = CalibratedStepModel(cfg, "prefill", profile=profile).balancedness(
        2 * interval + interval // 2)[0]
    return CalibratedStepModel(cfg, "prefill", profile=profile, balancedness=(b, 1.0))


def _step(model: CalibratedStepModel) -> StepBreakdown:
    w = model.ranks
    n = REQUESTS_PER_RANK * w
    new = TOKENS_PER_RANK // REQUESTS_PER_RANK
    batch = PrefillBatch(new_tokens=TOKENS_PER_RANK * w, attended_tokens=(CACHED + new) * n,
                         num_requests=n, admitted_prompt_tokens=0, ranks=w)
    return expected(model.prefill_step(batch), model)


def test_dep4_loses_more_per_gpu_than_dep2_and_the_parts_say_why() -> None:
    m2, m4 = _steady_model(2), _steady_model(4)
    s2, s4 = _step(m2), _step(m4)
    tok2, tok4 = (TOKENS_PER_RANK / s.total_ms * 1e3 for s in (s2, s4))
    assert tok4 < tok2
    assert 0.90 < tok4 / tok2 < 0.99  # a few percent per GPU, not a different regime
    diff = {k: getattr(s4, k) - getattr(s2, k) for k in PARTS}
    assert sum(diff.values()) == pytest.approx(s4.total_ms - s2.total_ms, abs=1e-9)
    # Same per-rank GEMM and attention work at equal tokens per rank.
    for k in ("attention", "indexer", "dense", "cpu"):
        assert diff[k] == pytest.approx(0.0, abs=1e-9), k
    # (i) all-to-all: DeepEP's normal kernels send a token once to each rank that hosts any of
    # its experts (the hottest rank, at 1 / balancedness of the mean load, gets each of the k
    # choices with p = 1 / (ranks x balancedness)); 3/4 of them cross NVLink at DEP4 against
    # 1/2 at DEP2. The tokens include each request's bounded replay (128 cached tokens through
    # 20 of 43 layers).
    m = m2.cfg.model
    nvlink = m2.cfg.hardware.nvlink_bw_bytes_s / 1e3 * PROFILE.value("a2a_nvlink_efficiency")
    opts = m2.prefill_opts
    tokens = (TOKENS_PER_RANK + REQUESTS_PER_RANK * opts.replay_tokens * opts.replay_layers
              / m.num_layers)

    def remote_ms(model: CalibratedStepModel, share: float) -> float:
        w, b = model.ranks, model.balancedness(0)[0]
        copies = tokens * w * (1 - (1 - min(1.0, 1 / (w * b))) ** m.experts_per_token)
        return (m.num_moe_layers * copies * m.hidden_size * (DISPATCH_BYTES + COMBINE_BYTES)
                * share / nvlink)

    assert diff["comm"] == pytest.approx(remote_ms(m4, 3 / 4) - remote_ms(m2, 1 / 2), rel=1e-6)
    assert diff["comm"] > 0.5 * (s4.total_ms - s2.total_ms)
    # (ii) EPLB: a 4-rank instance balances its experts less well than a 2-rank one ...
    assert m4.balancedness(0)[0] < m2.balancedness(0)[0]
    # ... and MoE alone is about even at equal tokens per rank: a DEP2 rank hosts twice the
    # experts and reads twice the expert weights, a DEP4 rank's kernel permutes ~1.7x the
    # distinct tokens (3.3 against 2.0 per token of a rank). The loss is the all-to-all's.
    assert abs(diff["moe"]) < 0.1 * diff["comm"]
    # (iii) DP sync over more ranks: recursive doubling needs 2 hops instead of 1.
    assert diff["sync"] == pytest.approx(PROFILE.value("allreduce_hop_ms"))
    # (iv) per-layer rank synchronisation: the expected max of per-rank jitter grows with ranks.
    assert diff["straggler"] > 0.0


def test_per_layer_jitter_costs_more_on_more_ranks() -> None:
    """With 20 us of mean CPU jitter per rank and layer, a prefill step pays E[max over n
    ranks] at each of its 43 layer boundaries: hand-computed for DEP2 and DEP4."""
    jittery = PROFILE.with_values({"straggler_jitter_us": 20.0})
    s2, s4 = (_step(_steady_model(w, jittery)) for w in (2, 4))
    layers = PROFILE.value("csa_layers") + PROFILE.value("hca_layers") + 2
    want = {w: layers * max_delay_moments(w, 0.020)[0] for w in (2, 4)}
    assert s2.straggler == pytest.approx(want[2], rel=1e-3)
    assert s4.straggler == pytest.approx(want[4], rel=1e-3)
    assert want[4] / want[2] == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 1.5, rel=1e-3)


def test_a_lagged_rank_is_exposed_more_at_dep4() -> None:
    """P1/P2: one lagged rank; its launch queue hides lag against the GPU time between layer
    boundaries, and DEP4's shorter per-layer time (for the same total work) hides less."""
    cfg = {w: operating_point(prefill_gpus=w, profile=DEFAULT_PROFILE) for w in (2, 4)}
    loss = {}
    for w in (2, 4):
        base, lag = (CalibratedStepModel(cfg[w], "prefill", profile=PROFILE, lagged_ranks=k,
                                         balancedness=(1.0, 1.0)) for k in (0, 1))
        per_rank = 65536 // w
        batch = PrefillBatch(new_tokens=65536, attended_tokens=(131072 + per_rank) * w,
                             num_requests=w, admitted_prompt_tokens=0, ranks=w)
        t0 = expected(base.prefill_step(batch), base).total_ms
        t1 = expected(lag.prefill_step(batch), lag).total_ms
        loss[w] = 1.0 - t0 / t1
    assert loss[4] > 2.0 * loss[2]


def test_the_scenario_picks_the_prefill_all2all_kernels() -> None:
    """`deployment.prefill.all2all_backend`: DeepEP's low-latency kernels send one copy per
    selected expert, 6 / 1.97 = 3.05x the normal kernels' tokens at a balanced DEP2 rank; the
    all-to-all bytes and the MoE kernel's token traffic grow with them, nothing else does."""
    cfg = operating_point(prefill_gpus=2, profile=DEFAULT_PROFILE)
    low = with_changes(cfg, deployment={"prefill": {"all2all_backend": "deepep_low_latency"}})
    assert cfg.deployment.prefill.all2all_backend == "deepep_high_throughput"
    steps = {}
    for name, c in (("normal", cfg), ("low_latency", low)):
        model = CalibratedStepModel(c, "prefill", profile=PROFILE, balancedness=(1.0, 1.0))
        steps[name] = _step(model)
    normal, ll = steps["normal"], steps["low_latency"]
    # (the reference's MegaMoE kernel fuses the dispatch: its all-to-all is bytes only)
    assert PROFILE.setting("moe_kernel") == "megamoe"
    assert ll.comm / normal.comm == pytest.approx(6 / (2 * (1 - 0.5 ** 6)), rel=1e-9)
    assert ll.moe > normal.moe
    for k in ("attention", "indexer", "dense", "cpu", "sync"):
        assert getattr(ll, k) == pytest.approx(getattr(normal, k), rel=1e-12), k
