"""Fits against the GB300 vLLM kernel tables shipped in NVIDIA's `aiconfigurator-core`.

The tables are read from the installed package at run time (never copied into the repo):

* MoE: `systems/data/gb300/moe/vllm/0.24.0/moe_perf.parquet`, the DeepSeek-V4-Flash expert shape
  (hidden 4096, expert intermediate 2048, 256 experts, top-6, MXFP4 weights / MXFP8
  activations, `balanced` routing, moe_tp 1). `num_tokens` there are the tokens entering the
  EP group; each rank runs its `256 / ep` experts. EP widths in FIT_EP are fitted, those in
  HELD_OUT_EP are only predicted (the held-out check).
* Indexer: `sparse_attention/vllm/0.24.0/dsv4_paged_mqa_logits_module_perf.parquet`, the decode
  (isl 1) index-logits kernel of DeepSeek-V4-Flash, by batch size and context (`step`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from rackSim.perf.attention import AttentionCost
from rackSim.perf.dense import (
    ACTIVATION_BYTES,
    WEIGHT_BYTES,
    DenseCost,
    DenseGeometry,
    Gemm,
    GemmKernel,
    mhc_bytes_per_token,
)
from rackSim.perf.moe import MoeKernel, experts_hit_balanced

FIT_EP = (1, 2, 8, 32, 128)
HELD_OUT_EP = (4, 16, 64, 256)
MOE_TABLE = "systems/data/gb300/moe/vllm/0.24.0/moe_perf.parquet"
INDEXER_TABLE = ("systems/data/gb300/sparse_attention/vllm/0.24.0/"
                 "dsv4_paged_mqa_logits_module_perf.parquet")
MOE_SHAPE = {"moe_dtype": "w4a8_mxfp4_mxfp8", "hidden_size": 4096, "inter_size": 2048,
             "topk": 6, "num_experts": 256, "moe_tp_size": 1, "distribution": "balanced"}


def aic_root() -> Path | None:
    """Directory of the installed aiconfigurator_core package, or None if not installed."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def aic_version() -> str:
    from importlib.metadata import version

    return version("aiconfigurator-core")


def load_moe_rows(root: Path) -> pd.DataFrame:
    df = pd.read_parquet(root / MOE_TABLE)
    for k, v in MOE_SHAPE.items():
        df = df[df[k] == v]
    return df[["num_tokens", "moe_ep_size", "latency"]].reset_index(drop=True)


def load_indexer_rows(root: Path) -> pd.DataFrame:
    df = pd.read_parquet(root / INDEXER_TABLE)
    df = df[(df.isl == 1) & (df.step > 0)]
    return df[["batch_size", "step", "latency"]].reset_index(drop=True)


@dataclass(frozen=True)
class MoeTableFit:
    kernel_us: float
    hbm_efficiency: float
    flops_efficiency: float
    token_bytes: float
    fit_rows: int
    fit_median_abs_err: float
    fit_p90_abs_err: float


def _moe_kernel(x: np.ndarray, hbm_bw: float, flops: float) -> MoeKernel:
    return MoeKernel(kernel_ms=x[0] / 1e3, hbm_bytes_ms=hbm_bw / 1e3 * x[1],
                     flops_ms=flops / 1e3 * x[2], token_bytes=x[3])


def predict_moe_rows(kernel: MoeKernel, rows: pd.DataFrame, weight_bytes_per_param: float,
                     shape: dict[str, object] = MOE_SHAPE) -> np.ndarray:
    """Predicted layer latency (ms) of each table row (of expert `shape`) under `kernel`."""
    h, i, k, e = (int(shape[c]) for c in ("hidden_size", "inter_size", "topk", "num_experts"))
    params = 3.0 * h * i
    out = np.empty(len(rows))
    for j, (n, ep) in enumerate(zip(rows.num_tokens, rows.moe_ep_size, strict=True)):
        local = e / ep
        assignments = n * k
        hit = experts_hit_balanced(local, e, assignments)
        out[j] = kernel.layer_ms(n, assignments / ep, hit, params * weight_bytes_per_param,
                                 params, h)
    return out


