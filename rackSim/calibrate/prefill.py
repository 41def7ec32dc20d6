"""`racksim-calibrate prefill`: absolute prefill throughput of a DEPn prefill instance.

For every (cached, new) pair of the grid, a rank runs full steps of the configured token budget
(`deployment.prefill.max_num_batched_tokens`, 16384 per rank by default): as many whole
requests of `new` uncached tokens after `cached` cached tokens as fit, or, for a request longer
than the budget, its chunks one per step. Throughput per GPU = uncached tokens of a rank per
second of its steps. Three prices of the same steps:

* model - the calibrated step model (every part of the step, expected straggler delay, the
  steady-state EPLB balancedness of an n-rank prefill instance);
* tables - the GB300 kernel tables of aiconfigurator-core alone (vLLM's; the FP8 block
  GEMMs from the collection the profile fits, `aic.GEMM_ROWS`), interpolated, summed over the
  same operations (dense GEMMs, mHC, sparse attention, index logits, routed experts); what
  they leave out: top-k selection, all-to-all, DP sync, CPU, stragglers, the FP8 activation
  quantisation, other per-layer kernels. The tables hold the V4-Flash expert (2048 wide,
  256 experts): the MoE lookup is scaled by the model's expert width over 2048. Attention of
  CSA and window layers is read from the HCA sparse-attention table at the prefix length that
  gives a query the same number of attended entries (the same kernel, `flash_mla_sparse_fwd`);
* aic - aiconfigurator-core's own static context-phase estimate for its DeepSeek-V4-Flash
  model (vLLM, GB300, attention DP = EP = n) at the same requests and lengths, one call per
  chunk (`EngineHandle.predict_prefill_latency`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rackSim.calibrate import aic, figures
from rackSim.calibrate.scenario import (
    DEFAULT_PROFILE,
    REFERENCE_MODEL,
    instance_point,
    profile_options,
)
from rackSim.config.flags import output_file, whole_numbers_above
from rackSim.config.scenarios import scenario_options, with_changes
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.profile import Profile
from rackSim.perf.step import PrefillBatch

CACHED = (4096, 16384, 32768, 65536, 131072)
NEW = (1024, 4096, 8192, 16384, 32768)
WIDTHS = (2, 4)
AIC_MODEL = "deepseek-ai/DeepSeek-V4-Flash"
#: expert width of the MoE table rows (aic.MOE_SHAPE)
TABLE_EXPERT_WIDTH = aic.MOE_SHAPE["inter_size"]
#: longest query run of one request in the sparse-attention and index-logit tables
TABLE_MAX_ISL = 8192


@dataclass(frozen=True)
class Chunk:
    """One step of one rank: `requests` requests each computing `tokens` new tokens after
    `prefix` tokens already in its KV cache; `admitted` when the step admits them."""

    requests: int
    tokens: int
    prefix: int
    admitted: bool


def step_chunks(cached: int, new: int, budget: int) -> list[Chunk]:
    """The steps of one rank: budget // new whole requests in one step, or one request's
    chunks of `budget` tokens in successive steps."""
    if new <= budget:
        return [Chunk(budget // new, new, cached, True)]
    return [Chunk(1, min(budget, new - off), cached + off, off == 0)
            for off in range(0, new, budget)]


class Interp:
    """Piecewise-linear interpolation of a table over `axes` (the last one, a token or request
    count, innermost), each axis bracketed among the values present under the outer axes.
    Beyond the largest count the last latency is scaled in proportion (work-bound); elsewhere
    outside the grid it is extrapolated linearly."""

    def __init__(self, df: pd.DataFrame, axes: Sequence[str], value: str = "latency"):
        self.axes = list(axes)
        self.tree = self._build(df.groupby(list(axes), as_index=False)[value].mean(), 0, value)

    def _build(self, df: pd.DataFrame, level: int, value: str) -> object:
        axis = self.axes[level]
        if level == len(self.axes) - 1:
            d = df.sort_values(axis)
            return d[axis].to_numpy(dtype=float), d[value].to_numpy(dtype=float)
        return {float(v): self._build(g, level + 1, value) for v, g in df.groupby(axis)}

    def __call__(self, *point: float) -> float:
        return max(self._at(self.tree, point), 0.0)

    def _at(self, node: object, point: Sequence[float]) -> float:
        q = float(point[0])
        if isinstance(node, tuple):
            xs, ys = node
            if q > xs[-1]:
                return float(ys[-1] * q / xs[-1])
            return _linear(xs, [float(y) for y in ys], q)
        near = _bracket(np.array(sorted(node)), q)
        return _linear(near, [self._at(node[float(k)], point[1:]) for k in near], q)


def _bracket(keys: np.ndarray, q: float) -> np.ndarray:
    """The one or two axis values whose results `q` is interpolated (or extrapolated) from."""
    if len(keys) == 1 or q in keys:
        return keys[keys == q] if q in keys else keys[:1]
    i = int(np.clip(np.searchsorted(keys, q), 1, len(keys) - 1))
    return keys[i - 1:i + 1]


def _linear(xs: Sequence[float], ys: Sequence[float], q: float) -> float:
    xs = np.asarray(xs, dtype=float)
    if len(xs) == 1:
        return float(ys[0])
    i = int(np.clip(np.searchsorted(xs, q), 1, len(xs) - 1))
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(y0 + (y1 - y0) * (q - x0) / (x1 - x0))


class KernelTables:
    """The aiconfigurator-core GB300 vLLM tables, ready to interpolate."""

    def __init__(self, root: Path):
        self.gemm = {d: Interp(aic.load_gemm_rows(root, d), ["n", "k", "m"])
                     for d in aic.GEMM_ROWS}
        self.mhc = Interp(aic.load_mhc_rows(root), ["hidden_size", "num_tokens"])
        self.attention = Interp(aic.load_prefill_attention_rows(root),
                                ["isl", "step", "batch_size"])
        idx = aic.load_prefill_indexer_rows(root)
        self.index_logits = Interp(idx.assign(rows=idx.batch_size * idx.isl), ["rows", "step"])
        self.moe = Interp(aic.load_moe_rows(root), ["moe_ep_size", "num_tokens"])


def _pieces(tokens: int, prefix: int) -> list[tuple[int, int]]:
    """A request's run of queries cut into (tokens, prefix) pieces the tables cover."""
    return [(min(TABLE_MAX_ISL, tokens - o), prefix + o) for o in range(0, tokens, TABLE_MAX_ISL)]


