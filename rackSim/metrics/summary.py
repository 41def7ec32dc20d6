"""From records to a Result: throughput, latency percentiles, revenue and margin.

Definitions (all over the measurement window [t0, t1), W = t1 - t0 seconds, G GPUs):
- Input tokens of a request (cached and uncached) count at its first token, if that falls in
  the window. Output tokens count when emitted: at their recorded times when token times exist,
  otherwise spread evenly over [first token, finish] (the simulator's decode steps emit at an
  even rate per request) and clipped to the window.
- throughput per GPU = (cached input + uncached input + output) / (G x W), tokens/s/GPU.
- inter-token latency (ITL): token-weighted; a step of duration T emitting k tokens to a
  request contributes k gaps of T / k. Interactivity = 1 / P90 ITL (tokens/s per user).
- per-request TPOT = (finish - first token) / (output tokens - 1); its P90 is over requests sent
  in the window. TTFT = first token - send, over requests sent in the window.
- revenue per GPU-hour = token mix priced per 1M tokens / (G x W / 3600); margin = revenue -
  cost (the price of a GPU-hour).

Fleets (simulated runs given a `FleetLayout`): the same definitions per rack and per instance.
A rack is credited the input tokens of the requests it prefilled and the output tokens of the
requests it decoded, over its own GPUs, so the racks' tokens add up to the fleet's; its
interactivity comes from its decode instances' ITL histograms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import pandas as pd

from rackSim.config.specs import PricingSpec
from rackSim.metrics.histogram import LatencyHistogram
from rackSim.metrics.records import (
    REQUEST_COLUMNS,
    STEP_COLUMNS,
    Records,
    RequestLog,
    StepLog,
)

SUMMARY_KEYS = (
    "throughput_tok_s_gpu", "cached_input_tok_s_gpu", "uncached_input_tok_s_gpu",
    "output_tok_s_gpu", "interactivity_tok_s", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms",
    "tpot_p50_ms", "tpot_p90_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
    "revenue_usd_gpu_h", "cost_usd_gpu_h", "margin_usd_gpu_h", "cache_hit_rate",
    "requests_finished", "requests_sent", "requests_failed", "requests_in_flight",
)

#: TTFT's stages (simulated requests): (key, start field, end field, label). The summary's
#: `ttft_<key>_ms` is the mean over the window's finished requests of the time between the two
#: record fields, and the five add up to the mean TTFT. A colocated instance emits the first
#: token as its prompt ends, so the last three stages are 0 there.
TTFT_STAGES = (
    ("prefill_queue", "send_s", "prefill_start_s", "prefill wait"),  # routing, a step to join
    ("prefill", "prefill_start_s", "prefill_end_s", "prefill"),      # the prompt's steps
    ("kv_transfer", "prefill_end_s", "kv_ready_s", "KV"),            # push: until it landed
    ("decode_admission", "kv_ready_s", "decode_start_s", "decode wait"),  # for a decode slot
    ("first_step", "decode_start_s", "first_token_s", "first step"),  # the step emitting it
)


def ttft_stages_ms(requests: pd.DataFrame) -> pd.DataFrame:
    """Each request's TTFT stages (ms), one column per `TTFT_STAGES` key (NaN where the
    records have no stage times, as a measured run's)."""
    return pd.DataFrame({stage: (requests[end] - requests[start]) * 1e3
                         for stage, start, end, _ in TTFT_STAGES})


@dataclass
class Result:
    """Summary numbers (JSON-ready) plus tidy tables: one row per request, per step, and (for
    simulated fleets) per rack and per instance."""

    summary: dict[str, float | int | str | bool]
    requests: pd.DataFrame
    steps: pd.DataFrame
    timeseries: pd.DataFrame
    itl: LatencyHistogram = field(repr=False)
    racks: pd.DataFrame = field(default_factory=pd.DataFrame)
    instances: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass
class FleetLayout:
    """Where a simulated fleet's instances sit: the rack of every instance (by step-row name),
    each rack's GPUs, and each decode instance's ITL histogram over the window."""

    instance_racks: dict[str, int]
    rack_gpus: list[int]
    decode_itl: dict[str, LatencyHistogram]


