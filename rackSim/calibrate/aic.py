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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

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


def predict_moe_rows(kernel: MoeKernel, rows: pd.DataFrame, weight_bytes_per_param: float
                     ) -> np.ndarray:
    """Predicted layer latency (ms) of each table row under `kernel`."""
    h, i, k, e = (MOE_SHAPE[c] for c in ("hidden_size", "inter_size", "topk", "num_experts"))
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
