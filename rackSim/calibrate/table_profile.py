"""`racksim-calibrate profile --model M --hardware H`: a calibration profile for a generated
model (GQA or MLA attention) on a GPU, fitted to that GPU's vLLM kernel tables in
aiconfigurator-core (`hardware.kernel_tables` names the system directory).

Fits (least squares on log(predicted / measured), `aic.fit_rows`; rows left out of each fit
are predicted and their median and 90th-percentile |error| recorded under `kernel_fit`):

* GEMM (FP8, BF16): `dense.GemmKernel` speeds; every fourth (N, K) shape held out;
* MoE (the model's expert shape, precision and `balanced` routing): `moe.MoeKernel` speeds on
  every other EP width the table covers, the other widths held out;
* decode attention: GQA `generation_attention` rows of the model's heads, KV heads and head
  width at its KV precision; MLA `mla_generation_module` rows, whose module time is the MLA
  GEMMs (priced by the GEMM fit) plus the attention kernel; every third context length held out;
* prefill attention: `context_attention` / `mla_context_module` rows the same way, every third
  prompt length held out;
* all-to-all: DeepEP dispatch + combine (`comm.alltoall_layer_ms`), the low-latency kernels'
  rows (`a2a_*`, decode) and the normal kernels' (`a2a_ht_*`, prefill) each with the copies
  that kernel set sends (`moe.dispatched_tokens`), every third token count held out; TP
  all-reduce: vLLM's custom all-reduce under CUDA graphs, every third message size held out.

Where several kernels measure one point the fastest is taken (the one a tuned vLLM runs). What
no kernel table measures - per-step CPU, stragglers, expert-popularity skew, the per-layer
launch gaps of a decode step, the DP-sync all-reduce - is carried from the reference profile
(GB300 x DeepSeek-V4.1-Flash, fitted to published figures) and marked ASSUMED in its source.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from rackSim.calibrate import aic
from rackSim.calibrate.scenario import CALIBRATION, DEFAULT_PROFILE, SCENARIOS
from rackSim.config import scenario_options
from rackSim.config.errors import InputError
from rackSim.config.flags import output_file
from rackSim.config.specs import HardwareSpec, ModelSpec
from rackSim.perf.attention import AttentionCost, attention_cost
from rackSim.perf.calibrated import gemm_kernel
from rackSim.perf.comm import alltoall_layer_ms
from rackSim.perf.dense import GemmKernel, model_gemms
from rackSim.perf.moe import MoeKernel, dispatched_tokens
from rackSim.perf.profile import Profile

VERSION = "0.24.0"
#: served precision -> (MoE table dtype, MLA module GEMM dtype, KV cache dtype)
TABLE_DTYPES = {"fp8": ("fp8_block", "fp8_block", "fp8"),
                "bf16": ("bfloat16", "bfloat16", "bfloat16")}
#: what no kernel table measures: carried from the reference profile
CARRIED_PARAMS = ("dense_kernel_us", "cpu_step_ms", "admission_ns_per_token",
                  "admission_ns_per_token_baseline", "allreduce_call_ms", "allreduce_hop_ms",
                  "straggler_jitter_us", "straggler_lag_us", "straggler_absorb",
                  "eplb_sigma_target", "eplb_sigma_group_target", "eplb_sigma_draft",
                  "eplb_sigma_group_draft", "tp_layer_latency_us_standard",
                  "tp_layer_latency_us_low_latency", "topk_ns_per_candidate")
CARRIED_CONSTANTS = ("eplb_groups", "eplb_drift_steps", "eplb_epoch_steps")
#: fit name -> (profile parameter, unit), per table
UNITS = {"kernel_us": "us per call", "hbm_efficiency": "fraction of peak HBM bandwidth",
         "flops_efficiency": "fraction of peak FLOP/s", "quant_bytes": "bytes per input element",
         "token_bytes": "bytes per routed token per hidden element",
         "chunk_us": "us per request per layer", "op_us": "us per operation",
         "nvlink_efficiency": "fraction of NVLink bandwidth",
         "request_us": "us per request per layer"}


class TableError(ValueError):
    """A model / GPU / precision the kernel tables cannot calibrate; names what is missing."""


def load_spec(group: str, name: str) -> dict:
    path = SCENARIOS / group / f"{name}.yaml"
    if not path.is_file():
        have = scenario_options(group)
        raise TableError(f"--{'model' if group == 'model' else 'hardware'} {name}: no "
                         f"scenarios/{group}/{name}.yaml; available: {have}")
    return yaml.safe_load(path.read_text())


class Tables:
    """The vLLM tables of one aiconfigurator-core system."""

    def __init__(self, hw: HardwareSpec):
        root = aic.aic_root()
        if root is None:
            raise TableError("aiconfigurator-core is not installed (optional extra 'aic')")
        data = root / "systems" / "data"
        systems = sorted(p.name for p in data.iterdir() if p.is_dir())
        if hw.kernel_tables is None or hw.kernel_tables not in systems:
            raise TableError(f"hardware '{hw.name}': kernel_tables={hw.kernel_tables!r} names "
                             f"no aiconfigurator-core system; available: {systems}")
        self.root, self.system = root, hw.kernel_tables

    def path(self, op: str, name: str) -> str:
        return f"systems/data/{self.system}/{op}/vllm/{VERSION}/{name}"

    def read(self, op: str, name: str) -> pd.DataFrame:
        rel = self.path(op, name)
        if not (self.root / rel).is_file():
            raise TableError(f"hardware kernel_tables={self.system}: no table {rel}")
        return pd.read_parquet(self.root / rel)


def select(df: pd.DataFrame, where: dict[str, object], keys: list[str], what: str
           ) -> pd.DataFrame:
    """Rows matching `where`, the fastest kernel per `keys`; refuses an empty selection naming
    the first column whose value the table lacks and the values it has."""
    for col, val in where.items():
        sub = df[df[col] == val]
        if sub.empty:
            have = sorted(df[col].unique().tolist())
            raise TableError(f"{what}: no rows with {col}={val!r}; the table has {have}")
        df = sub
    return df.groupby(keys, as_index=False).latency.min()


def every_other(values: np.ndarray) -> np.ndarray:
    """Mask of the rows whose value is every other distinct value (the second, fourth, ...)."""
    held = [v for i, v in enumerate(sorted(set(values.tolist()))) if i % 2 == 1]
    return np.isin(values, held)


def one_layer(a: AttentionCost, layers: int) -> AttentionCost:
    """One attention layer of a model of `layers` layers (its share of the KV bytes)."""
    return replace(a, layers=1, kv_bytes_per_token=a.kv_bytes_per_token / layers)


def attention_gemm_ms(m: ModelSpec, kernels: dict[str, GemmKernel], tokens: np.ndarray
                      ) -> np.ndarray:
    """One layer's attention GEMMs (an MLA module's projections) for `tokens` rows (ms)."""
    gemms = [g for g in model_gemms(m) if g.name.startswith("attn.")]
    return sum(kernels[g.dtype].ms(tokens, g.n, g.k, g.groups) for g in gemms)


def fit_attention(t: Tables, m: ModelSpec, hw: HardwareSpec, kernels: dict[str, GemmKernel],
                  phase: str) -> aic.TableFit:
    """Decode (`phase` 'decode') or prefill attention speeds of one layer."""
    a, kv = m.attention, TABLE_DTYPES[m.gemm_dtype][2]
    base = one_layer(attention_cost(m, hw, PLACEHOLDER, m.gemm_dtype), m.num_layers)
    bw, bf16 = hw.hbm_bw_bytes_s / 1e3, hw.flops["bf16"] / 1e3
    decode = phase == "decode"
    if a.kind == "gqa":
        op, name = "attention", f"{'generation' if decode else 'context'}_attention_perf.parquet"
        where = {"num_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
                 "window_size": 0, "kv_cache_dtype": kv}
    else:
        op, name = "mla", f"mla_{'generation' if decode else 'context'}_module_perf.parquet"
        where = {"num_heads": a.heads, "kv_cache_dtype": kv,
                 "gemm_type": TABLE_DTYPES[m.gemm_dtype][1]}
    if not decode:
        where["step"] = 0
    rows = select(t.read(op, name), where, ["batch_size", "isl", "step"],
                  f"{t.path(op, name)} ({m.name})")
    b, isl, step = (rows[c].to_numpy(dtype=float) for c in ("batch_size", "isl", "step"))
    tokens = b * (1.0 if decode else isl)
    gemm = attention_gemm_ms(m, kernels, tokens) if a.kind == "mla" else np.zeros(len(rows))
    ctx = step + 1.0 if decode else isl
    held = np.isin(ctx, list(aic.every_third(ctx)))

    def predict(x: np.ndarray) -> np.ndarray:
        if decode:
            c = replace(base, kernel_ms=x[0] / 1e3, bytes_ms=bw * x[1], flops_ms=bf16 * x[2],
                        request_ms=x[3] / 1e3)
            att = [c.decode_attention_ms(bi, bi * ci, 1) for bi, ci in zip(b, ctx, strict=True)]
        else:
            c = aic.one_layer_attention("window", base, [*x, 0.0, 0.0, 1.0], bw * 1e3,
                                        bf16 * 1e3, 1.0)
            att = [c.prefill_attention_ms(bi * li, li / 2.0, bi)
                   for bi, li in zip(b, isl, strict=True)]
        return gemm + np.array(att)

    names = (["kernel_us", "hbm_efficiency", "flops_efficiency", "request_us"] if decode
             else ["kernel_us", "chunk_us", "hbm_efficiency", "flops_efficiency"])
    x0 = [5.0, 0.6, 0.4, 0.1] if decode else [10.0, 5.0, 0.5, 0.5]
    lo = [0.0, 0.01, 0.01, 0.0] if decode else [0.0, 0.0, 0.01, 0.01]
    hi = [500.0, 1.0, 1.0, 100.0] if decode else [500.0, 200.0, 1.0, 1.0]
    what = "MLA GEMMs (GEMM fit) + attention" if a.kind == "mla" else "attention kernel"
    return aic.fit_rows(predict, rows.latency.to_numpy(), held, names, x0, (lo, hi),
                        f"{t.path(op, name)} ({what}, {where})",
                        "every third context length" if decode else "every third prompt length")


def fit_moe(t: Tables, m: ModelSpec, hw: HardwareSpec) -> aic.TableFit:
    """MoE kernel speeds for the model's expert shape; every other EP width held out."""
    shape = {"hidden_size": m.hidden_size, "inter_size": m.moe_intermediate_size,
             "topk": m.experts_per_token, "num_experts": m.num_routed_experts, "moe_tp_size": 1,
             "distribution": "balanced", "moe_dtype": TABLE_DTYPES[m.gemm_dtype][0]}
    path = t.path("moe", "moe_perf.parquet")
    rows = select(t.read("moe", "moe_perf.parquet"), shape, ["num_tokens", "moe_ep_size"],
                  f"{path} ({m.name} experts)")
    held = every_other(rows.moe_ep_size.to_numpy())
    bw, flops = hw.hbm_bw_bytes_s / 1e3, hw.flops[m.gemm_dtype] / 1e3

    def predict(x: np.ndarray) -> np.ndarray:
        kernel = MoeKernel(x[0] / 1e3, bw * x[1], flops * x[2], x[3])
        return aic.predict_moe_rows(kernel, rows, m.weight_bytes_per_param, shape)

    eps = sorted(set(rows.moe_ep_size.tolist()))
    return aic.fit_rows(predict, rows.latency.to_numpy(), held,
                        ["kernel_us", "hbm_efficiency", "flops_efficiency", "token_bytes"],
                        [20.0, 0.8, 0.3, 2.0], ([0.0, 0.05, 0.01, 0.0], [500.0, 1.0, 1.0, 200.0]),
                        f"{path} ({shape})", f"EP widths {eps[1::2]} (fitted on {eps[0::2]})")