def tables_step_ms(t: KernelTables, model: CalibratedStepModel, c: Chunk, ranks: int) -> float:
    """One step of one rank priced by table lookups alone (see the module docstring)."""
    tokens = c.requests * c.tokens
    total = 0.0
    for g in model.dense.gemms:
        m = c.requests if g.rows == "requests" else tokens
        total += g.layers * g.groups * t.gemm[g.dtype](g.n, g.k, m)
    m_spec, a = model.cfg.model, model.attn
    total += m_spec.num_layers * t.mhc(m_spec.hidden_size, tokens)
    for run, prefix in _pieces(c.tokens, c.prefix):
        mean = prefix + run / 2.0
        csa = a.hca_compress * min(mean / a.csa_compress, a.topk_entries) - run / 2.0
        for layers, step in ((a.hca_layers, prefix), (a.csa_layers, csa),
                             (a.swa_layers, 0.0)):
            total += layers * t.attention(run, max(step, 0.0), c.requests)
        total += a.csa_layers * c.requests * t.index_logits(run, prefix)
    scale = m_spec.moe_intermediate_size / TABLE_EXPERT_WIDTH
    total += m_spec.num_moe_layers * scale * t.moe(ranks, tokens * ranks)
    return total


def model_step(model: CalibratedStepModel, c: Chunk, ranks: int) -> dict[str, float]:
    """One step of the whole instance (every rank runs `c`): expected breakdown (ms)."""
    n = c.requests * ranks
    batch = PrefillBatch(new_tokens=c.tokens * n, attended_tokens=(c.prefix + c.tokens) * n,
                         num_requests=n,
                         admitted_prompt_tokens=(c.prefix + c.tokens) * n if c.admitted else 0,
                         ranks=ranks)
    b = figures.expected(model.prefill_step(batch), model)
    return {**b.as_dict(), "step_ms": b.total_ms}


