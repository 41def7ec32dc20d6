"""A short human summary of a run for the terminal."""

from __future__ import annotations

import math

from rackSim.metrics.summary import TTFT_STAGES

_ROWS = (
    ("throughput", "throughput_tok_s_gpu", "tok/s/GPU", "{:,.0f}"),
    ("  cached input", "cached_input_tok_s_gpu", "tok/s/GPU", "{:,.0f}"),
    ("  uncached input", "uncached_input_tok_s_gpu", "tok/s/GPU", "{:,.0f}"),
    ("  output", "output_tok_s_gpu", "tok/s/GPU", "{:,.0f}"),
    ("interactivity (1/P90 ITL)", "interactivity_tok_s", "tok/s/user", "{:,.1f}"),
    ("ITL P50 / P90", ("itl_p50_ms", "itl_p90_ms"), "ms", "{:.2f}"),
    ("TPOT P90 (per request)", "tpot_p90_ms", "ms", "{:.2f}"),
    ("TTFT P50 / P90 / P99", ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"), "ms", "{:,.0f}"),
    ("prefix cache hit", "cache_hit_rate", "", "{:.1%}"),
    ("revenue", "revenue_usd_gpu_h", "$/GPU-h", "{:.2f}"),
    ("cost", "cost_usd_gpu_h", "$/GPU-h", "{:.2f}"),
    ("margin", "margin_usd_gpu_h", "$/GPU-h", "{:.2f}"),
    ("requests finished / sent", ("requests_finished", "requests_sent"), "", "{:,}"),
)


def _known(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _why(summary: dict) -> list[str]:
    """Where a request's TTFT went on average, and the share of the window the prefill
    instances spent computing (simulated runs; a measured run knows neither). A decode or
    colocated instance steps whenever it holds a request, so its busy share says little; the
    wait for a decode slot (admission) is what shows a full one."""
    lines = []
    stages = [(name, summary.get(f"ttft_{key}_ms")) for key, _, _, name in TTFT_STAGES]
    if all(_known(v) for _, v in stages):
        lines.append(f"  {'TTFT mean by stage (ms)':<28} "
                     + ", ".join(f"{name} {v:,.0f}" for name, v in stages))
    busy = summary.get("prefill_busy_share")
    if _known(busy):
        lines.append(f"  {'prefill instances busy':<28} {min(busy, 1.0):>24.0%} of the window")
    return lines


def _fmt(fmt: str, v) -> str:
    return fmt.format(v) if _known(v) else "n/a"


def format_summary(summary: dict, title: str = "") -> str:
    lines = [title] if title else []
    if "layout" in summary:  # what ran: the scenario's name may be an experiment's (smoke)
        lines.append(f"  {'layout':<28} {summary['layout']}, {summary['num_gpus']:,} GPUs")
    for label, key, unit, fmt in _ROWS:
        keys = key if isinstance(key, tuple) else (key,)
        value = " / ".join(_fmt(fmt, summary.get(k)) for k in keys)
        lines.append(f"  {label:<28} {value:>24} {unit}")
        if "ttft_p90_ms" in keys:
            lines.extend(_why(summary))
    if summary.get("partial"):
        lines.append("  PARTIAL: interrupted before the window ended")
    elif summary.get("requests_in_flight"):  # the drain ended (or there was none) first
        lines.append(f"  NOTE: {summary['requests_in_flight']:,} requests sent in the window were "
                     "still in flight at the end, so none of their output counts; "
                     "raise workload.replay.drain_s to let them finish")
    return "\n".join(lines)