def requests_frame(records: Records) -> pd.DataFrame:
    """One row per record (REQUEST_COLUMNS) plus ttft_ms, tpot_ms and uncached_tokens.

    Built column by column: `dataclasses.asdict` per record deep-copies every field and took a
    third as long as the simulation itself on the reference run."""
    if isinstance(records, RequestLog):
        cols = records.columns()
    else:
        cols = {c: list(map(attrgetter(c), records)) for c in REQUEST_COLUMNS}
    df = pd.DataFrame(cols) if len(records) else pd.DataFrame(columns=list(REQUEST_COLUMNS))
    df["ttft_ms"] = (df["first_token_s"] - df["send_s"]) * 1e3
    n = df["output_tokens"].astype(float)
    df["tpot_ms"] = np.where(n >= 2, (df["finish_s"] - df["first_token_s"]) * 1e3
                             / (n - 1).where(n >= 2, 1.0), np.nan)
    df["uncached_tokens"] = df["prompt_tokens"] - df["cached_tokens"]
    return df


def steps_frame(rows: list[tuple] | StepLog) -> pd.DataFrame:
    """The step table of a run's step rows (a simulation's `StepLog`, or measured tuples)."""
    if isinstance(rows, StepLog):
        return rows.frame()
    return pd.DataFrame.from_records(rows, columns=list(STEP_COLUMNS))


def window_mask(steps: pd.DataFrame, t0: float, t1: float, role: str) -> pd.Series:
    """Which steps started in the window [t0, t1) (s) on the instances of `role` ("decode",
    "prefill" or "colocated": named `role` or `role-<n>`); a drain's steps are after it."""
    name, start = steps["instance"], steps["start_s"]
    return ((name == role) | name.str.startswith(role + "-")) & (start >= t0) & (start < t1)


def window_steps(steps: pd.DataFrame, t0: float, t1: float, role: str) -> pd.DataFrame:
    """The rows of `window_mask`."""
    return steps[window_mask(steps, t0, t1, role)]


def itl_from_token_times(records: Records, t0: float, t1: float
                         ) -> LatencyHistogram:
    """ITL histogram from recorded token arrival times (measured runs)."""
    hist = LatencyHistogram()
    kept = []
    for r in records:
        t = np.asarray(r.token_times_s, dtype=float)
        if t.size < 2:
            continue
        gaps = np.diff(t) * 1e3
        keep = (t[1:] >= t0) & (t[1:] < t1)
        if keep.any():
            kept.append(np.maximum(gaps[keep], 1e-6))
    if kept:
        hist.add_many(np.concatenate(kept))
    return hist


