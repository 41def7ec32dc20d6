"""Measured vs predicted: the same workload, replayed for real and simulated, side by side.

Both sides are summarised by `rackSim.metrics.summarize` over their own measurement windows
(one 'GPU' = the one server, so throughput is tokens/s of the server). Reported: TTFT P50/P90,
ITL P50/P90, total throughput (cached + uncached input + output tokens/s) and output tokens/s;
error = (predicted - measured) / measured.

ITL definition. The project's interactivity arithmetic gives a step of duration T that emits
k tokens to a request k gaps of T / k. A real client sometimes receives several tokens in one
delivery (on a busy two-core machine the API server falls behind the engine and its output
queue coalesces): the raw client view then holds one long gap and k - 1 near-zero gaps. The
headline ITL applies the same arithmetic to deliveries: tokens arriving within
`coalesce_ms` of the previous one form one delivery, and a delivery of k tokens after a gap G
counts as k gaps of G / k (tokens delivered together with the first token carry no gap). The
raw per-token client gaps are reported as `itl_raw_*` alongside, with `coalesced_share`, the
share of tokens that arrived coalesced. When either side's share exceeds `BURSTY_SHARE` the
raw percentiles compare delivery batching, not step time: their error is reported as "bursty"
(NaN in the CSV, with the reason in its `note` column) rather than as a number.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from rackSim.metrics.histogram import LatencyHistogram
from rackSim.metrics.records import Records
from rackSim.metrics.summary import Result, itl_from_token_times, summarize
from rackSim.validate.colocated import ZERO_PRICING
from rackSim.validate.scrape import SERVER_MEANS
from rackSim.workload.graph import SessionGraph

COALESCE_MS = 0.5
NEAR_ZERO_MS = 1.0  # a time measured below this (an empty queue) gets no relative error
BURSTY_SHARE = 0.05  # coalesced tokens above this share make raw per-token gaps meaningless
RAW_ITL = ("itl_raw_p50_ms", "itl_raw_p90_ms")
ROWS = (("TTFT P50 (ms)", "ttft_p50_ms"), ("TTFT P90 (ms)", "ttft_p90_ms"),
        ("ITL P50 (ms)", "itl_p50_ms"), ("ITL P90 (ms)", "itl_p90_ms"),
        ("throughput (tok/s)", "throughput_tok_s_gpu"), ("output (tok/s)", "output_tok_s_gpu"),
        ("ITL raw P50 (ms)", "itl_raw_p50_ms"), ("ITL raw P90 (ms)", "itl_raw_p90_ms"),
        ("cache hit rate", "cache_hit_rate"), ("client lag mean (ms)", "client_lag_mean_ms"),
        ("coalesced tokens", "coalesced_share"),
        ("TTFT mean, all (ms)", "ttft_all_mean_ms"),
        ("TTFT mean at server (ms)", "server_ttft_mean_ms"),
        ("queue mean at server (ms)", "server_queue_mean_ms"),
        ("prefill mean at server (ms)", "server_prefill_mean_ms"))
NOT_COMPARED = ("client_lag_mean_ms", "coalesced_share")  # descriptive: no error is computed
HEADLINE = ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms", "throughput_tok_s_gpu")


def short_name(metric: str) -> str:
    """A metric's name without its unit, for table heads and figure labels ('itl_p50')."""
    return metric.replace("_tok_s_gpu", "").replace("_ms", "")


def delivery_gaps(times_s: list[float], coalesce_ms: float = COALESCE_MS) -> np.ndarray:
    """Per-token gaps (ms) with coalesced deliveries spread evenly (module docstring)."""
    t = np.asarray(times_s, dtype=float)
    if t.size < 2:
        return np.zeros(0)
    gaps = np.diff(t) * 1e3
    out: list[float] = []
    i, n = 0, gaps.size
    while i < n and gaps[i] < coalesce_ms:  # delivered with the first token
        i += 1
    while i < n:
        g, k = gaps[i], 1
        i += 1
        while i < n and gaps[i] < coalesce_ms:
            g += gaps[i]
            k += 1
            i += 1
        out.extend([g / k] * k)
    return np.asarray(out)


