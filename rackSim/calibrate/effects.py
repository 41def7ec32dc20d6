"""Effects at the fitted operating point: does the model move the way the published work says?

Each effect compares a baseline and a variant of the default scenario (Hydra overrides on top
of it), simulated with a short window: throughput and P90 interactivity of both, their ratios
(variant / baseline), and, where the publication reports a direction, whether the model's ratio
lies on the same side of 1, and where it reports a size, how large the model's change is
against it (`size_vs_published`). Seed-only effects measure the noise of a short window, each
on the scenario and metric of the effects it judges (the default scenario's tok/s per GPU, the
prefill-only scenario's input tok/s per prefill GPU): a ratio closer to 1 than the largest
seed-only change of its metric is `within noise`, neither agreement nor disagreement.
Identical scenarios are simulated once. Nothing here asserts that the model agrees; `agrees`
is reported: yes / no / within noise / empty (no published direction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from joblib import delayed

from rackSim.calibrate import figures
from rackSim.calibrate.loo import parallel_map
from rackSim.config import compose_scenario
from rackSim.config.specs import RunConfig
from rackSim.run import simulate

#: a prefill-bound workload: many clients, one output token, no tool time (AgentX generator)
PREFILL_ONLY = ("workload.replay.concurrency=256",
                "++workload.agentx.output_tokens={kind:constant,value:1}",
                "++workload.agentx.tool_delay_s={kind:constant,value:0}")
EFFECT_COLUMNS = [
    "effect", "figure", "published", "baseline", "variant", "metric", "baseline_tok_s_gpu",
    "variant_tok_s_gpu", "throughput_ratio", "baseline_interactivity", "variant_interactivity",
    "interactivity_ratio", "published_ratio", "size_vs_published", "agrees", "noise", "error"]
RATIOS = ("throughput_ratio", "interactivity_ratio")


@dataclass(frozen=True)
class Effect:
    """Variant vs baseline (Hydra overrides). `expect_*`: the published direction of the
    variant / baseline ratio (+1 up, -1 down, 0 not reported); `worse_than`: another effect
    whose throughput ratio this one's must also be below; `metric`: 'throughput' (tok/s per
    GPU of the rack) or 'prefill' (input tok/s per prefill GPU); `noise`: the variant differs
    only by seed, so its ratios measure the noise."""

    name: str
    baseline: tuple[str, ...]
    variant: tuple[str, ...]
    figure: str = ""
    published: str = ""
    expect_throughput: int = 0
    expect_interactivity: int = 0
    published_ratio: float = math.nan
    worse_than: str = ""
    metric: str = "throughput"
    noise: bool = False


def size_vs_published(ratio: float, published_ratio: float) -> float:
    """The model's change against the published one: (ratio - 1) / (published ratio - 1); 1 is
    the published size, 3 a change three times as large (NaN without a published size)."""
    if math.isnan(published_ratio) or published_ratio == 1.0:
        return math.nan
    return (ratio - 1.0) / (published_ratio - 1.0)


def one_line(text: str) -> str:
    """A (possibly multi-line) error message on one line."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def default_effects(cfg: RunConfig) -> list[Effect]:
    """The effect set at `cfg` (the default scenario): K1, K2, the prefill router (session
    affinity vs the least-work prefix_affinity, no published direction), DEP16 vs DEP32 with each
    all-reduce, C1, DEP4 vs DEP2 prefill and one lagged prefill rank (P1, P2), and two
    seed-only variants of the default and of the prefill-only scenario whose ratios give the
    noise of each metric.
    Prefill layouts keep `cfg`'s prefill GPU count."""
    pub = figures.published_values()
    p = cfg.deployment.prefill
    gpus = p.instances * p.gpus_per_instance

    def prefill(width: int) -> tuple[str, ...]:
        return (*PREFILL_ONLY, f"deployment.prefill.gpus_per_instance={width}",
                f"deployment.prefill.instances={gpus // width}")

    def decode(width: int, alg: str) -> tuple[str, ...]:
        return (f"deployment.decode.gpus={width}", f"deployment.allreduce={alg}")

    lag = ("perf.lagged_ranks=1",)
    rd = "recursive_doubling"
    return [
        Effect("KV transfer: push vs pull", ("deployment.kv_transfer.mode=pull",),
               ("deployment.kv_transfer.mode=push",), "K1",
               "push raises throughput and P90 interactivity", 1, 1),
        Effect("KV-load cap: 4 vs none", ("deployment.decode.kv_load_cap_per_step=null",),
               ("deployment.decode.kv_load_cap_per_step=4",), "K2",
               "cap 4 raises throughput and P90 interactivity", 1, 1),
        Effect("router: session affinity vs least work", ("deployment.router=prefix_affinity",),
               ("deployment.router=session_affinity",)),
        *(Effect(f"decode DEP16 vs DEP32 ({alg})", decode(32, alg), decode(16, alg))
          for alg in ("ring", rd)),
        *(Effect(f"all-reduce: recursive doubling vs ring (DEP{w})", decode(w, "ring"),
                 decode(w, rd), "C1", "DP sync 10.8 -> 1.5 ms per step: interactivity up",
                 0, 1) for w in (32, 16)),
        Effect("prefill only: DEP4 vs DEP2", prefill(2), prefill(4), metric="prefill"),
        Effect("one lagged rank: DEP2 prefill", prefill(2), (*prefill(2), *lag), "P1",
               f"loses {pub['P1']:g} %", -1, published_ratio=1 - pub["P1"] / 100,
               metric="prefill"),
        Effect("one lagged rank: DEP4 prefill", prefill(4), (*prefill(4), *lag), "P2",
               f"loses {pub['P2']:g} %, more than DEP2 (P1)", -1,
               published_ratio=1 - pub["P2"] / 100, worse_than="one lagged rank: DEP2 prefill",
               metric="prefill"),
        *(Effect(f"noise: seed +{k}", (), (f"seed={cfg.seed + k}",), noise=True)
          for k in (1, 2)),
        *(Effect(f"noise: prefill only, seed +{k}", prefill(2),
                 (*prefill(2), f"seed={cfg.seed + k}"), metric="prefill", noise=True)
          for k in (1, 2)),
    ]