#: the table's `comm_backend` of each all-to-all kernel set (`deployment.*.all2all_backend`)
A2A_TABLE_BACKENDS = {"deepep_low_latency": "deepep_ll", "deepep_high_throughput": "deepep_ht"}


def fit_alltoall(t: Tables, hw: HardwareSpec, backend: str) -> aic.TableFit:
    """DeepEP dispatch + combine (one MoE layer) of one kernel set (`backend`, as
    `deployment.*.all2all_backend`); every third token count held out. The table's
    `num_tokens` are a rank's; a balanced rank receives what `moe.dispatched_tokens` counts
    (low-latency: num_tokens x top-k copies; normal: each token once per rank it reaches).
    The table's latencies are in microseconds (its `transmit_us` column equals them)."""
    path = t.path("comm", "moe_a2a_perf.parquet")
    df = t.read("comm", "moe_a2a_perf.parquet")
    keys = ["num_tokens", "hidden_size", "topk", "ep_size"]
    table_backend = A2A_TABLE_BACKENDS[backend]
    phases = select(df, {"comm_backend": table_backend}, [*keys, "phase"], path)
    rows = phases.groupby(keys, as_index=False).latency.sum()
    rows["latency"] /= 1e3  # this table's latencies are in us
    n, h, k, ep = (rows[c].to_numpy(dtype=float) for c in keys)
    copies = [dispatched_tokens(ni * ei, int(ei), int(ki), 1.0, backend)
              for ni, ki, ei in zip(n, k, ep, strict=True)]
    held = np.isin(n, list(aic.every_third(n)))
    nv = hw.nvlink_bw_bytes_s / 1e3

    def predict(x: np.ndarray) -> np.ndarray:
        return np.array([alltoall_layer_ms(ci, int(hi), int(ei), x[0] / 1e3, nv * x[1])
                         for ci, hi, ei in zip(copies, h, ep, strict=True)])

    return aic.fit_rows(predict, rows.latency.to_numpy(), held, ["op_us", "nvlink_efficiency"],
                        [10.0, 0.5], ([0.0, 0.01], [500.0, 1.0]),
                        f"{path} ({table_backend}, dispatch + combine)", "every third token count")