def coalesced_share(records: Records, t0: float, t1: float,
                    coalesce_ms: float = COALESCE_MS) -> float:
    """Share of inter-token gaps (requests whose first token falls in [t0, t1)) shorter than
    `coalesce_ms`: tokens that reached the client in the same delivery as the one before."""
    short = total = 0
    for r in records:
        if r.error is not None or not (t0 <= r.first_token_s < t1) or len(r.token_times_s) < 2:
            continue
        gaps = np.diff(np.asarray(r.token_times_s, dtype=float)) * 1e3
        short += int((gaps < coalesce_ms).sum())
        total += gaps.size
    return short / total if total else math.nan


def itl_from_deliveries(records: Records, t0: float, t1: float,
                        coalesce_ms: float = COALESCE_MS) -> LatencyHistogram:
    """ITL histogram (ms) of the gaps of requests whose first token falls in [t0, t1)."""
    hist = LatencyHistogram()
    for r in records:
        if r.error is not None or not (t0 <= r.first_token_s < t1):
            continue
        g = delivery_gaps(r.token_times_s, coalesce_ms)
        if g.size:
            hist.add_many(np.maximum(g, 1e-6))
    return hist


def client_lag_ms(records: Records, sessions: list[SessionGraph]) -> np.ndarray:
    """Per request (ms): send - (last dependency's finish + its tool delay), i.e. how late the
    client sent a ready request. 0 in the simulator; on a real machine it is the client's and
    the API server's reaction time (the final chunk's delivery included)."""
    graphs = {g.session_id: g for g in sessions}
    done = {(r.session_key, r.rid): r for r in records
            if r.phase != "primer" and not math.isnan(r.finish_s)}
    out = []
    for r in done.values():
        g = graphs.get(r.session_id)
        if g is None or r.rid >= len(g.requests):
            continue
        spec = g.requests[r.rid]
        deps = [done.get((r.session_key, a)) for a in spec.after]
        if spec.after and all(d is not None for d in deps):
            out.append((r.send_s - max(d.finish_s for d in deps) - spec.delay_s) * 1e3)
    return np.asarray(out)


def summarize_run(records: Records, t0: float, t1: float, label: str,
                  coalesce_ms: float = COALESCE_MS,
                  sessions: list[SessionGraph] | None = None,
                  server: dict[str, float] | None = None) -> Result:
    """Summary of a measured or simulated run over [t0, t1) with both ITL views (and the
    client's mean reaction lag when `sessions` are given). Two TTFT means cover the whole run
    (primer and warm-up included, as the server's own histogram does): as the client saw it,
    and as the server measured it, with the server's queue and prefill means (`server`, keys
    of `scrape.SERVER_MEANS`: from /metrics for a measured run, `runs.simulated_server_means_ms`
    for a simulated one; NaN when absent); the client's minus the server's TTFT is the
    front-end's share."""
    itl = itl_from_deliveries(records, t0, t1, coalesce_ms)
    raw = itl_from_token_times(records, t0, t1)
    lag = client_lag_ms(records, sessions) if sessions is not None else np.zeros(0)
    return summarize(records, [], itl, t0, t1, 1, ZERO_PRICING,
                     {"source": label, "itl_raw_p50_ms": raw.percentile(50),
                      "itl_raw_p90_ms": raw.percentile(90),
                      "client_lag_mean_ms": float(lag.mean()) if lag.size else math.nan,
                      "coalesced_share": coalesced_share(records, t0, t1, coalesce_ms),
                      "ttft_all_mean_ms": ttft_all_mean_ms(records),
                      **{k: (server or {}).get(k, math.nan) for k in SERVER_MEANS}})


def ttft_all_mean_ms(records: Records) -> float:
    """Mean TTFT (ms) of every successful request of a run, primer and warm-up included."""
    ttft = [r.ttft_ms for r in records if r.error is None and not math.isnan(r.first_token_s)]
    return float(np.mean(ttft)) if ttft else math.nan


