"""Micro-benchmark: cost of CalibratedStepModel.decode_step / prefill_step per call (us).

Run: .venv/bin/python benchmarks/perf_step.py  (prints numbers; not a pass/fail test)
"""

from __future__ import annotations

import random
import time

from rackSim.calibrate.scenario import DEFAULT_PROFILE, operating_point
from rackSim.perf import DecodeBatch, PrefillBatch, build_step_model


def bench_decode(width: int, steps: int = 50_000, churn: bool = True) -> float:
    """Per-call cost; with `churn` one rank's batch changes every step (cache misses)."""
    cfg = operating_point(decode_gpus=width, profile=DEFAULT_PROFILE)
    model = build_step_model(cfg, "decode", seed=0)
    rng = random.Random(0)
    reqs = [rng.randint(40, 90) for _ in range(width)]
    ctx = [r * rng.uniform(20_000, 100_000) for r in reqs]
    batches = []
    for i in range(steps):
        if churn:
            j = rng.randrange(width)
            reqs[j] = max(1, reqs[j] + rng.choice((-1, 1)))
            ctx[j] = reqs[j] * rng.uniform(20_000, 100_000)
        batches.append(DecodeBatch(list(reqs), list(ctx), 3.25, 3, 0, 0, i))
    t0 = time.perf_counter()
    for b in batches:
        model.decode_step(b)
    return (time.perf_counter() - t0) / steps * 1e6


def bench_prefill(steps: int = 20_000) -> float:
    cfg = operating_point(profile=DEFAULT_PROFILE)
    model = build_step_model(cfg, "prefill", seed=0)
    batch = PrefillBatch(new_tokens=32768, attended_tokens=2 * 163840, num_requests=2,
                         admitted_prompt_tokens=32768, ranks=2)
    t0 = time.perf_counter()
    for _ in range(steps):
        model.prefill_step(batch)
    return (time.perf_counter() - t0) / steps * 1e6


if __name__ == "__main__":
    for w in (4, 16, 32, 64):
        print(f"decode_step DEP{w:<3} {bench_decode(w):7.1f} us/call "
              "(batch changes every step; incl. EPLB drift + rearrangements)")
    print(f"prefill_step DEP2   {bench_prefill():7.1f} us/call")