def rel_errors(pred: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return pred / measured - 1.0


def fit_moe(rows: pd.DataFrame, hbm_bw: float, flops: float, weight_bytes_per_param: float
            ) -> tuple[MoeTableFit, MoeKernel]:
    """Least-squares fit of the MoE kernel speeds to the FIT_EP rows (log-ratio residuals)."""
    fit = rows[rows.moe_ep_size.isin(FIT_EP)]
    measured = fit.latency.to_numpy()

    def resid(x: np.ndarray) -> np.ndarray:
        pred = predict_moe_rows(_moe_kernel(x, hbm_bw, flops), fit, weight_bytes_per_param)
        return np.log(pred / measured)

    res = least_squares(resid, x0=[20.0, 0.8, 0.3, 2.0],
                        bounds=([0.0, 0.05, 0.01, 0.0], [200.0, 1.0, 1.0, 200.0]))
    kernel = _moe_kernel(res.x, hbm_bw, flops)
    err = np.abs(rel_errors(predict_moe_rows(kernel, fit, weight_bytes_per_param), measured))
    return MoeTableFit(float(res.x[0]), float(res.x[1]), float(res.x[2]), float(res.x[3]),
                       len(fit), float(np.median(err)), float(np.quantile(err, 0.9))), kernel


def held_out_errors(kernel: MoeKernel, rows: pd.DataFrame, weight_bytes_per_param: float
                    ) -> pd.DataFrame:
    """Per-EP-width error summary of the MoE model on the HELD_OUT_EP rows."""
    out = []
    for ep in HELD_OUT_EP:
        sub = rows[rows.moe_ep_size == ep]
        err = np.abs(rel_errors(predict_moe_rows(kernel, sub, weight_bytes_per_param),
                                sub.latency.to_numpy()))
        out.append({"ep": ep, "rows": len(sub), "median_abs_err": float(np.median(err)),
                    "p90_abs_err": float(np.quantile(err, 0.9)),
                    "max_abs_err": float(err.max())})
    return pd.DataFrame(out)


def fit_indexer(rows: pd.DataFrame, hbm_bw: float, bytes_per_token_layer: float
                ) -> tuple[float, float, float]:
    """Fit (kernel_us, hbm_efficiency) of the decode index-logits kernel:
    latency = kernel + batch * context * bytes_per_token_layer / (hbm * eff).
    Returns (kernel_us, hbm_efficiency, median_abs_err)."""
    work = (rows.batch_size * rows.step).to_numpy() * bytes_per_token_layer / (hbm_bw / 1e3)
    measured = rows.latency.to_numpy()

    def resid(x: np.ndarray) -> np.ndarray:
        return np.log((x[0] / 1e3 + work / x[1]) / measured)

    res = least_squares(resid, x0=[5.0, 0.5], bounds=([0.0, 0.01], [100.0, 1.0]))
    pred = res.x[0] / 1e3 + work / res.x[1]
    err = float(np.median(np.abs(pred / measured - 1.0)))
    return float(res.x[0]), float(res.x[1]), err


# -- context-phase (prefill) and dense tables ---------------------------------------------------
SPARSE = "systems/data/gb300/sparse_attention/vllm/0.24.0/"
GEMM_TABLE = "systems/data/gb300/gemm/vllm/0.24.0/gemm_perf.parquet"
PREFILL_ATTN_TABLE = SPARSE + "dsv4_hca_attn_module_perf.parquet"
MHC_TABLE = "systems/data/gb300/mhc/vllm/0.24.0/mhc_module_perf.parquet"
MODULE_TABLES = {"hca": SPARSE + "dsv4_hca_context_module_perf.parquet",
                 "csa": SPARSE + "dsv4_csa_context_module_perf.parquet"}
#: the V4-Flash rows of the attention-module tables (one layer, 64 heads, no TP)
MODULE_MODEL = {"model": "sgl-project/DeepSeek-V4-Flash-FP8", "num_heads": 64, "tp_size": 1}


@dataclass(frozen=True)
class GemmRows:
    """The rows of one aiconfigurator-core GEMM table that price one of our GEMM dtypes.

    quantises: the measured kernel includes the dynamic activation quantisation (the fit then
    has a `quant_bytes` term); False for kernels whose inputs are already FP8.
    """

    table: str
    gemm_dtype: str
    kernel_source: str
    quantises: bool


#: FP8 block-quantised GEMMs (V4's linear layers): vLLM runs them with DeepGEMM
#: (`DeepGemmFp8BlockScaledMMKernel`) after `per_token_group_quant_fp8`. The vLLM collection's
#: DeepGEMM rows sit on a 0.25-0.9 ms floor at every shape up to 1K rows (a harness cost: the
#: same kernel collected by SGLang and TRT-LLM runs a 1K x 1024 x 4096 GEMM in 11-12 us), so
#: the SGLang collection of the same kernel on the same GPU is fitted and TRT-LLM's checks it.
FP8_BLOCK_ROWS = GemmRows("systems/data/gb300/gemm/sglang/0.5.14/gemm_perf.parquet",
                          "fp8_block", "sglang_deepgemm_gemm_nt_f8f8bf16", quantises=False)
FP8_BLOCK_CHECK_ROWS = GemmRows("systems/data/gb300/gemm/trtllm/1.3.0rc20/gemm_perf.parquet",
                                "fp8_block", "deepgemm", quantises=False)
#: our GEMM dtype -> the rows that price it in the reference profile
GEMM_ROWS = {"fp8": FP8_BLOCK_ROWS,
             "bf16": GemmRows(GEMM_TABLE, "bfloat16", "torch.nn.functional.linear", False)}
#: HBM bytes per input element of `per_token_group_quant_fp8` ahead of a DeepGEMM call: it
#: reads the BF16 activation (2), writes FP8 (1) and one FP32 scale per 128 elements. The
#: lower bound of `gemm_fp8_quant_bytes` (`fit_fp8_activation_bytes`).
FP8_GROUP_QUANT_BYTES = 2.0 + 1.0 + 4.0 / 128
#: the attention-module table `fit_fp8_activation_bytes` fits; the other kind is held out
ACTIVATION_FIT_KIND = "hca"


def vllm_gemm_rows(dtype: str, table: str) -> GemmRows:
    """The rows of a vLLM GEMM table (`table`) for `dtype`: per-tensor FP8 (CUTLASS, the
    activation quantisation included) or BF16. Generated profiles (any model on any GPU) use
    these: the FP8 checkpoints they serve are per-tensor or per-channel."""
    if dtype == "fp8":
        return GemmRows(table, "fp8", "CutlassFP8ScaledMMLinearKernel", quantises=True)
    return GemmRows(table, "bfloat16", "torch.nn.functional.linear", quantises=False)


#: smallest N and K fitted (the model's smallest GEMM is the indexer weights_proj, N = 64)
GEMM_MIN_N, GEMM_MIN_K = 64, 256
#: module rows checked: enough tokens for prefill (>= 1K per call)
MODULE_MIN_TOKENS = 1024


@dataclass(frozen=True)
class TableFit:
    """Parameters fitted to a kernel table by least squares on log(predicted / measured), with
    the |relative error| on the fitted rows and on the rows held out."""

    values: dict[str, float]
    table: str
    held_out: str
    fit_rows: int
    held_rows: int
    fit_median_abs_err: float
    fit_p90_abs_err: float
    held_median_abs_err: float
    held_p90_abs_err: float

    def record(self) -> dict[str, object]:
        """The profile's `kernel_fit` entry."""
        out: dict[str, object] = {k: getattr(self, k) for k in (
            "table", "held_out", "fit_rows", "held_rows", "fit_median_abs_err",
            "fit_p90_abs_err", "held_median_abs_err", "held_p90_abs_err")}
        return out


def fit_rows(predict: Callable[[np.ndarray], np.ndarray], measured: np.ndarray,
             held: np.ndarray, names: Sequence[str], x0: Sequence[float],
             bounds: tuple[Sequence[float], Sequence[float]], table: str, held_out: str
             ) -> TableFit:
    """Least squares of `predict(x)` (all rows) against `measured` on the rows not `held`."""
    fit = ~held

    def resid(x: np.ndarray) -> np.ndarray:
        return np.log(predict(x)[fit] / measured[fit])

    res = least_squares(resid, x0=list(x0), bounds=bounds)
    err = np.abs(rel_errors(predict(res.x), measured))
    return TableFit(dict(zip(names, map(float, res.x), strict=True)), table, held_out,
                    int(fit.sum()), int(held.sum()), float(np.median(err[fit])),
                    float(np.quantile(err[fit], 0.9)), float(np.median(err[held])),
                    float(np.quantile(err[held], 0.9)))


def every_third(values: np.ndarray, offset: int = 1) -> set[float]:
    """Every third distinct value (sorted), starting at `offset`: a deterministic hold-out."""
    return {v for i, v in enumerate(sorted(set(values.tolist()))) if i % 3 == offset}


def load_gemm_rows(root: Path, dtype: str, rows: GemmRows | None = None) -> pd.DataFrame:
    """The (m, n, k, latency) rows that price `dtype` (default: the reference profile's)."""
    r = rows or GEMM_ROWS[dtype]
    df = pd.read_parquet(root / r.table)
    df = df[(df.gemm_dtype == r.gemm_dtype) & (df.kernel_source == r.kernel_source)
            & (df.n >= GEMM_MIN_N) & (df.k >= GEMM_MIN_K)]
    return df[["m", "n", "k", "latency"]].reset_index(drop=True)


def gemm_predict(x: Sequence[float], dtype: str, hbm_bw: float, flops: float,
                 quant_bytes: float) -> GemmKernel:
    """The GEMM kernel of fitted speeds `x` = (kernel us, HBM efficiency, FLOP efficiency)."""
    return GemmKernel(x[0] / 1e3, hbm_bw / 1e3 * x[1], flops / 1e3 * x[2], quant_bytes,
                      WEIGHT_BYTES[dtype], ACTIVATION_BYTES[dtype])


def fit_gemm(rows: pd.DataFrame, dtype: str, hbm_bw: float, flops: float,
             source: GemmRows | None = None) -> TableFit:
    """GEMM speeds of `dtype` (dense.GemmKernel); every fourth (N, K) shape held out. A
    `quant_bytes` term is fitted only when the measured kernel quantises its input."""
    src = source or GEMM_ROWS[dtype]
    m, n, k = (rows[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
    shapes = sorted(set(zip(rows.n, rows.k, strict=True)))
    held_shapes = {s for i, s in enumerate(shapes) if i % 4 == 3}
    held = np.array([s in held_shapes for s in zip(rows.n, rows.k, strict=True)])

    def predict(x: np.ndarray) -> np.ndarray:
        return gemm_predict(x, dtype, hbm_bw, flops, x[3] if src.quantises else 0.0).ms(m, n, k)

    names = ["kernel_us", "hbm_efficiency", "flops_efficiency"] + (["quant_bytes"]
                                                                    if src.quantises else [])
    x0, lo, hi = [5.0, 0.7, 0.6, 2.0], [0.0, 0.01, 0.01, 0.0], [200.0, 1.0, 1.0, 100.0]
    size = len(names)
    return fit_rows(predict, rows.latency.to_numpy(), held, names, x0[:size],
                    (lo[:size], hi[:size]), f"{src.table} ({src.gemm_dtype}, {src.kernel_source})",
                    "every fourth (N, K) shape")


def check_gemm(fit: TableFit, rows: pd.DataFrame, dtype: str, hbm_bw: float, flops: float
               ) -> dict[str, float]:
    """Median / 90th-percentile |error| of a GEMM fit on another collection's rows."""
    x = [fit.values[k] for k in ("kernel_us", "hbm_efficiency", "flops_efficiency")]
    pred = gemm_predict(x, dtype, hbm_bw, flops, 0.0).ms(
        *(rows[c].to_numpy(dtype=float) for c in ("m", "n", "k")))
    err = np.abs(rel_errors(pred, rows.latency.to_numpy()))
    return {"rows": int(len(rows)), "median_abs_err": float(np.median(err)),
            "p90_abs_err": float(np.quantile(err, 0.9))}


def load_prefill_attention_rows(root: Path) -> pd.DataFrame:
    df = pd.read_parquet(root / PREFILL_ATTN_TABLE)
    df = df[df.isl > 1]
    return df[["batch_size", "isl", "step", "latency"]].reset_index(drop=True)


def one_layer_attention(kind: str, geometry: AttentionCost, x: Sequence[float],
                        hbm_bw: float, bf16_flops: float, fp8_flops: float) -> AttentionCost:
    """A one-layer stack of `kind` ('csa' or 'hca') with the prefill speeds `x` = (attention
    kernel us, chunk us, query-bytes HBM efficiency, FLOP efficiency, indexer kernel us,
    indexer ns per row, indexer FLOP efficiency); the rest of `geometry` is kept."""
    return replace(
        geometry, layers=1, csa_layers=int(kind == "csa"), hca_layers=int(kind == "hca"),
        prefill_kernel_ms=x[0] / 1e3, prefill_chunk_ms=x[1] / 1e3,
        prefill_bytes_ms=hbm_bw / 1e3 * x[2], prefill_flops_ms=bf16_flops / 1e3 * x[3],
        indexer_kernel_ms_prefill=x[4] / 1e3, indexer_row_ms_prefill=x[5] * 1e-6,
        indexer_flops_ms_prefill=fp8_flops / 1e3 * x[6])


def fit_prefill_attention(rows: pd.DataFrame, geometry: AttentionCost, hbm_bw: float,
                          bf16_flops: float) -> TableFit:
    """Prefill sparse-attention speeds (attention.prefill_attention_ms, one HCA layer) fitted to
    `flash_mla_sparse_fwd` rows (isl > 1); every third prefix length held out."""
    b, isl, s = (rows[c].to_numpy(dtype=float) for c in ("batch_size", "isl", "step"))
    held = np.isin(s, list(every_third(s)))

    def predict(x: np.ndarray) -> np.ndarray:
        a = one_layer_attention("hca", geometry, [*x, 0.0, 0.0, 1.0], hbm_bw, bf16_flops, 1.0)
        return np.array([a.prefill_attention_ms(bi * li, si + li / 2.0, bi)
                         for bi, li, si in zip(b, isl, s, strict=True)])

    return fit_rows(predict, rows.latency.to_numpy(), held,
                    ["kernel_us", "chunk_us", "hbm_efficiency", "flops_efficiency"],
                    [10.0, 5.0, 0.5, 0.5], ([0.0, 0.0, 0.01, 0.01], [200.0, 100.0, 1.0, 1.0]),
                    PREFILL_ATTN_TABLE + " (isl > 1)", "every third prefix length (step)")


def load_prefill_indexer_rows(root: Path) -> pd.DataFrame:
    df = pd.read_parquet(root / INDEXER_TABLE)
    df = df[df.isl > 1]
    return df[["batch_size", "isl", "step", "latency"]].reset_index(drop=True)


def fit_prefill_indexer(rows: pd.DataFrame, geometry: AttentionCost, fp8_flops: float
                        ) -> TableFit:
    """Prefill index-logits speeds (attention.prefill_indexer_score_ms, one CSA layer) fitted
    to `fp8_fp4_paged_mqa_logits` rows with isl > 1. The collector packs batch x isl query
    rows of one causal sequence after `step` cached tokens, so each row is a query token at
    mean context step + rows / 2. Every third prefix length held out."""
    rows_n = (rows.batch_size * rows.isl).to_numpy(dtype=float)
    s = rows.step.to_numpy(dtype=float)
    held = np.isin(s, list(every_third(s)))

    def predict(x: np.ndarray) -> np.ndarray:
        a = one_layer_attention("csa", geometry, [0.0, 0.0, 1.0, 1.0, *x], 1.0, 1.0, fp8_flops)
        return np.array([a.prefill_indexer_score_ms(r, si + r / 2.0)
                         for r, si in zip(rows_n, s, strict=True)])

    return fit_rows(predict, rows.latency.to_numpy(), held,
                    ["kernel_us", "row_ns", "flops_efficiency"], [5.0, 5.0, 0.5],
                    ([0.0, 0.0, 0.01], [100.0, 1000.0, 1.0]),
                    INDEXER_TABLE + " (isl > 1)", "every third prefix length (step)")


def load_mhc_rows(root: Path) -> pd.DataFrame:
    """Pre + post latency per (tokens, hidden): one layer's two hyper-connection sites."""
    df = pd.read_parquet(root / MHC_TABLE)
    return (df.groupby(["num_tokens", "hidden_size", "hc_mult"], as_index=False).latency.sum())


def fit_mhc(rows: pd.DataFrame, hbm_bw: float, fit_hidden: int) -> TableFit:
    """mHC kernel time and HBM efficiency (dense.DenseCost.mhc_ms, one layer); the
    rows of the other hidden size (DeepSeek-V4-Pro's 7168) are held out."""
    held = rows.hidden_size.to_numpy() != fit_hidden
    costs = [mhc_bytes_per_token(replace(MHC_GEOMETRY, hidden=int(h), hc_mult=int(c)))
             for h, c in zip(rows.hidden_size, rows.hc_mult, strict=True)]

    def predict(x: np.ndarray) -> np.ndarray:
        return np.array([
            DenseCost((), {}, 1, x[0] / 1e3, c, hbm_bw / 1e3 * x[1]).mhc_ms(t)
            for t, c in zip(rows.num_tokens, costs, strict=True)])

    return fit_rows(predict, rows.latency.to_numpy(), held, ["kernel_us", "hbm_efficiency"],
                    [20.0, 0.5], ([0.0, 0.01], [200.0, 1.0]), MHC_TABLE + " (pre + post)",
                    "hidden size 7168 (DeepSeek-V4-Pro)")


#: geometry placeholder for mHC byte counts (only hidden and hc_mult matter)
MHC_GEOMETRY = DenseGeometry(hidden=0, layers=1, csa_layers=0, hca_layers=0, heads=0,
                             head_dim=0, q_lora_rank=0, o_lora_rank=0, o_groups=1,
                             indexer_heads=0, indexer_head_dim=0, shared_intermediate=0,
                             routed_experts=0, vocab=0, hc_mult=0)


def load_module_rows(root: Path, kind: str) -> pd.DataFrame:
    """One attention layer of `kind` ('csa', 'hca'), V4-Flash, no prefix, >= 1K tokens."""
    df = pd.read_parquet(root / MODULE_TABLES[kind])
    for k, v in MODULE_MODEL.items():
        df = df[df[k] == v]
    df = df[(df.step == 0) & (df.batch_size * df.isl >= MODULE_MIN_TOKENS)]
    return df[["batch_size", "isl", "latency"]].reset_index(drop=True)


def module_block_ms(kind: str, batch: float, isl: float, gemms: Sequence[Gemm],
                    kernels: dict[str, GemmKernel], attn: AttentionCost, topk_ms_per_pair: float
                    ) -> float:
    """One attention layer of `kind` for `batch` requests of `isl` new tokens, no prefix: its
    GEMMs, sparse attention, and (CSA) index logits and single-pass top-k (ms)."""
    tokens = batch * isl
    own = ("attn.", f"compressor.{kind}") + (("indexer.",) if kind == "csa" else ())
    total = sum(kernels[g.dtype].ms(tokens, g.n, g.k, g.groups) for g in gemms
                if g.name.startswith(own))
    layer = replace(attn, layers=1, csa_layers=int(kind == "csa"), hca_layers=int(kind == "hca"))
    total += layer.prefill_attention_ms(tokens, isl / 2.0, batch)
    if kind == "csa":
        total += layer.prefill_indexer_score_ms(tokens, isl / 2.0)
        total += layer.prefill_indexer_pairs(tokens, isl / 2.0) * topk_ms_per_pair
    return total


def _module_ms(kind: str, df: pd.DataFrame, gemms: Sequence[Gemm],
               kernels: dict[str, GemmKernel], attn: AttentionCost, topk_ms_per_pair: float
               ) -> np.ndarray:
    return np.array([module_block_ms(kind, b, i, gemms, kernels, attn, topk_ms_per_pair)
                     for b, i in zip(df.batch_size, df.isl, strict=True)])


def fit_fp8_activation_bytes(rows: pd.DataFrame, gemms: Sequence[Gemm],
                             kernels: dict[str, GemmKernel], attn: AttentionCost,
                             topk_ms_per_pair: float) -> float:
    """HBM bytes per input element that vLLM's FP8 linear layers pay beyond the DeepGEMM
    kernel (activation quantisation and scale layout), fitted to the measured V4-Flash
    attention-module rows of kind `ACTIVATION_FIT_KIND` (`rows`): every other part of the layer
    (GEMM kernels, sparse attention, index logits) is fixed at its own table fit. Bounded below
    by what the quantisation itself moves (`FP8_GROUP_QUANT_BYTES`)."""
    measured = rows.latency.to_numpy()

    def resid(x: np.ndarray) -> np.ndarray:
        k = dict(kernels, fp8=replace(kernels["fp8"], quant_bytes=float(x[0])))
        return np.log(_module_ms(ACTIVATION_FIT_KIND, rows, gemms, k, attn, topk_ms_per_pair)
                      / measured)

    res = least_squares(resid, x0=[2.0 * FP8_GROUP_QUANT_BYTES],
                        bounds=([FP8_GROUP_QUANT_BYTES], [100.0]))
    return float(res.x[0])


def check_attention_module(rows: dict[str, pd.DataFrame], gemms: Sequence[Gemm],
                           kernels: dict[str, GemmKernel], attn: AttentionCost,
                           topk_ms_per_pair: float) -> dict[str, object]:
    """The fitted parts summed over one attention layer (`module_block_ms`) against the
    measured CSA and HCA module tables: per kind, the median signed error and the median /
    90th-percentile |error|. Only `gemm_fp8_quant_bytes` saw a table (`ACTIVATION_FIT_KIND`);
    the other kind is held out."""
    kinds: dict[str, dict[str, float]] = {}
    for kind, df in rows.items():
        err = rel_errors(_module_ms(kind, df, gemms, kernels, attn, topk_ms_per_pair),
                         df.latency.to_numpy())
        kinds[kind] = {"rows": len(df), "median_error": float(np.median(err)),
                       "median_abs_err": float(np.median(np.abs(err))),
                       "p90_abs_err": float(np.quantile(np.abs(err), 0.9)),
                       "role": ("fitted (gemm_fp8_quant_bytes)" if kind == ACTIVATION_FIT_KIND
                                else "held out")}
    return {"tables": dict(MODULE_TABLES), "rows": (f"{MODULE_MODEL}, step 0, >= "
                                                    f"{MODULE_MIN_TOKENS} tokens"),
            "kinds": kinds}
