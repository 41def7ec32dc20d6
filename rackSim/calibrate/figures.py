"""Model predictions of the published calibration figures at their operating points.

Each `predict_*` takes a profile (and the targets file's operating points) and returns
{figure id: predicted value} in the figure's unit, so the fit and the tests share one code path.
"""

from __future__ import annotations

import csv
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from rackSim.calibrate.scenario import CALIBRATION, operating_point
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.comm import allreduce_ms
from rackSim.perf.cpu import admission_ms
from rackSim.perf.eplb import EplbConfig, EplbState, mean_balancedness
from rackSim.perf.prefill_opts import PrefillOptimisations
from rackSim.perf.profile import Profile
from rackSim.perf.step import DecodeBatch, PrefillBatch, StepBreakdown

FIGURES_CSV = CALIBRATION / "published_figures.csv"
TARGETS = CALIBRATION / "targets__gb300__deepseek_v4_1_flash.yaml"


def read_figures(path: Path = FIGURES_CSV) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {row["id"]: row for row in csv.DictReader(f)}


def published_values(path: Path = FIGURES_CSV) -> dict[str, float]:
    """Numeric published targets by key. 'a -> b' rows give '<id>.off'/'<id>.on' style keys."""
    rows = read_figures(path)

    def pair(fid: str) -> tuple[float, float]:
        a, b = rows[fid]["value"].split("->")
        return float(a), float(b)

    out = {k: float(rows[k]["value"]) for k in ("D1", "D2", "D3", "D4", "D5", "P1", "P2",
                                                 "P3", "P4", "P5", "P6")}
    out["E1.off"], out["E1.on"] = pair("E1")
    out["E2.off"], out["E2.on"] = pair("E2")
    out["C1.ring"], out["C1.recursive_doubling"] = pair("C1")
    out["C2.baseline"], out["C2.optimised"] = pair("C2")
    out["L1.standard"], out["L1.low_latency"] = pair("L1")
    out["L2"] = float(rows["L2"]["value"])
    return out


def accepted_tokens_per_step(path: Path = FIGURES_CSV) -> float:
    """M7: accepted tokens per decode step (the forced-acceptance control of the L figures)."""
    return float(read_figures(path)["M7"]["value"])


@lru_cache(maxsize=1)
def targets(path: Path = TARGETS) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def expected(b: StepBreakdown, model: CalibratedStepModel) -> StepBreakdown:
    """The breakdown with its random straggler draw replaced by the expected delay."""
    return replace(b, straggler=model.last_straggler_expected_ms)


# -- EPLB ------------------------------------------------------------------------------------
def eplb_config(profile: Profile, which: str, ranks: int, enabled: bool, layers: int,
                experts: int) -> EplbConfig:
    return EplbConfig(layers=layers, experts=experts, ranks=ranks,
                      sigma=profile.value(f"eplb_sigma_{which}"),
                      sigma_group=profile.value(f"eplb_sigma_group_{which}"),
                      groups=int(profile.value("eplb_groups")),
                      drift_steps=profile.value("eplb_drift_steps"), enabled=enabled,
                      epoch_steps=int(profile.value("eplb_epoch_steps")))


def predict_balancedness(profile: Profile, which: str, experts: int, ranks: int, enabled: bool,
                         layers: int = 8, steps: int = 9000, seed: int = 0) -> float:
    cfg = eplb_config(profile, which, ranks, enabled, layers, experts)
    return mean_balancedness(cfg, steps, seed=seed, warmup_steps=3000)


def predict_eplb(profile: Profile, experts: tuple[int, int] = (384, 128)) -> dict[str, float]:
    t = targets()["eplb"]
    out = {}
    for fid, which, e in (("E1", "target", experts[0]), ("E2", "draft", experts[1])):
        for state, on in (("off", False), ("on", True)):
            out[f"{fid}.{state}"] = predict_balancedness(profile, which, e, t["ranks"], on,
                                                         t["layers"], t["steps"])
    return out


def predict_rebalance_s(profile: Profile) -> float:
    """E4: duration of one rearrangement's weight copies at DEP32 on GB300 (s)."""
    cfg = operating_point(decode_gpus=32)
    m = cfg.model
    ecfg = replace(eplb_config(profile, "target", 32, True, m.num_moe_layers,
                               m.num_routed_experts),
                   expert_bytes=m.expert_params * m.weight_bytes_per_param)
    st = EplbState(ecfg, seed=0)
    st.advance(cfg.deployment.eplb.interval_steps)
    nvlink_ms = cfg.hardware.nvlink_bw_bytes_s / 1e3 * profile.value("a2a_nvlink_efficiency")
    return st.rebalance_ms(nvlink_ms) / 1e3


# -- decode ----------------------------------------------------------------------------------
def decode_breakdown(profile: Profile, width: int, balancedness: tuple[float, float],
                     hardware: str | None = None) -> tuple[StepBreakdown, CalibratedStepModel]:
    t = targets()["decode"]
    cfg = operating_point(hardware=hardware or t["hardware"], decode_gpus=width,
                          allreduce=t["allreduce"], eplb=t["eplb"])
    model = CalibratedStepModel(cfg, "decode", profile=profile, balancedness=balancedness)
    reqs = t["requests_per_rank"]
    batch = DecodeBatch(requests_per_rank=[reqs] * width,
                        context_tokens_per_rank=[reqs * t["context_tokens"]] * width,
                        tokens_per_request=1.0, draft_tokens=t["draft_tokens"], new_loads=0,
                        admitted_prompt_tokens=0, step_index=0)
    return expected(model.decode_step(batch), model), model


