"""Throughput, latency and revenue accounting against hand calculations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rackSim.config.specs import PricingSpec
from rackSim.metrics.histogram import LatencyHistogram
from rackSim.metrics.records import RequestRecord
from rackSim.metrics.summary import summarize

PRICES = PricingSpec(name="t", cached_input_usd_per_mtok=0.003,
                     uncached_input_usd_per_mtok=0.15, output_usd_per_mtok=0.60,
                     gpu_hour_usd=5.0)


def rec(send, first, finish, prompt, cached, out, **kw):
    return RequestRecord(session_id="s", rid=kw.pop("rid", 0), lane=0, session_key=0, agent=0,
                         send_s=send, prompt_tokens=prompt, cached_tokens=cached,
                         output_tokens=out, first_token_s=first, finish_s=finish, **kw)


def test_throughput_split_and_revenue():
    # Window [0, 100) s on 4 GPUs. Request A entirely inside; request B's first token falls
    # outside (its input is not counted) but half of its decode span is inside.
    a = rec(10, 11, 21, prompt=100_000, cached=90_000, out=1001, rid=0)
    b = rec(95, 100, 120, prompt=50_000, cached=0, out=401, rid=1)
    r = summarize([a, b], [], None, 0.0, 100.0, 4, PRICES)
    s = r.summary
    gpu_s = 400.0
    assert s["cached_input_tok_s_gpu"] == pytest.approx(90_000 / gpu_s)
    assert s["uncached_input_tok_s_gpu"] == pytest.approx(10_000 / gpu_s)
    # A: 1001 tokens; B: first token at t=100 is outside, its span [100,120] is outside too.
    assert s["output_tok_s_gpu"] == pytest.approx(1001 / gpu_s)
    assert s["throughput_tok_s_gpu"] == pytest.approx((100_000 + 1001) / gpu_s)
    usd = (90_000 * 0.003 + 10_000 * 0.15 + 1001 * 0.60) / 1e6
    assert s["revenue_usd_gpu_h"] == pytest.approx(usd / (gpu_s / 3600))
    assert s["margin_usd_gpu_h"] == pytest.approx(s["revenue_usd_gpu_h"] - 5.0)
    assert s["cache_hit_rate"] == pytest.approx(0.9)


def test_output_spread_evenly_and_clipped():
    # 101 tokens: the first at t=50, the other 100 evenly over (50, 150]; window ends at 100.
    r = summarize([rec(40, 50, 150, 1000, 0, 101)], [], None, 0.0, 100.0, 1, PRICES)
    assert r.summary["output_tok_s_gpu"] * 100 == pytest.approx(1 + 50)


def test_latency_percentiles_and_tpot():
    recs = [rec(0, 0.1 * (i + 1), 0.1 * (i + 1) + 1.0, 10, 0, 101, rid=i) for i in range(10)]
    r = summarize(recs, [], None, 0.0, 100.0, 1, PRICES)
    ttfts = [100.0 * (i + 1) for i in range(10)]
    assert r.summary["ttft_p50_ms"] == pytest.approx(np.percentile(ttfts, 50))
    assert r.summary["ttft_p90_ms"] == pytest.approx(np.percentile(ttfts, 90))
    assert r.summary["tpot_p90_ms"] == pytest.approx(10.0)  # 1 s / 100 gaps


def test_interactivity_from_token_times():
    # A step of 16.6 ms emitting 3.25 tokens gives gaps of 5.1 ms: ~196 tokens/s per user.
    gap = 16.6 / 3.25 / 1e3
    times = [1.0 + gap * k for k in range(200)]
    r = summarize([rec(0.5, times[0], times[-1], 10, 0, 200, token_times_s=times)], [], None,
                  0.0, 100.0, 1, PRICES)
    assert r.summary["interactivity_tok_s"] == pytest.approx(3.25 / 16.6e-3, rel=0.011)


def test_failed_and_unfinished_requests_are_counted_not_measured():
    ok = rec(1, 2, 3, 10, 0, 5, rid=0)
    failed = rec(1, math.nan, 2, 10, 0, 0, rid=1, error="HTTP 500")
    open_ = rec(1, 2, math.nan, 10, 0, 3, rid=2)
    s = summarize([ok, failed, open_], [], None, 0.0, 100.0, 1, PRICES).summary
    assert (s["requests_sent"], s["requests_finished"], s["requests_failed"],
            s["requests_in_flight"]) == (3, 1, 1, 1)


def test_histogram_percentiles_within_one_percent():
    rng = np.random.default_rng(0)
    x = rng.lognormal(1.5, 0.6, 20_000)
    h = LatencyHistogram()
    h.add_many(x)
    for q in (50, 90, 99):
        assert h.percentile(q) == pytest.approx(np.percentile(x, q), rel=0.01)
    assert h.mean() == pytest.approx(x.mean(), rel=0.01)


def test_weighted_histogram_matches_expanded_samples():
    h = LatencyHistogram()
    h.add(5.0, 3.25 * 100)   # 100 requests x a mid step of 16.25 ms
    h.add(20.0, 10)
    assert h.total == pytest.approx(335)
    assert h.percentile(50) == pytest.approx(5.0, rel=0.01)
    assert h.percentile(99) == pytest.approx(20.0, rel=0.01)
    assert math.isnan(LatencyHistogram().percentile(90))
