"""Fit the GB300 x DeepSeek-V4.1-Flash profile, stage by stage, with scipy least_squares.

Stages (each fits only the parameters its data constrain; later stages see earlier results):

1. kernel tables (aiconfigurator-core, optional): MoE kernel speeds, indexer kernel speeds.
2. EPLB skew (E1, E2): group and per-expert popularity spread of target and draft models.
3. CPU (C1, C2): all-reduce call + hop latency; admission cost per prompt token.
4. decode (D1-D5): attention efficiency, per-layer dense kernel cost, all-to-all op latency and
   NVLink efficiency, per-step scheduling time.
5. stragglers (P1, P2): per-sync-point CPU jitter, the lag of a lagged rank and how much of
   it the rank's launch queue hides.
6. prefill optimisations (P3-P5): unbounded replay length, 4 KB-page TLB overhead, top-k cost.
7. small-batch TP decode (L1 both ends): exposed per-layer latency of the standard and of the
   specialised low-latency decode kernels; L2 is predicted, not fitted.

Stages 4-6 are run twice because they share the prefill/decode step they evaluate.
Initial guesses below are starting points for the optimiser, not results.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from rackSim.calibrate import aic, figures
from rackSim.calibrate.scenario import operating_point
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.prefill_opts import LOGIT_BYTES
from rackSim.perf.profile import Profile

AIC_MISSING = ("aiconfigurator-core is not installed: skipping the kernel-table fit (b); "
               "install the 'aic' extra (pip install aiconfigurator-core) to fit the MoE and "
               "indexer kernels. Kernel parameters keep their previous profile values.")

#: name -> (initial guess, lower, upper, unit)
START: dict[str, tuple[float, float, float, str]] = {
    "moe_kernel_us": (20.0, 0.0, 200.0, "us per MoE layer"),
    "moe_hbm_efficiency": (0.8, 0.05, 1.0, "fraction of peak HBM bandwidth"),
    "moe_flops_efficiency": (0.3, 0.01, 1.0, "fraction of peak FLOP/s"),
    "moe_token_bytes": (2.0, 0.0, 200.0, "bytes per routed token per hidden element"),
    "indexer_kernel_us": (5.0, 0.0, 100.0, "us per layer"),
    "indexer_hbm_efficiency": (0.5, 0.01, 1.0, "fraction of peak HBM bandwidth"),
    "gemm_fp8_kernel_us": (5.0, 0.0, 200.0, "us per FP8 GEMM"),
    "gemm_fp8_hbm_efficiency": (0.7, 0.01, 1.0, "fraction of peak HBM bandwidth"),
    "gemm_fp8_flops_efficiency": (0.6, 0.01, 1.0, "fraction of peak FP8 FLOP/s"),
    "gemm_fp8_quant_bytes": (2.0, 0.0, 100.0, "HBM bytes per input element (activation "
                             "quantisation)"),
    "gemm_bf16_kernel_us": (5.0, 0.0, 200.0, "us per BF16 GEMM"),
    "gemm_bf16_hbm_efficiency": (0.7, 0.01, 1.0, "fraction of peak HBM bandwidth"),
    "gemm_bf16_flops_efficiency": (0.6, 0.01, 1.0, "fraction of peak BF16 FLOP/s"),
    "mhc_kernel_us": (20.0, 0.0, 200.0, "us per layer (both hyper-connection sites)"),
    "mhc_hbm_efficiency": (0.5, 0.01, 1.0, "fraction of peak HBM bandwidth"),
    "prefill_attn_kernel_us": (10.0, 0.0, 200.0, "us per layer"),
    "prefill_attn_chunk_us": (5.0, 0.0, 100.0, "us per layer per 4-request KV-gather chunk"),
    "prefill_attn_hbm_efficiency": (0.5, 0.01, 1.0,
                                    "fraction of peak HBM bandwidth (query read + output)"),
    "prefill_attn_flops_efficiency": (0.5, 0.01, 1.0, "fraction of peak BF16 FLOP/s"),
    "prefill_indexer_kernel_us": (5.0, 0.0, 100.0, "us per CSA layer"),
    "prefill_indexer_row_ns": (5.0, 0.0, 1000.0, "ns per query token per CSA layer"),
    "prefill_indexer_flops_efficiency": (0.5, 0.01, 1.0, "fraction of peak FP8 FLOP/s"),
    "eplb_sigma_target": (0.3, 0.0, 3.0, "std of log expert popularity"),
    "eplb_sigma_group_target": (1.0, 0.0, 4.0, "std of log group popularity"),
    "eplb_sigma_draft": (0.3, 0.0, 3.0, "std of log expert popularity"),
    "eplb_sigma_group_draft": (1.0, 0.0, 4.0, "std of log group popularity"),
    "allreduce_call_ms": (0.5, 0.0, 20.0, "ms per all-reduce call"),
    "allreduce_hop_ms": (0.1, 0.0, 5.0, "ms per message hop"),
    "admission_ns_per_token_baseline": (40.0, 0.0, 1e4, "ns per prompt token"),
    "admission_ns_per_token": (7.0, 0.0, 1e4, "ns per prompt token"),
    "attn_flops_efficiency": (0.3, 0.01, 1.0, "fraction of peak BF16 FLOP/s"),
    "megamoe_hbm_efficiency": (0.8, 0.05, 1.0, "fraction of peak HBM bandwidth"),
    "megamoe_kernel_us": (10.0, 0.0, 200.0, "us per MoE layer (fused MegaMoE kernel)"),
    "dense_kernel_us": (50.0, 0.0, 1000.0, "us per layer (non-MoE kernels)"),
    "a2a_op_us": (10.0, 0.0, 200.0, "us per dispatch or combine"),
    "a2a_nvlink_efficiency": (0.6, 0.05, 1.0, "fraction of NVLink bandwidth"),
    "cpu_step_ms": (0.5, 0.0, 10.0, "ms per step"),
    "straggler_jitter_us": (20.0, 0.01, 2000.0, "mean us per rank per sync point"),
    "straggler_lag_us": (2000.0, 0.0, 20000.0, "us per sync point"),
    "straggler_absorb": (0.01, 0.0, 1.0, "fraction of the GPU time between sync points"),
    "replay_tokens_baseline": (8192.0, 128.0, 131072.0, "tokens"),
    "tlb_overhead": (0.05, 0.0, 5.0, "fraction of gather time"),
    "topk_ns_per_candidate": (0.01, 0.0, 10.0, "ns per candidate logit"),
    "tp_layer_latency_us_standard": (20.0, 0.0, 1000.0,
                                     "us per layer executed (TP decode, standard path)"),
    "tp_layer_latency_us_low_latency": (5.0, 0.0, 1000.0,
                                        "us per layer executed (TP decode, specialised path)"),
}


V4_CONFIG = "model_configs/deepseek-ai--DeepSeek-V4-Flash_config.json"


def _constants(p: Profile, previous: Profile | None) -> None:
    """Architecture facts: read from the DeepSeek-V4-Flash config.json shipped with
    aiconfigurator-core when it is installed, else kept from the previous profile."""
    root = aic.aic_root()
    if root is not None and (root / V4_CONFIG).is_file():
        c = json.loads((root / V4_CONFIG).read_text())
        # the list's entries past num_hidden_layers belong to the MTP (next-n) layer
        ratios = c["compress_ratios"][: c["num_hidden_layers"]]
        src = (f"aiconfigurator-core {aic.aic_version()} {V4_CONFIG} (DeepSeek-V4-Flash; "
               "ASSUMED unchanged in V4.1)")
        csa = sorted({r for r in ratios if r > 0})[0]
        hca = sorted({r for r in ratios if r > 0})[-1]
        p.set_constant("csa_layers", ratios.count(csa), src + ": layers with the small ratio")
        p.set_constant("csa_compress", csa, src)
        p.set_constant("hca_layers", ratios.count(hca), src + ": layers with the large ratio")
        p.set_constant("hca_compress", hca, src)
        p.set_constant("attention_heads", c["num_attention_heads"], src)
        p.set_constant("attention_head_dim", c["head_dim"], src)
        p.set_constant("indexer_heads", c["index_n_heads"], src)
        p.set_constant("indexer_head_dim", c["index_head_dim"], src)
        for name, field in (("q_lora_rank", "q_lora_rank"), ("o_lora_rank", "o_lora_rank"),
                            ("o_groups", "o_groups"), ("vocab_size", "vocab_size"),
                            ("hc_mult", "hc_mult")):
            p.set_constant(name, c[field], f"{src}: {field}")
    elif previous is not None:
        p.constants.update({k: v for k, v in previous.constants.items()
                            if not k.startswith("eplb_")})
    else:
        raise RuntimeError("no aiconfigurator-core and no previous profile: cannot read the "
                           "attention geometry constants")
    p.set_constant("prefill_chunk_requests", 4,
                   "vLLM vllm/model_executor/layers/deepseek_v4_attention.py PREFILL_CHUNK_SIZE: "
                   "requests whose KV one prefill sparse-attention call gathers")
    p.set_constant("eplb_groups", 8, "ASSUMED: 8 routing groups as in DeepSeek-V3 n_group")
    p.set_constant("eplb_drift_steps", 30000,
                   "ASSUMED: popularity correlation time of 10 rearrangement intervals (E3)")
    p.set_constant("eplb_epoch_steps", 100, "modelling choice: popularity advanced per 100 steps")


#: parameters fitted to the kernel tables; without aiconfigurator-core they are kept from the
#: previous profile
KERNEL_PARAMS = ("moe_kernel_us", "moe_hbm_efficiency", "moe_flops_efficiency", "moe_token_bytes",
                 "indexer_kernel_us", "indexer_hbm_efficiency", "gemm_fp8_kernel_us",
                 "gemm_fp8_hbm_efficiency", "gemm_fp8_flops_efficiency", "gemm_fp8_quant_bytes",
                 "gemm_bf16_kernel_us", "gemm_bf16_hbm_efficiency", "gemm_bf16_flops_efficiency",
                 "mhc_kernel_us", "mhc_hbm_efficiency", "prefill_attn_kernel_us",
                 "prefill_attn_chunk_us", "prefill_attn_hbm_efficiency",
                 "prefill_attn_flops_efficiency", "prefill_indexer_kernel_us",
                 "prefill_indexer_row_ns", "prefill_indexer_flops_efficiency")


def start_profile(previous: Profile | None = None) -> Profile:
    """Initial guesses for every parameter (so a fit is a function of its inputs only), except
    the kernel-table parameters, which come from `previous` when given."""
    p = Profile(name="gb300__deepseek_v4_1_flash")
    _constants(p, previous)
    for k, (x0, _, _, unit) in START.items():
        old = previous.params.get(k) if previous and k in KERNEL_PARAMS else None
        if old is not None:
            p.params[k] = dict(old)
        else:
            p.set_param(k, x0, unit, [], "initial guess (not fitted)")
    p.settings = {"admission_optimised": True, "moe_dispatch": "alltoall", "moe_kernel": "megamoe",
                  "decode_sync_points": 1, "lagged_ranks": 0, "low_latency_decode": True,
                  "prefill_optimisations": {"bounded_replay": True, "large_pages": True,
                                            "deepselect": True, "replay_layers": 20,
                                            "replay_tokens": 128}}
    return p


def _fit_stage(p: Profile, names: list[str], residual: Callable[[Profile], np.ndarray],
               fitted_to: list[str], source: str, diff_step: float | None = None,
               starts: list[dict[str, float]] | None = None) -> Profile:
    """Least squares over `names` (bounded by START); with `starts`, also from each of those
    starting points (a fixed multi-start), keeping the lowest cost."""
    lo = np.array([START[n][1] for n in names])
    hi = np.array([START[n][2] for n in names])

    def f(x: np.ndarray) -> np.ndarray:
        return residual(p.with_values(dict(zip(names, x, strict=True))))

    best = None
    for start in [{}] + (starts or []):
        x0 = np.array([start.get(n, p.value(n)) for n in names])
        x0 = np.clip(x0, lo + 1e-9 * (hi - lo), hi - 1e-9 * (hi - lo))
        res = least_squares(f, x0, bounds=(lo, hi), x_scale="jac", diff_step=diff_step)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    out = p.with_values(dict(zip(names, best.x, strict=True)))
    for n in names:
        out.params[n].update(unit=START[n][3], fitted_to=fitted_to, source=source)
        _flag_bound(out, n)
    return out


def _flag_bound(p: Profile, name: str) -> None:
    """Mark `name` when a bound of START, not the data, set its value."""
    entry, (_, lo, hi, _) = p.params[name], START[name]
    entry.pop("at_bound", None)
    if min(entry["value"] - lo, hi - entry["value"]) <= 1e-6 * (hi - lo):
        entry["at_bound"] = f"[{lo}, {hi}]"


def _rel(pred: dict[str, float], pub: dict[str, float], keys: list[str],
         sigma: dict[str, float] | None = None) -> np.ndarray:
    """Relative residuals of `keys`; keys whose figure is not in `pub` (left out by
    fit_published's `exclude`) are skipped, so a stage may have no residual left."""
    sigma = sigma or {}
    return np.array([(pred[k] / pub[k.split("@")[0]] - 1.0) / sigma.get(k.split("@")[0], 1.0)
                     for k in keys if k.split("@")[0] in pub])


def fit_kernels(p: Profile, log: Callable[[str], None]) -> Profile:
    root = aic.aic_root()
    if root is None:
        log(AIC_MISSING)
        return p
    cfg = operating_point()
    hw, wb = cfg.hardware, cfg.model.weight_bytes_per_param
    rows = aic.load_moe_rows(root)
    fit, kernel = aic.fit_moe(rows, hw.hbm_bw_bytes_s, hw.flops["fp4"], wb)
    src = f"aiconfigurator-core {aic.aic_version()} {aic.MOE_TABLE}"
    tag = [f"aic:moe_perf V4-Flash shape, EP {list(aic.FIT_EP)}"]
    for name, val in (("moe_kernel_us", fit.kernel_us), ("moe_hbm_efficiency", fit.hbm_efficiency),
                      ("moe_flops_efficiency", fit.flops_efficiency),
                      ("moe_token_bytes", fit.token_bytes)):
        p.set_param(name, val, START[name][3], tag, src)
    held = aic.held_out_errors(kernel, rows, wb)
    idx_rows = aic.load_indexer_rows(root)
    per_layer = cfg.model.indexer_bytes_per_token / p.value("csa_layers")
    k_us, eff, idx_err = aic.fit_indexer(idx_rows, hw.hbm_bw_bytes_s, per_layer)
    isrc = f"aiconfigurator-core {aic.aic_version()} {aic.INDEXER_TABLE}"
    p.set_param("indexer_kernel_us", k_us, START["indexer_kernel_us"][3],
                ["aic:dsv4_paged_mqa_logits isl=1"], isrc)
    p.set_param("indexer_hbm_efficiency", eff, START["indexer_hbm_efficiency"][3],
                ["aic:dsv4_paged_mqa_logits isl=1"], isrc)
    p.kernel_fit = {
        "source": f"aiconfigurator-core {aic.aic_version()}",
        "moe": {"table": aic.MOE_TABLE, "shape": aic.MOE_SHAPE, "fit_ep": list(aic.FIT_EP),
                "fit_rows": fit.fit_rows, "fit_median_abs_err": fit.fit_median_abs_err,
                "fit_p90_abs_err": fit.fit_p90_abs_err,
                "held_out": json.loads(held.to_json(orient="records"))},
        "indexer": {"table": aic.INDEXER_TABLE, "rows": len(idx_rows),
                    "median_abs_err": idx_err},
    }
    log(f"kernel fit: MoE median |err| {fit.fit_median_abs_err:.1%} on {fit.fit_rows} rows; "
        f"indexer median |err| {idx_err:.1%}")
    log("held-out EP widths:\n" + held.to_string(index=False))
    return fit_context_kernels(p, root, log)


def _set_table_fit(p: Profile, key: str, fit: aic.TableFit, names: dict[str, str]) -> None:
    """Store `fit`'s values under the profile names `names` (fit name -> parameter) and its
    quality under kernel_fit[key]; the parameters are tagged 'aic:<key>'."""
    src = f"aiconfigurator-core {aic.aic_version()} {fit.table}"
    for short, name in names.items():
        p.set_param(name, fit.values[short], START[name][3], [f"aic:{key}"], src)
        _flag_bound(p, name)
    p.kernel_fit[key] = fit.record()


def fit_context_kernels(p: Profile, root: Path, log: Callable[[str], None]) -> Profile:
    """Dense GEMMs, mHC, prefill sparse attention and index logits (each with held-out rows),
    then a check of their sum over one attention layer against the measured module tables."""
    cfg = operating_point()
    hw = cfg.hardware
    bw = hw.hbm_bw_bytes_s
    gemms = {d: aic.fit_gemm(aic.load_gemm_rows(root, d), d, bw, hw.flops[d])
             for d in ("fp8", "bf16")}
    for dtype, fit in gemms.items():
        _set_table_fit(p, f"gemm_{dtype}", fit, {k: f"gemm_{dtype}_{k}" for k in fit.values})
    other = aic.FP8_BLOCK_CHECK_ROWS
    p.kernel_fit["gemm_fp8"]["check"] = {
        "table": f"{other.table} ({other.gemm_dtype}, {other.kernel_source})",
        **aic.check_gemm(gemms["fp8"], aic.load_gemm_rows(root, "fp8", other), "fp8", bw,
                         hw.flops["fp8"])}
    p.set_param("gemm_fp8_quant_bytes", aic.FP8_GROUP_QUANT_BYTES,
                START["gemm_fp8_quant_bytes"][3], [], "fit in progress")
    fit = aic.fit_mhc(aic.load_mhc_rows(root), bw, cfg.model.hidden_size)
    _set_table_fit(p, "mhc", fit, {k: f"mhc_{k}" for k in fit.values})
    geometry = CalibratedStepModel(cfg, "prefill", profile=p, balancedness=(1.0, 1.0)).attn
    fit = aic.fit_prefill_attention(aic.load_prefill_attention_rows(root), geometry, bw,
                                    hw.flops["bf16"])
    _set_table_fit(p, "prefill_attention", fit, {k: f"prefill_attn_{k}" for k in fit.values})
    fit = aic.fit_prefill_indexer(aic.load_prefill_indexer_rows(root), geometry,
                                  hw.flops["fp8"])
    _set_table_fit(p, "prefill_indexer", fit, {k: f"prefill_indexer_{k}" for k in fit.values})
    for key in ("gemm_fp8", "gemm_bf16", "mhc", "prefill_attention", "prefill_indexer"):
        r = p.kernel_fit[key]
        log(f"kernel fit {key}: median/p90 |err| {r['fit_median_abs_err']:.1%}/"
            f"{r['fit_p90_abs_err']:.1%} on {r['fit_rows']} rows; held out ({r['held_out']}) "
            f"{r['held_median_abs_err']:.1%}/{r['held_p90_abs_err']:.1%} on "
            f"{r['held_rows']} rows")
    modules = {k: aic.load_module_rows(root, k) for k in aic.MODULE_TABLES}
    topk = LOGIT_BYTES / (bw / 1e3)
    model = CalibratedStepModel(cfg, "prefill", profile=p, balancedness=(1.0, 1.0))
    quant = aic.fit_fp8_activation_bytes(modules[aic.ACTIVATION_FIT_KIND], model.dense.gemms,
                                         model.dense.kernels, model.attn, topk)
    p.set_param("gemm_fp8_quant_bytes", quant, START["gemm_fp8_quant_bytes"][3],
                [f"aic:attention_module {aic.ACTIVATION_FIT_KIND}"],
                f"aiconfigurator-core {aic.aic_version()} "
                f"{aic.MODULE_TABLES[aic.ACTIVATION_FIT_KIND]} (the layer's other parts at "
                "their own table fits); what vLLM's FP8 linear layers pay beyond the DeepGEMM "
                "kernel (activation quantisation, scale layout); bounded below by the "
                f"{aic.FP8_GROUP_QUANT_BYTES:.2f} bytes the quantisation itself moves")
    model = CalibratedStepModel(cfg, "prefill", profile=p, balancedness=(1.0, 1.0))
    check = aic.check_attention_module(modules, model.dense.gemms, model.dense.kernels,
                                       model.attn, topk)
    p.kernel_fit["attention_module"] = check
    log(f"FP8 activation bytes per input element {quant:.2f}, fitted to the "
        f"{aic.ACTIVATION_FIT_KIND} attention-module rows; attention layer (GEMMs + sparse "
        "attention + index logits) vs the module tables: "
        + "; ".join(f"{k} ({v['role']}) median {v['median_error']:+.1%}, median/p90 |err| "
                    f"{v['median_abs_err']:.1%}/{v['p90_abs_err']:.1%}"
                    for k, v in check["kinds"].items()))
    fp8 = p.kernel_fit["gemm_fp8"]["check"]
    log(f"FP8 GEMM fit on {fp8['table']}: median/p90 |err| {fp8['median_abs_err']:.1%}/"
        f"{fp8['p90_abs_err']:.1%} on {fp8['rows']} rows")
    return p


def decode_balancedness(p: Profile) -> dict[int, tuple[float, float]]:
    t = figures.targets()
    cfg = operating_point()
    m = cfg.model
    return {w: (figures.predict_balancedness(p, "target", m.num_routed_experts, w, True,
                                             t["eplb"]["layers"], t["eplb"]["steps"]),
                figures.predict_balancedness(p, "draft", m.draft.num_routed_experts, w, True,
                                             t["eplb"]["layers"], t["eplb"]["steps"]))
            for w in t["decode"]["widths"]}


def fit_published(p: Profile, log: Callable[[str], None],
                  exclude: frozenset[str] = frozenset()) -> Profile:
    """Stages 2-7. `exclude`: figure ids (e.g. {"D3"}) whose rows are left out of every stage
    (leave-one-out); parameters fitted only to left-out figures keep their initial guesses."""
    pub = {k: v for k, v in figures.published_values().items()
           if k.split(".")[0] not in exclude}
    unknown = exclude - {k.split(".")[0] for k in figures.published_values()}
    if unknown:
        raise ValueError(f"exclude: no fitted figure {sorted(unknown)}")
    sigma = figures.targets().get("sigma", {})
    csv_src = "calibration/published_figures.csv"
    for which, fid in (("target", "E1"), ("draft", "E2")):
        names = [f"eplb_sigma_group_{which}", f"eplb_sigma_{which}"]
        keys = [f"{fid}.off", f"{fid}.on"]

        def r_eplb(q: Profile, keys: list[str] = keys) -> np.ndarray:
            return _rel(figures.predict_eplb(q), pub, keys)
        p = _fit_stage(p, names, r_eplb, [fid], csv_src, diff_step=0.05)
    log("fitted EPLB skew (E1, E2)")
    p = _fit_stage(p, ["allreduce_call_ms", "allreduce_hop_ms"],
                   lambda q: _rel(figures.predict_cpu(q), pub,
                                  ["C1.ring", "C1.recursive_doubling"]), ["C1"], csv_src)
    p = _fit_stage(p, ["admission_ns_per_token_baseline", "admission_ns_per_token"],
                   lambda q: _rel(figures.predict_cpu(q), pub, ["C2.baseline", "C2.optimised"]),
                   ["C2"], csv_src)
    log("fitted CPU all-reduce and admission (C1, C2)")
    b = decode_balancedness(p)
    widths = figures.targets()["decode"]["widths"]
    d_keys = ["D1", "D2", "D3", "D4"] + [f"D5@DEP{w}" for w in widths]
    # Jitter also delays decode steps, so D5 (decode time outside MoE) constrains it too.
    d5 = [f"D5@DEP{w}" for w in widths]
    d_names = ["megamoe_hbm_efficiency", "megamoe_kernel_us", "attn_flops_efficiency",
               "dense_kernel_us",
               "a2a_op_us", "a2a_nvlink_efficiency", "cpu_step_ms"]
    for _ in range(2):
        p = _fit_stage(p, d_names,
                       lambda q: _rel(figures.predict_decode(q, b), pub, d_keys, sigma),
                       ["D1", "D2", "D3", "D4", "D5"], csv_src)
        p = _fit_stage(p, ["straggler_jitter_us", "straggler_lag_us", "straggler_absorb"],
                       lambda q: np.concatenate([
                           _rel(figures.predict_stragglers(q), pub, ["P1", "P2"]),
                           _rel(figures.predict_decode(q, b), pub, d5, sigma)]),
                       ["P1", "P2", "D5"], csv_src, diff_step=1e-2,
                       starts=[{"straggler_jitter_us": j, "straggler_lag_us": lag,
                                "straggler_absorb": a}
                               for j in (0.1, 50.0) for lag in (1000.0, 4000.0)
                               for a in (0.0, 0.05)])
        p = _fit_stage(p, ["replay_tokens_baseline", "tlb_overhead", "topk_ns_per_candidate"],
                       lambda q: _rel(figures.predict_prefill_opts(q), pub, ["P3", "P4", "P5"]),
                       ["P3", "P4", "P5"], csv_src)
    log("fitted decode breakdown (D1-D5), stragglers (P1, P2), prefill toggles (P3-P5)")
    # Last: the TP small-batch path shares the kernel/dense/all-reduce speeds fitted above and
    # adds only its exposed per-layer latency (standard vs specialised kernels).
    p = _fit_stage(p, ["tp_layer_latency_us_standard", "tp_layer_latency_us_low_latency"],
                   lambda q: _rel(figures.predict_low_latency(q), pub,
                                  ["L1.standard", "L1.low_latency"]), ["L1"], csv_src)
    log("fitted small-batch TP decode latency (L1); L2 predicted")
    for entry in p.params.values():
        if exclude and any(t in exclude for t in entry["fitted_to"]):
            entry["fitted_to"] = [t for t in entry["fitted_to"] if t not in exclude]
            if not entry["fitted_to"]:
                entry["source"] = "initial guess (not fitted: its figures were left out)"
    return p


def fit_table(p: Profile) -> list[dict[str, object]]:
    """Every published figure the model predicts: published, predicted, relative error."""
    pub = figures.published_values()
    pred: dict[str, float] = {}
    pred.update(figures.predict_decode(p, decode_balancedness(p)))
    pred.update(figures.predict_eplb(p))
    pred.update(figures.predict_cpu(p))
    pred.update(figures.predict_stragglers(p))
    pred.update(figures.predict_prefill_opts(p))
    pred.update(figures.predict_low_latency(p))
    rows: list[dict[str, object]] = []
    for k, v in pred.items():
        ref = pub[k.split("@")[0]]
        rows.append({"figure": k, "published": ref, "predicted": float(v),
                     "error": float(v / ref - 1.0)})
    e4 = figures.predict_rebalance_s(p)
    rows.append({"figure": "E4", "published": "<1 s", "predicted": e4,
                 "error": "ok" if e4 < 1.0 else "violated"})
    return rows


def calibrate(previous: Profile | None, use_aic: bool, log: Callable[[str], None],
              exclude: frozenset[str] = frozenset()) -> Profile:
    p = start_profile(previous)
    if use_aic:
        p = fit_kernels(p, log)
    elif previous is not None and previous.kernel_fit:
        p.kernel_fit = previous.kernel_fit
        log("--no-aic: kernel parameters kept from the previous profile")
    else:
        log("--no-aic: kernel parameters stay at their initial guesses (not fitted)")
    p = fit_published(p, log, exclude)
    p.residuals = fit_table(p)
    _record_quality(p)
    p.meta = {"hardware": "GB300-NVL72", "model": "DeepSeek-V4.1-Flash",
              "created_by": "racksim-calibrate (rackSim.calibrate.command)",
              "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "figures": "calibration/published_figures.csv",
              "operating_points": "calibration/targets__gb300__deepseek_v4_1_flash.yaml"}
    return p


def _record_quality(p: Profile) -> None:
    """Give each parameter the fit quality of the data it was fitted to: the largest |relative
    error| among its published figures, or the kernel-table median/p90 |error|."""
    errors: dict[str, list[float]] = {}
    for row in p.residuals:
        if isinstance(row["error"], float):
            fid = str(row["figure"]).split(".")[0].split("@")[0]
            errors.setdefault(fid, []).append(abs(row["error"]))
    moe, idx = p.kernel_fit.get("moe", {}), p.kernel_fit.get("indexer", {})
    for entry in p.params.values():
        tags = entry.get("fitted_to") or []
        if any(str(t).startswith("aic:moe") for t in tags) and moe:
            entry["fit_quality"] = {"median_abs_err": moe["fit_median_abs_err"],
                                    "p90_abs_err": moe["fit_p90_abs_err"]}
        elif any(str(t).startswith("aic:dsv4") for t in tags) and idx:
            entry["fit_quality"] = {"median_abs_err": idx["median_abs_err"]}
        elif tags and str(tags[0]).startswith("aic:attention_module"):
            kinds = p.kernel_fit["attention_module"]["kinds"]
            entry["fit_quality"] = {
                f"{k}_{'fitted' if k == aic.ACTIVATION_FIT_KIND else 'held_out'}_{q}": r[q]
                for k, r in kinds.items() for q in ("median_abs_err", "p90_abs_err")}
        elif tags and str(tags[0]).removeprefix("aic:") in p.kernel_fit:
            r = p.kernel_fit[str(tags[0]).removeprefix("aic:")]
            entry["fit_quality"] = {k: r[k] for k in (
                "fit_median_abs_err", "fit_p90_abs_err", "held_median_abs_err",
                "held_p90_abs_err")}
        else:
            errs = [e for t in tags for e in errors.get(str(t), [])]
            if errs:
                entry["fit_quality"] = {"max_abs_err_of_figures": max(errs)}


def format_table(rows: list[dict[str, object]]) -> str:
    lines = [f"{'figure':<26}{'published':>12}{'predicted':>12}{'error':>10}"]
    for r in rows:
        pub, pred, err = r["published"], r["predicted"], r["error"]
        pub_s = f"{pub:>12.4g}" if isinstance(pub, float) else f"{pub!s:>12}"
        err_s = f"{err:>+10.1%}" if isinstance(err, float) else f"{err!s:>10}"
        lines.append(f"{r['figure']!s:<26}{pub_s}{float(pred):>12.4g}{err_s}")
    return "\n".join(lines)


def write(p: Profile, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    p.save(out)