def predict_decode(profile: Profile, balancedness: dict[int, tuple[float, float]]
                   ) -> dict[str, float]:
    out: dict[str, float] = {}
    lo, hi = targets()["decode"]["widths"]
    for w in (lo, hi):
        b, _ = decode_breakdown(profile, w, balancedness[w])
        megamoe = b.moe + b.comm
        target = megamoe + b.attention + b.indexer + b.dense
        if w == lo:
            out["D1"] = megamoe / target
            out["D2"] = (b.attention + b.indexer) / target
            out["D3"] = megamoe
        else:
            out["D4"] = megamoe
        out[f"D5@DEP{w}"] = b.total_ms - megamoe
    return out


# -- CPU ---------------------------------------------------------------------------------------
def predict_cpu(profile: Profile) -> dict[str, float]:
    t = targets()
    n = t["allreduce"]["ranks"]
    out = {f"C1.{alg}": allreduce_ms(alg, n, profile.value("allreduce_call_ms"),
                                     profile.value("allreduce_hop_ms"))
           for alg in ("ring", "recursive_doubling")}
    tokens = t["admission"]["prompt_tokens"]
    out["C2.baseline"] = admission_ms(tokens, profile.value("admission_ns_per_token_baseline"))
    out["C2.optimised"] = admission_ms(tokens, profile.value("admission_ns_per_token"))
    return out


# -- prefill -----------------------------------------------------------------------------------
def prefill_ms(profile: Profile, hardware: str, ranks: int, tokens_per_rank: int, cached: int,
               opts: PrefillOptimisations | None = None, lagged: int = 0) -> float:
    """Expected prefill step time (ms): one request per rank, `tokens_per_rank` new tokens after
    `cached` cached tokens."""
    cfg = operating_point(hardware=hardware, prefill_gpus=ranks)
    model = CalibratedStepModel(cfg, "prefill", profile=profile, lagged_ranks=lagged,
                                prefill_opts=opts, balancedness=(1.0, 1.0))
    batch = PrefillBatch(new_tokens=tokens_per_rank * ranks,
                         attended_tokens=(cached + tokens_per_rank) * ranks,
                         num_requests=ranks, admitted_prompt_tokens=0, ranks=ranks)
    return expected(model.prefill_step(batch), model).total_ms


def predict_stragglers(profile: Profile) -> dict[str, float]:
    t = targets()["stragglers"]
    out = {}
    for fid, w in zip(("P1", "P2"), t["widths"], strict=True):
        per_rank = t["step_tokens"] // w
        base = prefill_ms(profile, t["hardware"], w, per_rank, t["cached_tokens"])
        lag = prefill_ms(profile, t["hardware"], w, per_rank, t["cached_tokens"],
                         lagged=t["lagged_ranks"])
        out[fid] = 100.0 * (1.0 - base / lag)
    return out


def predict_prefill_opts(profile: Profile) -> dict[str, float]:
    t = targets()["prefill_opts"]
    args = (profile, t["hardware"], t["ranks"], t["new_tokens_per_rank"], t["cached_tokens"])
    none = PrefillOptimisations(bounded_replay=False, large_pages=False, deepselect=False)
    p3 = replace(none, bounded_replay=True)
    p4 = replace(p3, large_pages=True)
    p5 = replace(p4, deepselect=True)
    t0, t3, t4, t5 = (prefill_ms(*args, opts=o) for o in (none, p3, p4, p5))
    return {"P3": 100 * (t0 / t3 - 1), "P4": 100 * (t3 / t4 - 1), "P5": 100 * (t4 / t5 - 1),
            "P6": 100 * (t0 / t5 - 1)}


# -- small-batch TP decode (L1, L2) ------------------------------------------------------------
def low_latency_step_ms(profile: Profile, point: dict[str, Any], low_latency: bool) -> float:
    """Expected decode step (ms) of a TP instance at an L-figure operating point (`point`: a
    targets-file entry), on the standard or the specialised low-latency decode path."""
    tp = int(point["tp"])
    cfg = operating_point(hardware=point["hardware"], decode_gpus=tp, prefill_gpus=tp,
                          parallelism="TP")
    model = CalibratedStepModel(cfg, "decode", profile=profile, balancedness=(1.0, 1.0),
                                low_latency_decode=low_latency)
    c = int(point["concurrency"])
    batch = DecodeBatch(requests_per_rank=[c],
                        context_tokens_per_rank=[c * point["context_tokens"]],
                        tokens_per_request=accepted_tokens_per_step(),
                        draft_tokens=int(point["draft_tokens"]), new_loads=0,
                        admitted_prompt_tokens=0, step_index=0)
    return expected(model.decode_step(batch), model).total_ms


def predict_low_latency(profile: Profile) -> dict[str, float]:
    """L1: interactivity (tokens/s per user = accepted tokens per step / step time) on the
    standard and the specialised path; L2: the specialised path's gain (%) at its point."""
    t = targets()["low_latency"]
    accepted = accepted_tokens_per_step()
    l1 = {path: low_latency_step_ms(profile, t["L1"], path == "low_latency")
          for path in ("standard", "low_latency")}
    std, ll = (low_latency_step_ms(profile, t["L2"], on) for on in (False, True))
    return {"L1.standard": accepted / l1["standard"] * 1e3,
            "L1.low_latency": accepted / l1["low_latency"] * 1e3,
            "L2": 100.0 * (std / ll - 1.0)}