def _emitting(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first token s, finish s, output tokens) of every request that emitted tokens."""
    ok = (df["first_token_s"].notna() & df["finish_s"].notna()
          & (df["output_tokens"] > 0)).to_numpy()
    return (df["first_token_s"].to_numpy()[ok], df["finish_s"].to_numpy()[ok],
            df["output_tokens"].to_numpy(float)[ok])


def _output_in_window(emitting: tuple[np.ndarray, np.ndarray, np.ndarray], t0: float,
                      t1: float) -> float:
    """Output tokens emitted in [t0, t1), assuming an even rate over [first, finish]."""
    first, fin, n = emitting
    if not len(first):
        return 0.0
    total = ((first >= t0) & (first < t1)).astype(float)  # the first token itself
    span = fin - first
    rest = n - 1
    overlap = np.clip(np.minimum(fin, t1) - np.maximum(first, t0), 0, None)
    frac = np.where(span > 0, overlap / np.where(span > 0, span, 1), 0.0)
    single = (span <= 0) & (first >= t0) & (first < t1)
    return float((total + rest * np.where(single, 1.0, frac)).sum())


def timeseries(df: pd.DataFrame, t0: float, t1: float, num_gpus: int,
               bucket_s: float = 60.0) -> pd.DataFrame:
    """Tokens/s/GPU per time bucket across the window, split by kind."""
    if t1 <= t0:
        return pd.DataFrame(columns=["t_s", "cached", "uncached", "output"])
    bucket_s = min(bucket_s, max((t1 - t0) / 10, 1e-3))
    edges = np.arange(t0, t1 + 1e-9, bucket_s)
    if edges[-1] < t1:
        edges = np.append(edges, t1)
    rows = []
    first = df["first_token_s"].to_numpy()
    cached, uncached = df["cached_tokens"].to_numpy(), df["uncached_tokens"].to_numpy()
    emitting = _emitting(df)
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        sel = (first >= a) & (first < b)
        w = (b - a) * num_gpus
        rows.append({"t_s": a - t0, "cached": cached[sel].sum() / w,
                     "uncached": uncached[sel].sum() / w,
                     "output": _output_in_window(emitting, a, b) / w})
    return pd.DataFrame(rows)


def _interactivity(itl: LatencyHistogram) -> float:
    p90 = itl.percentile(90)
    return 1e3 / p90 if p90 and not math.isnan(p90) else math.nan


def _pct(s: pd.Series, q: float) -> float:
    s = s.dropna()
    return float(np.percentile(s, q)) if len(s) else math.nan


def fleet_tables(df: pd.DataFrame, steps: pd.DataFrame, layout: FleetLayout, t0: float,
                 t1: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-rack and per-instance tables of a simulated fleet over the window [t0, t1).

    racks: GPUs, requests prefilled and decoded (sent in the window), tokens/s/GPU (input
    credited to the prefill rack, output to the decode rack), TTFT P90, interactivity, cache
    hit rate, share of its prefilled requests decoded in another rack, sessions moved here
    (spill or prefix).
    instances: role (prefill, decode, colocated), rack, steps and busy share in the window,
    mean step, requests, and for decode and colocated instances their ITL P90 and
    interactivity."""
    window = max(t1 - t0, 1e-9)
    first = df["first_token_s"]
    in_win = (first >= t0) & (first < t1)
    sent = df[(df["send_s"] >= t0) & (df["send_s"] < t1) & (df["phase"] != "primer")]
    by_rack_itl: dict[int, list[LatencyHistogram]] = {}
    for name, h in layout.decode_itl.items():
        by_rack_itl.setdefault(layout.instance_racks[name], []).append(h)
    rows = []
    for k, gpus in enumerate(layout.rack_gpus):
        pre, dec = df["prefill_rack"] == k, df["decode_rack"] == k
        inputs = float(df.loc[in_win & pre, ["cached_tokens", "uncached_tokens"]].sum().sum())
        output = _output_in_window(_emitting(df[dec]), t0, t1)
        mine = sent[sent["prefill_rack"] == k]
        prompt = float(mine["prompt_tokens"].sum())
        rows.append({
            "rack": k, "gpus": gpus, "requests": len(mine),
            "requests_decoded": int((sent["decode_rack"] == k).sum()),
            "throughput_tok_s_gpu": (inputs + output) / (gpus * window) if gpus else math.nan,
            "output_tok_s_gpu": output / (gpus * window) if gpus else math.nan,
            "ttft_p90_ms": _pct(mine["ttft_ms"], 90),
            "interactivity_tok_s": _interactivity(
                LatencyHistogram.merged(by_rack_itl.get(k, []))),
            "cache_hit_rate": float(mine["cached_tokens"].sum()) / prompt if prompt else math.nan,
            "decoded_elsewhere_share": float((mine["decode_rack"] != k).mean())
            if len(mine) else math.nan,
            "sessions_moved_in": int(mine["route"].str.match("spill|prefix_moved").sum()),
        })
    in_window = (steps["start_s"] >= t0) & (steps["start_s"] < t1)
    durations = steps.loc[in_window, ["instance", "duration_ms"]]  # all a group needs
    inst = []
    for name, g in durations.groupby("instance", sort=False)["duration_ms"]:
        decode = name in layout.decode_itl  # decode and colocated instances emit tokens
        role = name.rpartition("-")[0] or name  # "decode" alone is the only decode instance
        index = int(name.rpartition("-")[2]) if "-" in name else 0
        n = int((sent["decode_instance" if role == "decode" else "prefill_instance"]
                 == index).sum())
        row = {"instance": name, "role": role,
               "rack": layout.instance_racks[name], "steps": len(g),
               "busy_share": float(g.sum()) / 1e3 / window,
               "step_ms_mean": float(g.mean()), "requests": n}
        if decode:
            h = layout.decode_itl[name]
            row.update(itl_p90_ms=h.percentile(90), interactivity_tok_s=_interactivity(h))
        inst.append(row)
    return pd.DataFrame(rows), pd.DataFrame(inst)


