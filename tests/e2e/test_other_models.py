"""End to end: a generated dense model (Llama-3.1-70B) and a generated MoE model
(Qwen3-235B-A22B) on H200 HGX, each with the profile fitted to the H200 kernel tables."""

from __future__ import annotations

import pytest

from rackSim.config import compose_scenario
from rackSim.run import simulate

#: a short closed-loop window on one 8-GPU node, no speculative decoding (neither model has
#: draft layers), lengths inside Qwen3's 40960-token context
COMMON = ["experiment=smoke", "hardware=h200_hgx", "perf.weight_dtype=fp8", "workload=synthetic",
          "workload.synthetic.max_context_tokens=32768",
          "workload.synthetic.first_prompt_tokens_mean=8000", "workload.num_sessions=16",
          "workload.replay.concurrency=24", "workload.replay.warmup_requests_per_lane=1",
          "workload.replay.window_s=20", "progress=false",
          "deployment.decode.speculative.num_draft_tokens=0",
          "deployment.decode.speculative.accepted_tokens_per_step=1"]


def _run(model: str, *extra: str):
    cfg = compose_scenario([*COMMON, f"model={model}",
                            f"perf.profile=calibration/h200_hgx__{model}.yaml", *extra])
    return cfg, simulate(cfg)


def test_dense_gqa_model_runs_without_experts() -> None:
    cfg, result = _run("meta_llama_3_1_70b")
    s, steps = result.summary, result.steps
    assert s["requests_finished"] > 0 and s["throughput_tok_s_gpu"] > 0
    assert (steps.moe_ms == 0).all() and (steps.comm_ms == 0).all()
    assert (steps.indexer_ms == 0).all()
    # every decode step of a DP rank streams the whole FP8 model (70.6 GB) from HBM at most at
    # peak bandwidth: the inter-token latency cannot beat that floor
    floor_ms = cfg.model.total_params * cfg.model.weight_bytes_per_param \
        / cfg.hardware.hbm_bw_bytes_s * 1e3
    assert floor_ms == pytest.approx(14.7, rel=0.01)
    assert s["itl_p50_ms"] > floor_ms


def test_gqa_moe_model_routes_experts_over_ep_ranks() -> None:
    _, result = _run("qwen3_235b_a22b", "deployment.prefill.instances=1",
                     "deployment.prefill.gpus_per_instance=4")
    s, steps = result.summary, result.steps
    decode = steps[steps.decode_requests > 0]
    assert s["requests_finished"] > 0
    assert (decode.moe_ms > 0).all() and (decode.comm_ms > 0).all()
    # expert-load imbalance is tracked (EPLB) and reported per step
    assert decode.balancedness.between(0.05, 1.0).all()


def test_dual_batch_overlap_hides_the_prefill_all_to_all() -> None:
    """`dbo.enabled` on both instances of the MoE model (DeepEP kernels): prefill steps with
    at least 512 tokens on each of the 4 ranks run as two microbatches and expose a smaller
    share of all-to-all than without; decode steps hold a few requests a rank, below the
    32-token threshold, and are priced as without the overlap (the same all-to-all share)."""
    lay = ("deployment.prefill.instances=1", "deployment.prefill.gpus_per_instance=4")
    dbo = ("deployment.prefill.dbo.enabled=true", "deployment.decode.dbo.enabled=true")
    (_, off), (_, on) = (_run("qwen3_235b_a22b", *lay, *extra) for extra in ((), dbo))
    assert on.summary["requests_finished"] > 0

    def share(result, prefill: bool):
        steps = result.steps
        pick = steps.prefill_tokens >= 4 * 512 if prefill else steps.decode_requests > 0
        return (steps.comm_ms[pick] / steps.duration_ms[pick]).mean()

    assert share(on, True) < 0.5 * share(off, True)
    assert share(on, False) == pytest.approx(share(off, False), rel=0.05)


@pytest.mark.slow
def test_two_models_by_three_gpus_sweep_from_one_line(tmp_path) -> None:
    """One `racksim -m` line: each job picks its pair's profile by interpolating the chosen
    model and hardware; the sweep table has six scenarios."""
    import subprocess
    import sys

    import pandas as pd

    cmd = [sys.executable, "-c", "from rackSim.cli import run; run()", "-m",
           "model=meta_llama_3_1_70b,qwen3_235b_a22b", "hardware=h200_hgx,b200_hgx,b300_hgx",
           "perf.profile=calibration/${hydra:runtime.choices.hardware}__"
           "${hydra:runtime.choices.model}.yaml", f"hydra.sweep.dir={tmp_path}",
           "deployment.prefill.instances=1", "deployment.prefill.gpus_per_instance=4",
           "workload.replay.window_s=10",
           *[c for c in COMMON if not c.startswith(("hardware=", "workload.replay.window_s"))]]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert len(table) == 6 and (table.status == "ok").all()
    # a faster GPU gives the same model a shorter decode step
    step = table.set_index(["model", "hardware"]).decode_step_ms
    for model in ("meta_llama_3_1_70b", "qwen3_235b_a22b"):
        assert step[(model, "b200_hgx")] < step[(model, "h200_hgx")]
