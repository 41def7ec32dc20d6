"""Why a TTFT is what it is: its mean split by stage, and how busy the prefill instances were."""

from __future__ import annotations

import math

import pytest

from rackSim.config import compose_scenario
from rackSim.metrics.summary import TTFT_STAGES, Result
from rackSim.report.table import format_summary
from rackSim.run import simulate

STAGE_KEYS = [f"ttft_{stage}_ms" for stage, *_ in TTFT_STAGES]


def _run(*overrides: str) -> Result:
    cfg = compose_scenario(["experiment=smoke", "workload.replay.window_s=20",
                            "progress=false", *overrides])
    return simulate(cfg, progress=False)


@pytest.fixture(scope="module")
def light() -> Result:
    return _run("workload.replay.concurrency=8")


@pytest.fixture(scope="module")
def heavy() -> Result:
    """Six times the smoke scenario's clients on its two DEP2 prefill instances."""
    return _run("workload.replay.concurrency=300")


def _mean_ttft_ms(result: Result) -> float:
    s, r = result.summary, result.requests
    done = r[(r["send_s"] >= s["window_start_s"]) & (r["send_s"] < s["window_end_s"])
             & (r["phase"] != "primer") & r["error"].isna() & r["finish_s"].notna()]
    return float(done["ttft_ms"].mean())


def test_the_stages_add_up_to_the_mean_ttft(light: Result, heavy: Result) -> None:
    for result in (light, heavy):
        parts = [result.summary[k] for k in STAGE_KEYS]
        assert all(p >= 0 for p in parts)
        assert sum(parts) == pytest.approx(_mean_ttft_ms(result), rel=1e-9)


def test_an_overloaded_prefill_shows_as_its_queue(light: Result, heavy: Result) -> None:
    """Light: a prompt rarely waits and the prefill instances idle most of the window.
    Heavy: they compute all the time and the wait for a step is most of the TTFT."""
    lo, hi = light.summary, heavy.summary
    assert lo["ttft_prefill_queue_ms"] < 0.5 * lo["ttft_prefill_ms"]
    assert lo["prefill_busy_share"] < 0.5
    assert hi["ttft_prefill_queue_ms"] > 0.5 * sum(hi[k] for k in STAGE_KEYS)
    assert hi["prefill_busy_share"] > 0.95
    text = format_summary(hi)
    assert "TTFT mean by stage (ms)      prefill wait " in text and "prefill instances busy" in text


def test_a_colocated_instance_emits_the_first_token_with_the_prompt() -> None:
    s = _run("deployment=colocated_dep16", "deployment.prefill.instances=0",
             "deployment.decode.instances=0", "deployment.colocated.instances=1",
             "deployment.colocated.gpus=4").summary
    assert s["ttft_prefill_ms"] > 0
    assert s["ttft_kv_transfer_ms"] == s["ttft_decode_admission_ms"] == 0.0
    assert s["ttft_first_step_ms"] == 0.0
    assert "prefill_busy_share" not in s and s["colocated_busy_share"] > 0


def test_a_summary_without_stages_prints_none() -> None:
    """A measured run's records have no stage times: no line rather than a row of n/a."""
    text = format_summary({"ttft_p90_ms": 100.0, **{k: math.nan for k in STAGE_KEYS}})
    assert "by stage" not in text and "busy" not in text
