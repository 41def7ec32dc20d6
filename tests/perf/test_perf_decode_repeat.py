"""`decode_repeat`: the price of a step that holds the same requests as the last one, reusing
what depends on the request counts alone, equals `decode_step`'s to the bit, across EPLB
epochs and rearrangements, for any spread of requests and contexts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rackSim.calibrate.scenario import DEFAULT_PROFILE, operating_point
from rackSim.perf import DecodeBatch
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.profile import Profile

PROFILE = Profile.load(DEFAULT_PROFILE).with_values({"straggler_jitter_us": 40.0})
CFG = operating_point(decode_gpus=8, profile=DEFAULT_PROFILE)
A, DRAFTS = 3.25, 3


def _run(model: CalibratedStepModel, reqs: list[int], ctx: list[float], first: int,
         groups: list[int], repeat: bool) -> list[tuple]:
    """Price `sum(groups)` steps from step `first`: each group starts with a step that admits
    a request on every third rank (`decode_step`), then its steps hold the same requests while
    their contexts grow by `A` per request and step (`decode_repeat` when `repeat`)."""
    out = []
    step = first
    for g, n in enumerate(groups):
        reqs = [r + (1 if (i + g) % 3 == 0 else 0) for i, r in enumerate(reqs)]
        admitted = tuple((1, 4096, 64) for i in range(len(reqs)) if (i + g) % 3 == 0)
        for k in range(n):
            adm = () if k else admitted
            batch = DecodeBatch(reqs, list(ctx), A, DRAFTS, len(adm), 4096 * len(adm), step,
                                adm)
            cost = model.decode_repeat(batch) if repeat and k else model.decode_step(batch)
            out.append((cost, model.last_balancedness, model.last_straggler_expected_ms))
            ctx = [c + A * r for c, r in zip(ctx, reqs, strict=True)]
            step += 1
    return out


@settings(max_examples=25, deadline=None)
@given(reqs=st.lists(st.integers(0, 40), min_size=8, max_size=8),
       ctx_per_req=st.floats(100.0, 200_000.0), first=st.integers(0, 6000),
       groups=st.lists(st.integers(1, 150), min_size=1, max_size=4),
       seed=st.integers(0, 3))
def test_repeat_prices_as_the_full_step(reqs: list[int], ctx_per_req: float, first: int,
                                        groups: list[int], seed: int) -> None:
    ctx = [r * ctx_per_req * (1 + i / 7) for i, r in enumerate(reqs)]
    full = _run(CalibratedStepModel(CFG, "decode", seed, PROFILE), reqs, ctx, first, groups,
                repeat=False)
    again = _run(CalibratedStepModel(CFG, "decode", seed, PROFILE), reqs, ctx, first, groups,
                 repeat=True)
    assert again == full  # exact: every field, the balancedness and the straggler mean


def test_a_repeat_across_an_epoch_and_a_rearrangement_moves_with_them() -> None:
    """Steps 2900-3100 cross EPLB epochs and the rearrangement at step 3000: the repeated
    steps' MoE time follows the balancedness (and the copies' traffic) as a full step does."""
    reqs, ctx = [30] * 8, [30 * 50_000.0] * 8
    full = _run(CalibratedStepModel(CFG, "decode", 0, PROFILE), reqs, ctx, 2900, [200],
                repeat=False)
    again = _run(CalibratedStepModel(CFG, "decode", 0, PROFILE), reqs, ctx, 2900, [200],
                 repeat=True)
    assert again == full
    assert len({cost.moe for cost, _, _ in again}) > 2  # it did move
