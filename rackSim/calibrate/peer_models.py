"""`racksim-calibrate peer`: rackSim's step times beside aiconfigurator-core's own static
estimates, for generated models on several GPUs, at fixed batches.

For each (model, GPU, parallelism): one prefill step (`PREFILL_BATCH` requests of `ISL` new
tokens per rank, no prefix) and one decode step (`DECODE_BATCH` requests per rank at `ISL`
context, one token each, no speculation), priced by

* rackSim - the calibrated step model with the pair's table profile
  (`calibration/<hardware>__<model>.yaml`), experts perfectly balanced (balancedness 1, as
  the tables' `balanced` rows), no stragglers' lag; `gpu_ms` leaves out what aiconfigurator
  does not model (per-step CPU, the DP-sync all-reduce, straggler delay);
* aic - aiconfigurator-core's `EngineHandle` for the same model, system (vLLM), parallelism
  and quantisation (FP8 GEMMs, FP8 block experts, FP8 KV cache): `predict_prefill_latency`
  and `decode_step_latency` (its batch sizes are per attention-DP rank), and from
  `run_static_per_op` its MoE, attention and communication operations (`AIC_PARTS`), to set
  beside rackSim's `moe`, `attention` and `comm`. aic prices MoE from its `power_law`
  (alpha 1.01) routing rows by default, rackSim here from balanced experts.

DEPn pairs price one n-rank instance with attention data parallel and experts over n ranks;
TPn pairs split heads and GEMMs n ways.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from rackSim.calibrate import aic
from rackSim.calibrate.scenario import CALIBRATION
from rackSim.config import compose_scenario
from rackSim.config.flags import output_file
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.profile import Profile
from rackSim.perf.step import DecodeBatch, PrefillBatch, StepBreakdown

ISL = 4096
PREFILL_BATCH = 1
DECODE_BATCH = 64
#: rackSim parts aiconfigurator-core does not model
NOT_IN_AIC = ("cpu", "sync", "straggler")


@dataclass(frozen=True)
class Pair:
    model: str          # scenarios/model/<model>.yaml
    hf_name: str        # aiconfigurator-core's config name
    hardware: str       # scenarios/hardware/<hardware>.yaml
    parallelism: str    # 'TP' or 'DEP'
    width: int


PAIRS = tuple(
    Pair(m, hf, hw, par, w)
    for hw in ("h200_hgx", "b200_hgx")
    for m, hf, par, w in (("meta_llama_3_1_70b", "meta-llama/Meta-Llama-3.1-70B", "TP", 4),
                          ("qwen3_235b_a22b", "Qwen/Qwen3-235B-A22B", "DEP", 4),
                          ("deepseek_v3", "deepseek-ai/DeepSeek-V3", "DEP", 8)))


def step_models(pair: Pair) -> tuple[CalibratedStepModel, CalibratedStepModel]:
    """(prefill, decode) step models of one `width`-GPU instance each."""
    profile = CALIBRATION / f"{pair.hardware}__{pair.model}.yaml"
    base = ["experiment=smoke", f"model={pair.model}", f"hardware={pair.hardware}",
            "perf.weight_dtype=fp8", "workload=synthetic", f"perf.profile={profile}",
            "workload.synthetic.max_context_tokens=32768", "perf.lagged_ranks=0",
            "deployment.decode.speculative.num_draft_tokens=0",
            "deployment.decode.speculative.accepted_tokens_per_step=1"]
    # one prefill and one decode instance, each a whole NVLink domain at the widest (two HGX
    # nodes side by side); the step models price one instance and see no rack
    cfg = compose_scenario([*base, "deployment.prefill.instances=1",
                            f"hardware.gpus_per_rack={2 * pair.width}",
                            f"deployment.prefill.gpus_per_instance={pair.width}",
                            f"deployment.prefill.parallelism={pair.parallelism}",
                            f"deployment.decode.gpus={pair.width}",
                            f"deployment.decode.parallelism={pair.parallelism}"])
    p = Profile.load(profile)
    prefill = decode = cfg
    return (CalibratedStepModel(prefill, "prefill", profile=p, balancedness=(1.0, 1.0)),
            CalibratedStepModel(decode, "decode", profile=p, balancedness=(1.0, 1.0)))


def racksim_steps(pair: Pair) -> tuple[StepBreakdown, StepBreakdown]:
    prefill, decode = step_models(pair)
    dp = pair.width if pair.parallelism == "DEP" else 1
    reqs = PREFILL_BATCH * dp
    p = prefill.prefill_step(PrefillBatch(new_tokens=reqs * ISL, attended_tokens=reqs * ISL,
                                          num_requests=reqs, admitted_prompt_tokens=0,
                                          ranks=pair.width))
    per_rank = [DECODE_BATCH] * dp + [0] * (pair.width - dp)
    d = decode.decode_step(DecodeBatch(
        requests_per_rank=per_rank, context_tokens_per_rank=[r * ISL for r in per_rank],
        tokens_per_request=1.0, draft_tokens=0, new_loads=0, admitted_prompt_tokens=0,
        step_index=1))
    return p, d


#: aiconfigurator-core's per-operation names (without their `context_` / `generation_`
#: prefix) summed into the parts set beside rackSim's: its MoE (`moe_overlap`: MoE and
#: dispatch in one op, DeepSeek-V3 decode), the attention kernel (MLA models have only a
#: whole `mla_block`, GEMMs included: none), and the communication (MoE dispatch and combine,
#: TP all-reduces). A part none of whose operations the model has is NaN.
AIC_PARTS = {"moe": ("moe", "moe_overlap"), "attention": ("attention",),
             "comm": ("moe_pre_dispatch", "moe_post_dispatch", "ar_1", "ar_2",
                      "embedding_ar", "tp_allreduce")}


def aic_steps(pair: Pair) -> tuple[dict[str, float], dict[str, float]] | str:
    """(prefill, decode) from aiconfigurator-core - each {'total': ms, and per `AIC_PARTS`
    part ms} - or why there are none."""
    if aic.aic_root() is None:
        return "aiconfigurator-core is not installed"
    from aiconfigurator_core.sdk.engine import EngineHandle

    system = {"h200_hgx": "h200_sxm", "b200_hgx": "b200_sxm"}[pair.hardware]
    par = (dict(tp_size=pair.width) if pair.parallelism == "TP" else
           dict(tp_size=1, attention_dp_size=pair.width, moe_tp_size=1,
                moe_ep_size=pair.width))
    moe = {"moe_quant_mode": "fp8_block"} if pair.parallelism == "DEP" else {}
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            e = EngineHandle.compile(pair.hf_name, system, "vllm", gemm_quant_mode="fp8",
                                     kvcache_quant_mode="fp8", **moe, **par)
            totals = (e.predict_prefill_latency(PREFILL_BATCH, ISL),
                      e.decode_step_latency(DECODE_BATCH, ISL, 2))
            ctx = e.run_static_per_op(batch_size=PREFILL_BATCH, isl=ISL, osl=2)[0]
            gen = e.run_static_per_op(batch_size=DECODE_BATCH, isl=ISL, osl=2)[1]
    except Exception as err:  # the SDK's own errors, reported in the table instead
        return f"aiconfigurator-core: {err}"
    out = []
    for total, ops, prefix in ((totals[0], ctx, "context_"), (totals[1], gen, "generation_")):
        ms = {name.removeprefix(prefix): value for name, value, *_ in ops}
        out.append({"total": total, **{
            part: sum(ms[n] for n in names if n in ms) if ms.keys() & set(names) else math.nan
            for part, names in AIC_PARTS.items()}})
    return out[0], out[1]


def gpu_ms(b: StepBreakdown) -> float:
    return b.total_ms - sum(getattr(b, k) for k in NOT_IN_AIC)


def comparison(pairs: Sequence[Pair] = PAIRS) -> pd.DataFrame:
    """One row per (pair, phase): rackSim total and GPU ms, its breakdown, aic ms, error."""
    rows = []
    for pair in pairs:
        steps = racksim_steps(pair)
        peer = aic_steps(pair)
        for i, (phase, b) in enumerate(zip(("prefill", "decode"), steps, strict=True)):
            theirs = peer[i] if isinstance(peer, tuple) else {}
            aic_ms = theirs.get("total", float("nan"))
            rows.append({"model": pair.model, "hardware": pair.hardware,
                         "layout": f"{pair.parallelism}{pair.width}", "phase": phase,
                         "racksim_ms": b.total_ms, "racksim_gpu_ms": gpu_ms(b),
                         "aic_ms": aic_ms, "gpu_vs_aic": gpu_ms(b) / aic_ms - 1.0,
                         **{f"{k}_ms": v for k, v in b.as_dict().items()},
                         **{f"aic_{part}_ms": theirs.get(part, float("nan"))
                            for part in AIC_PARTS},
                         "note": "" if isinstance(peer, tuple) else peer})
    return pd.DataFrame(rows)


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def markdown(df: pd.DataFrame) -> str:
    head = ("| model | GPU | layout | phase | rackSim ms (GPU part) | aic ms | GPU vs aic | "
            "moe / attention / dense / comm ms | aic moe / attention / comm ms |\n"
            "|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in df.itertuples():
        lines.append(f"| {r.model} | {r.hardware} | {r.layout} | {r.phase} | {r.racksim_ms:.2f}"
                     f" ({r.racksim_gpu_ms:.2f}) | {r.aic_ms:.2f} | {r.gpu_vs_aic:+.0%} | "
                     f"{r.moe_ms:.2f} / {r.attention_ms:.2f} / {r.dense_ms:.2f} / "
                     f"{r.comm_ms:.2f} | {_ms(r.aic_moe_ms)} / {_ms(r.aic_attention_ms)} / "
                     f"{_ms(r.aic_comm_ms)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="racksim-calibrate peer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=output_file, help="also write the table as CSV")
    args = ap.parse_args(argv)
    df = comparison()
    print(markdown(df))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.out, index=False)
        print(f"wrote {args.out}")
    return 0