def complete_summary(cfg: RunConfig, progress: bool = False) -> dict[str, Any]:
    """Simulate `cfg`; its summary. Raises KeyboardInterrupt if the run was interrupted (a
    partial window is no result)."""
    s = simulate(cfg, progress=progress).summary
    if s.get("partial"):
        raise KeyboardInterrupt
    return s


def measure(cfg: RunConfig) -> dict[str, float]:
    """Simulate `cfg` (`complete_summary`): tok/s per GPU, input tok/s per prefill GPU,
    interactivity (tok/s/user)."""
    s = complete_summary(cfg)
    p = cfg.deployment.prefill
    prefill = ((s["cached_input_tok_s_gpu"] + s["uncached_input_tok_s_gpu"]) * s["num_gpus"]
               / (p.instances * p.gpus_per_instance))
    return {"throughput": s["throughput_tok_s_gpu"], "prefill": prefill,
            "interactivity": s["interactivity_tok_s"]}


def _verdict(change: float, want: int, noise: float) -> str:
    """'yes' if `change` (a ratio minus 1, or a difference of ratios) has the sign `want`
    beyond `noise`, 'no' if the opposite sign beyond it, else 'within noise'."""
    if math.isnan(change) or abs(change) <= noise:
        return "within noise"
    return "yes" if (change > 0) == (want > 0) else "no"