def _fmt(x: float, spec: str) -> str:
    """x formatted with `spec`, without the sign of a value that rounds to zero; 'n/a' for a
    value that was not measured (NaN)."""
    if math.isnan(x):
        return "n/a"
    text = format(x, spec)
    return text.replace("-", "", 1) if float(text.rstrip("%")) == 0 else text


def compare_summaries(measured: dict, predicted: dict) -> pd.DataFrame:
    """One row per metric: measured, predicted, error_pct = (pred - meas) / meas x 100, and a
    note where no error is computed (descriptive rows; raw ITL when tokens are bursty; a time
    measured under NEAR_ZERO_MS, such as an empty queue)."""
    shares = [float(side.get("coalesced_share", math.nan)) for side in (measured, predicted)]
    share = max((x for x in shares if not math.isnan(x)), default=0.0)
    bursty = share > BURSTY_SHARE
    rows = []
    for label, key in ROWS:
        m, p = float(measured.get(key, math.nan)), float(predicted.get(key, math.nan))
        note = ""
        if key in NOT_COMPARED:
            note = "descriptive"
        elif key in RAW_ITL and bursty:
            note = f"bursty ({share:.0%} of tokens coalesced)"
        elif key.endswith("_ms") and abs(m) < NEAR_ZERO_MS:
            note = f"under {NEAR_ZERO_MS:g} ms measured: no relative error"
        err = (p - m) / m * 100 if not note and m and not math.isnan(m) and not math.isnan(p) \
            else math.nan
        rows.append({"metric": label, "key": key, "measured": m, "predicted": p,
                     "error_pct": err, "note": note})
    return pd.DataFrame(rows)


def format_table(df: pd.DataFrame, title: str = "") -> str:
    """The comparison as aligned text: 'bursty' or 'n/a' where no error is meaningful."""
    lines = [title] if title else []
    lines.append(f"{'metric':<28}{'measured':>12}{'predicted':>12}{'error':>10}")
    for r in df.itertuples():
        if r.note.startswith("bursty"):
            err = "bursty"
        elif math.isnan(r.error_pct):
            err = "n/a"
        else:
            err = _fmt(r.error_pct, "+.1f") + "%"
        lines.append(f"{r.metric:<28}{_fmt(r.measured, '.2f'):>12}"
                     f"{_fmt(r.predicted, '.2f'):>12}{err:>10}")
    return "\n".join(lines)


def write_comparison(df: pd.DataFrame, out_dir: Path, title: str = "measured vs predicted"
                     ) -> tuple[Path, Path]:
    """Write comparison.csv and comparison.png (grouped bars per metric) into `out_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    csv = out_dir / "comparison.csv"
    df.to_csv(csv, index=False)
    groups = (("TTFT (ms)", ("ttft_p50_ms", "ttft_p90_ms")),
              ("ITL (ms)", ("itl_p50_ms", "itl_p90_ms")),
              ("throughput (tok/s)", ("throughput_tok_s_gpu", "output_tok_s_gpu")))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    idx = df.set_index("key")
    for ax, (name, keys) in zip(axes, groups, strict=True):
        x = np.arange(len(keys))
        m = [idx.loc[k, "measured"] for k in keys]
        p = [idx.loc[k, "predicted"] for k in keys]
        ax.bar(x - 0.2, m, 0.4, label="measured")
        ax.bar(x + 0.2, p, 0.4, label="predicted")
        for xi, (pv, k) in enumerate(zip(p, keys, strict=True)):
            e = idx.loc[k, "error_pct"]
            if not math.isnan(e):
                ax.annotate(f"{e:+.0f}%", (xi + 0.2, pv), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, [short_name(k) for k in keys],
                      fontsize=8)
        ax.set_ylim(0, 1.12 * np.nanmax([*m, *p, 0.0]) or 1.0)  # room for the error labels
        ax.set_title(name)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    png = out_dir / "comparison.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return csv, png