def fit_allreduce(t: Tables, hw: HardwareSpec) -> aic.TableFit:
    """TP all-reduce: op + 2 (n - 1) / n x bytes / (NVLink x efficiency); every third message
    size held out."""
    path = t.path("comm", "custom_allreduce_perf.parquet")
    rows = select(t.read("comm", "custom_allreduce_perf.parquet"), {"backend": "vllm_graph"},
                  ["num_gpus", "message_size"], path)
    g, size = (rows[c].to_numpy(dtype=float) for c in ("num_gpus", "message_size"))
    held = np.isin(size, list(aic.every_third(size)))
    nv = hw.nvlink_bw_bytes_s / 1e3

    def predict(x: np.ndarray) -> np.ndarray:
        return x[0] / 1e3 + 2.0 * (g - 1) / g * size / (nv * x[1])

    return aic.fit_rows(predict, rows.latency.to_numpy(), held, ["op_us", "nvlink_efficiency"],
                        [5.0, 0.5], ([0.0, 0.01], [500.0, 1.0]),
                        f"{path} (vllm_graph)", "every third message size")


#: attention speeds to build the fits' geometry from (each fit replaces the ones it fits)
PLACEHOLDER = Profile("placeholder", constants={k: {"value": 1.0, "source": ""} for k in (
    "attn_kernel_us", "attn_request_us", "attn_hbm_efficiency", "attn_flops_efficiency",
    "prefill_attn_kernel_us", "prefill_attn_chunk_us", "prefill_attn_hbm_efficiency",
    "prefill_attn_flops_efficiency", "prefill_chunk_requests")})