def steady_balancedness(profile: Profile, ranks: int, hardware: str,
                        model: str = REFERENCE_MODEL) -> float:
    """Target-model balancedness of an n-rank prefill instance half-way between two EPLB
    rearrangements (steady state, no copies in flight)."""
    cfg = instance_point("prefill", ranks, hardware=hardware, model=model)
    interval = cfg.deployment.eplb.interval_steps
    return CalibratedStepModel(cfg, "prefill", profile=profile).balancedness(
        2 * interval + interval // 2)[0]


def aic_engines(widths: Sequence[int]) -> tuple[dict[int, object], str]:
    """aiconfigurator-core engines per width, or none and the reason."""
    if aic.aic_root() is None:
        return {}, "aiconfigurator-core is not installed (optional extra 'aic')"
    try:
        from aiconfigurator_core.sdk.engine import EngineHandle

        with contextlib.redirect_stdout(io.StringIO()):
            return {w: EngineHandle.compile(AIC_MODEL, "gb300", "vllm", tp_size=1,
                                            attention_dp_size=w, moe_tp_size=1, moe_ep_size=w)
                    for w in widths}, ""
    except Exception as e:  # the SDK's own errors, reported in the output instead
        return {}, f"aiconfigurator-core could not build {AIC_MODEL} on gb300/vllm: {e}"


def prefill_table(profile: Profile, widths: Sequence[int] = WIDTHS,
                  cached: Sequence[int] = CACHED, new: Sequence[int] = NEW,
                  hardware: str = "gb300_nvl72", use_aic: bool = True,
                  model: str = REFERENCE_MODEL, dbo: bool = False) -> tuple[pd.DataFrame, str]:
    """One row per (width, cached, new): uncached tokens/s per GPU of `model` from the model,
    the tables and aiconfigurator (both price the reference model's layers only), and the
    model's mean step breakdown (ms); `dbo`: the model's steps with dual-batch overlap. Also
    returns why a column is missing (empty if none is)."""
    unused = "aiconfigurator-core not used"
    if use_aic and model != REFERENCE_MODEL:
        use_aic, unused = False, (f"the kernel-table and aiconfigurator columns price "
                                  f"{AIC_MODEL}'s layers, not {model}'s")
    root = aic.aic_root() if use_aic else None
    tables = KernelTables(root) if root is not None else None
    engines, why = aic_engines(widths) if use_aic else ({}, unused)
    if tables is None and not why:
        why = "aiconfigurator-core is not installed (optional extra 'aic')"
    rows = []
    for w in widths:
        cfg = instance_point("prefill", w, hardware=hardware, model=model)
        if dbo:
            cfg = with_changes(cfg, deployment={"prefill": {"dbo": {"enabled": True}}})
        b = steady_balancedness(profile, w, hardware, model)
        step_model = CalibratedStepModel(cfg, "prefill", profile=profile,
                                         balancedness=(b, 1.0))
        budget = cfg.deployment.prefill.max_num_batched_tokens
        for c_tok in cached:
            for n_tok in new:
                chunks = step_chunks(c_tok, n_tok, budget)
                tokens = sum(c.requests * c.tokens for c in chunks)
                steps = pd.DataFrame([model_step(step_model, c, w) for c in chunks])
                row = {"width": w, "cached": c_tok, "new": n_tok,
                       "requests_per_rank": chunks[0].requests, "steps": len(chunks),
                       "balancedness": b,
                       "model_tok_s_gpu": tokens / steps.step_ms.sum() * 1e3,
                       "tables_tok_s_gpu": np.nan, "aic_tok_s_gpu": np.nan,
                       **steps.mean().to_dict()}
                if tables is not None:
                    ms = sum(tables_step_ms(tables, step_model, c, w) for c in chunks)
                    row["tables_tok_s_gpu"] = tokens / ms * 1e3
                if w in engines:
                    ms = sum(engines[w].predict_prefill_latency(
                        c.requests, c.prefix + c.tokens, c.prefix) for c in chunks)
                    row["aic_tok_s_gpu"] = tokens / ms * 1e3
                rows.append(row)
    return pd.DataFrame(rows), why


def _listed(values) -> str:
    return ",".join(map(str, values))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="racksim-calibrate prefill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE,
                    help="calibration profile (default: %(default)s)")
    ap.add_argument("--widths", type=whole_numbers_above(0), default=list(WIDTHS),
                    help=f"DEP widths of the prefill instance (default: {_listed(WIDTHS)})")
    ap.add_argument("--cached", type=whole_numbers_above(0, equal=True), default=list(CACHED),
                    help=f"cached tokens per request (default: {_listed(CACHED)})")
    ap.add_argument("--new", type=whole_numbers_above(0), default=list(NEW),
                    help=f"new (uncached) tokens per request (default: {_listed(NEW)})")
    ap.add_argument("--hardware", choices=scenario_options("hardware"), default=None,
                    metavar="HARDWARE",
                    help="a scenarios/hardware/ option (default: the GPU the profile was "
                         "fitted for)")
    ap.add_argument("--dbo", action="store_true",
                    help="the model's steps with dual-batch overlap "
                         "(deployment.prefill.dbo.enabled; docs/perf.md)")
    ap.add_argument("--no-aic", action="store_true",
                    help="leave out the kernel-table and aiconfigurator columns")
    ap.add_argument("--out", type=output_file, default=None,
                    help="also write the table as CSV (default: %(default)s)")
    return ap


COLUMNS = ["width", "cached", "new", "requests_per_rank", "step_ms", "moe", "attention",
           "indexer", "dense", "comm", "model_tok_s_gpu", "tables_tok_s_gpu", "aic_tok_s_gpu"]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    profile = Profile.load(args.profile, "--profile")
    model, fitted_on = profile_options(profile)
    hardware = args.hardware or fitted_on or "gb300_nvl72"
    df, why = prefill_table(profile, args.widths, args.cached, args.new, hardware,
                            not args.no_aic, model, args.dbo)
    print(f"prefill throughput per GPU (uncached tokens/s) of {model} on {hardware}, profile "
          f"{args.profile}; step parts in ms (model, mean per step)"
          + ("; dual-batch overlap" if args.dbo else ""))
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(df[COLUMNS].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    if why:
        print(f"missing columns: {why}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.out, index=False)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