def effect_noise(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per metric of an effects table (EFFECT_COLUMNS), the largest change of each ratio
    (RATIOS) among its seed-only rows of that metric; a metric without seed-only rows of its
    own is judged by all the seed-only rows."""
    seeds = table[table["noise"].astype(bool)]

    def largest(sel: pd.DataFrame) -> dict[str, float]:
        return {r: float((sel[r] - 1).abs().max()) if sel[r].notna().any() else 0.0
                for r in RATIOS}
    return {m: largest(seeds[seeds["metric"] == m] if (seeds["metric"] == m).any() else seeds)
            for m in dict.fromkeys(table["metric"])}


def _agrees(row: dict, e: Effect, rows: dict[str, dict], noise: dict[str, float]) -> str:
    """The verdict of one effect against `noise`, the noise of its metric (per ratio)."""
    tp, it = row["throughput_ratio"], row["interactivity_ratio"]
    verdicts = [_verdict(r - 1, want, noise[m]) for r, want, m in (
        (tp, e.expect_throughput, "throughput_ratio"),
        (it, e.expect_interactivity, "interactivity_ratio")) if want]
    if e.worse_than:
        other = rows.get(e.worse_than, {}).get("throughput_ratio", math.nan)
        verdicts.append(_verdict(other - tp, 1, noise["throughput_ratio"]))
    if not verdicts:
        return ""
    return "no" if "no" in verdicts else ("within noise" if "within noise" in verdicts
                                          else "yes")


def run_effects(effects: Sequence[Effect], base: Sequence[str], window_s: float,
                jobs: int = 1) -> pd.DataFrame:
    """Simulate every distinct scenario of `effects` (`base` overrides + the effect's, with a
    `window_s` window) over `jobs` processes; one row per effect (EFFECT_COLUMNS). An effect
    whose scenario cannot be composed or validated gets its message in `error`."""
    common = [*base, f"workload.replay.window_s={window_s}", "progress=false"]
    configs: dict[tuple[str, ...], RunConfig | str] = {}
    for e in effects:
        for ov in (e.baseline, e.variant):
            if ov not in configs:
                try:
                    configs[ov] = compose_scenario([*common, *ov])
                except Exception as err:  # noqa: BLE001 - Hydra and pydantic errors alike
                    configs[ov] = one_line(f"{' '.join(ov)}: {err}")
    unique = {c.model_dump_json(): c for c in configs.values() if isinstance(c, RunConfig)}
    keys = list(unique)
    done = parallel_map((delayed(_keyed)(k, unique[k]) for k in keys), len(keys), jobs,
                        "effect runs")
    metrics = dict(done)
    rows: dict[str, dict] = {}
    for e in effects:
        b, v = configs[e.baseline], configs[e.variant]
        error = next((c for c in (b, v) if isinstance(c, str)), "")
        mb = {} if error else metrics[b.model_dump_json()]
        mv = {} if error else metrics[v.model_dump_json()]
        nan = math.nan
        ratio = mv.get(e.metric, nan) / mb.get(e.metric, nan)
        rows[e.name] = {
            "effect": e.name, "figure": e.figure, "published": e.published,
            "baseline": " ".join(e.baseline), "variant": " ".join(e.variant),
            "metric": e.metric, "baseline_tok_s_gpu": mb.get(e.metric, nan),
            "variant_tok_s_gpu": mv.get(e.metric, nan),
            "throughput_ratio": ratio,
            "baseline_interactivity": mb.get("interactivity", nan),
            "variant_interactivity": mv.get("interactivity", nan),
            "interactivity_ratio": mv.get("interactivity", nan) / mb.get("interactivity", nan),
            "published_ratio": e.published_ratio,
            "size_vs_published": size_vs_published(ratio, e.published_ratio),
            "noise": e.noise, "error": error}
    noise = effect_noise(pd.DataFrame(list(rows.values())))
    for e in effects:
        rows[e.name]["agrees"] = "" if rows[e.name]["error"] else _agrees(
            rows[e.name], e, rows, noise[e.metric])
    return pd.DataFrame(list(rows.values()), columns=EFFECT_COLUMNS)


def _keyed(key: str, cfg: RunConfig) -> tuple[str, dict[str, float]]:
    return key, measure(cfg)