def table_profile(model: str, hardware: str, base: Profile,
                  log: Callable[[str], None] = lambda s: None) -> Profile:
    """Fit the profile of `model` on `hardware` (scenario names); raises TableError."""
    m = ModelSpec(**load_spec("model", model))
    hw = HardwareSpec(**load_spec("hardware", hardware))
    if m.attention is None:
        raise TableError(f"model '{model}' has no 'attention' section (compressed attention): "
                         "its profile is the reference fit, `racksim-calibrate`")
    if m.gemm_dtype not in hw.flops:
        raise TableError(f"model '{model}' is served in {m.gemm_dtype}, which hardware "
                         f"'{hardware}' has no peak for; available: {sorted(hw.flops)}")
    t = Tables(hw)
    src = f"aiconfigurator-core {aic.aic_version()}"
    p = Profile(f"{hardware}__{model}")
    p.meta = {"hardware": hw.name, "model": m.name, "created_by":
              "racksim-calibrate profile (rackSim.calibrate.table_profile)",
              "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
              "kernel_tables": f"{src} systems/data/{t.system} vLLM {VERSION}",
              "served_precision": m.gemm_dtype,
              "scenario_needs": f"perf.weight_dtype={m.gemm_dtype}"}

    def store(key: str, prefix: str, fit: aic.TableFit) -> None:
        for short, value in fit.values.items():
            p.set_param(f"{prefix}_{short}", value, UNITS[short], [f"aic:{key}"],
                        f"{src} {fit.table}")
        p.kernel_fit[key] = fit.record()
        log(f"{key:18s} fit median/p90 |err| {fit.fit_median_abs_err:6.1%} "
            f"{fit.fit_p90_abs_err:6.1%} ({fit.fit_rows} rows); held out "
            f"{fit.held_median_abs_err:6.1%} {fit.held_p90_abs_err:6.1%} ({fit.held_rows} rows, "
            f"{fit.held_out})")

    gemm_table = t.path("gemm", "gemm_perf.parquet")
    for dtype in ("fp8", "bf16"):
        rows = aic.vllm_gemm_rows(dtype, gemm_table)
        fit = aic.fit_gemm(aic.load_gemm_rows(t.root, dtype, rows), dtype,
                           hw.hbm_bw_bytes_s, hw.flops[dtype], rows)
        store(f"gemm_{dtype}", f"gemm_{dtype}", fit)
    kernels = {d: gemm_kernel(p, d, hw.hbm_bw_bytes_s, hw.flops[d]) for d in ("fp8", "bf16")}
    p.set_constant("prefill_chunk_requests", 1, "standard attention: one varlen call, a "
                   "fixed cost per request (no 4-request KV gather as in sparse MLA)")
    store("decode_attention", "attn", fit_attention(t, m, hw, kernels, "decode"))
    store("prefill_attention", "prefill_attn", fit_attention(t, m, hw, kernels, "prefill"))
    if m.num_routed_experts:
        store("moe", "moe", fit_moe(t, m, hw))
        store("alltoall", "a2a", fit_alltoall(t, hw, "deepep_low_latency"))
        store("alltoall_ht", "a2a_ht", fit_alltoall(t, hw, "deepep_high_throughput"))
    store("tp_allreduce", "tp_allreduce", fit_allreduce(t, hw))
    if not m.num_routed_experts:  # no expert parallelism: the all-to-all speeds are the TP's
        for short in ("op_us", "nvlink_efficiency"):
            p.set_param(f"a2a_{short}", p.value(f"tp_allreduce_{short}"), UNITS[short],
                        ["aic:tp_allreduce"], "no routed experts: the all-reduce fit")
    ref = f"{base.name} ({DEFAULT_PROFILE.name})"
    for name in CARRIED_PARAMS:
        entry = dict(base.params[name])
        entry["source"] = (f"ASSUMED: carried from {ref}, fitted to the published GB300 x "
                           "DeepSeek-V4.1-Flash figures; no kernel table measures it")
        p.params[name] = entry
    for name in CARRIED_CONSTANTS:
        p.set_constant(name, base.value(name), f"ASSUMED: carried from {ref}")
    p.set_constant("replay_tokens_baseline", 0, "standard attention keeps no compressed state "
                   "to rebuild: a cached prefix is read, not replayed")
    p.set_constant("tlb_overhead", 0, "no shared host tables gathered through (sparse MLA)")
    p.settings = {**base.settings, "moe_kernel": "vllm",
                  "prefill_optimisations": {"bounded_replay": True, "replay_tokens": 0,
                                            "large_pages": True, "deepselect": True,
                                            "replay_layers": 0}}
    return p


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="racksim-calibrate profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="scenarios/model/<name>.yaml")
    ap.add_argument("--hardware", required=True, help="scenarios/hardware/<name>.yaml")
    ap.add_argument("--out", type=output_file, help="default: calibration/<hardware>__<model>.yaml")
    ap.add_argument("--base", type=Path, default=DEFAULT_PROFILE,
                    help="profile the unmeasured parameters are carried from")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = args.out or CALIBRATION / f"{args.hardware}__{args.model}.yaml"
    try:
        p = table_profile(args.model, args.hardware, Profile.load(args.base, "--base"),
                          lambda s: print(s, file=sys.stderr))
    except InputError:  # the base profile: racksim-calibrate gives its class's exit code
        raise
    except (TableError, ValueError) as e:
        print(f"racksim-calibrate profile: {e}", file=sys.stderr)
        return 2
    p.save(out)
    print(f"wrote {out}")
    return 0