def summarize(records: Records, step_rows: list[tuple] | StepLog,
              itl: LatencyHistogram | None, t0: float, t1: float, num_gpus: int,
              pricing: PricingSpec,
              extra: dict | None = None, fleet: FleetLayout | None = None) -> Result:
    """Metrics of a run (simulated or measured) over the window [t0, t1); with `fleet`, also
    per rack and per instance (`fleet_tables`; step rows join the instance table by name)."""
    df = requests_frame(records)
    steps = steps_frame(step_rows)
    window = max(t1 - t0, 1e-9)
    gpu_s = num_gpus * window
    first = df["first_token_s"]
    in_win = (first >= t0) & (first < t1)
    cached = float(df.loc[in_win, "cached_tokens"].sum())
    uncached = float(df.loc[in_win, "uncached_tokens"].sum())
    output = _output_in_window(_emitting(df), t0, t1)
    if itl is None:
        itl = itl_from_token_times(records, t0, t1)
    sent = df[(df["send_s"] >= t0) & (df["send_s"] < t1) & (df["phase"] != "primer")]
    done = sent[sent["error"].isna() & sent["finish_s"].notna()]
    p90 = itl.percentile(90)
    revenue_usd = (cached * pricing.cached_input_usd_per_mtok
                   + uncached * pricing.uncached_input_usd_per_mtok
                   + output * pricing.output_usd_per_mtok) / 1e6
    revenue_h = revenue_usd / (gpu_s / 3600.0)
    prompt = cached + uncached

    summary = {
        "throughput_tok_s_gpu": (cached + uncached + output) / gpu_s,
        "cached_input_tok_s_gpu": cached / gpu_s,
        "uncached_input_tok_s_gpu": uncached / gpu_s,
        "output_tok_s_gpu": output / gpu_s,
        "interactivity_tok_s": _interactivity(itl),
        "itl_p50_ms": itl.percentile(50), "itl_p90_ms": p90, "itl_p99_ms": itl.percentile(99),
        "tpot_p50_ms": _pct(done["tpot_ms"], 50), "tpot_p90_ms": _pct(done["tpot_ms"], 90),
        "ttft_p50_ms": _pct(done["ttft_ms"], 50), "ttft_p90_ms": _pct(done["ttft_ms"], 90),
        "ttft_p99_ms": _pct(done["ttft_ms"], 99),
        "revenue_usd_gpu_h": revenue_h, "cost_usd_gpu_h": pricing.gpu_hour_usd,
        "margin_usd_gpu_h": revenue_h - pricing.gpu_hour_usd,
        "cache_hit_rate": cached / prompt if prompt else math.nan,
        "requests_sent": int(len(sent)), "requests_finished": int(len(done)),
        "requests_failed": int(sent["error"].notna().sum()),
        "requests_in_flight": int((sent["finish_s"].isna() & sent["error"].isna()).sum()),
        "window_s": window, "num_gpus": num_gpus,
    }
    for stage, mean in ttft_stages_ms(done).mean().items():  # NaN where none is known
        summary[f"ttft_{stage}_ms"] = float(mean)
    racks = instances = pd.DataFrame()
    if fleet is not None:
        racks, instances = fleet_tables(df, steps, fleet, t0, t1)
        summary["racks"] = len(fleet.rack_gpus)
        for role, share in instances.groupby("role")["busy_share"].mean().items():
            summary[f"{role}_busy_share"] = float(share)
        summary["decoded_elsewhere_share"] = float(
            (sent["decode_rack"] != sent["prefill_rack"]).mean()) if len(sent) else math.nan
    summary.update(extra or {})
    return Result(summary=summary, requests=df, steps=steps,
                  timeseries=timeseries(df, t0, t1, num_gpus), itl=itl, racks=racks,
                  instances=instances)
