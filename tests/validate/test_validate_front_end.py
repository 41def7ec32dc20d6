"""The front-end in a profile: CPU per output token from the API server's and the driver's
counters, the intake from the run's client-minus-server TTFT, both by hand; the profile's
file keeps them and refuses an intake larger than the delay it is part of."""

from __future__ import annotations

import json

import pytest
from validate_support import TRUE_COEFFS, simulated_run_dir

from rackSim.config.errors import ProfileInputError
from rackSim.perf.measured import Profile, ServerShape
from rackSim.validate.compare import ttft_all_mean_ms
from rackSim.validate.ingest import load_driver_run
from rackSim.validate.runs import fit_run, frontend_output_ms, predict_run


def _scrapes(run, before: dict[str, float], after: dict[str, float]) -> None:
    """A scrapes.jsonl with one 'before' and one 'after' scrape of these counters."""
    lines = [{"t_s": t, "endpoint": "http://x", "label": label,
              "samples": [[name, {}, value] for name, value in values.items()]}
             for t, label, values in ((0.0, "before", before), (9.0, "after", after))]
    (run / "scrapes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _driver_cpu(run, seconds: float) -> None:
    meta = json.loads((run / "run.json").read_text())
    meta["segments"] = [{"driver_cpu_s": seconds / 2}, {"driver_cpu_s": seconds / 2}]
    (run / "run.json").write_text(json.dumps(meta))


@pytest.fixture
def run(tmp_path):
    return simulated_run_dir(tmp_path / "run", 3, 1, window_s=8.0)


def test_cpu_per_output_token_is_the_api_server_s_plus_the_driver_s(run):
    recs, _, _ = load_driver_run(run)
    tokens = sum(r.output_tokens for r in recs)
    _scrapes(run, {"process_cpu_seconds_total": 10.0, "vllm:generation_tokens_total": 100},
             {"process_cpu_seconds_total": 10.6, "vllm:generation_tokens_total": 1100})
    _driver_cpu(run, 0.3)
    ms, prov = frontend_output_ms(run, recs)
    # 0.6 s over 1000 tokens at the server, 0.3 s over the records' tokens at the driver
    assert prov["api_server_ms"] == pytest.approx(0.6)
    assert prov["driver_ms"] == pytest.approx(300.0 / tokens)
    assert ms == pytest.approx(0.6 + 300.0 / tokens) and "missing" not in prov


def test_a_run_without_scrapes_has_no_api_server_part_and_says_so(run):
    recs, _, _ = load_driver_run(run)
    ms, prov = frontend_output_ms(run, recs)
    assert ms == 0.0 and "no /metrics scrapes" in prov["missing"]
    prof = fit_run(run, "records", ServerShape())
    assert prof.intake_ms == 0.0 and "TTFT histogram" in prof.provenance["intake_ms"]["missing"]


def test_the_intake_is_the_client_minus_server_ttft_the_outputs_do_not_explain(run):
    recs, _, _ = load_driver_run(run)
    n = sum(1 for r in recs if r.error is None and r.first_token_s == r.first_token_s)
    client = ttft_all_mean_ms(recs)
    # the server counted every request's TTFT 4 ms shorter than its client; no CPU counters,
    # so no output delay: all 4 ms are intake
    _scrapes(run, {"vllm:time_to_first_token_seconds_sum": 0.0,
                   "vllm:time_to_first_token_seconds_count": 0},
             {"vllm:time_to_first_token_seconds_sum": n * (client - 4.0) / 1e3,
              "vllm:time_to_first_token_seconds_count": n})
    prof = fit_run(run, "records", ServerShape(), refine=True)
    assert prof.output_ms == 0.0 and prof.api_overhead_ms > 4.0
    assert prof.intake_ms == pytest.approx(4.0, abs=1e-6)
    assert prof.provenance["intake_ms"]["client_minus_server_ttft_ms"] == pytest.approx(4.0)
    # and the prediction's server TTFT leaves the intake (and any output delay) out
    pred = predict_run(run, prof)
    gap = pred.predicted["ttft_all_mean_ms"] - pred.predicted["server_ttft_mean_ms"]
    assert gap == pytest.approx(4.0, abs=0.5)


def test_the_profile_file_keeps_the_front_end_and_refuses_an_intake_beyond_its_delay(tmp_path):
    prof = Profile(coeffs=dict(TRUE_COEFFS), api_overhead_ms=9.0, intake_ms=6.0, output_ms=1.2)
    back = Profile.from_yaml(prof.to_yaml(tmp_path / "p.yaml"))
    assert (back.api_overhead_ms, back.intake_ms, back.output_ms) == (9.0, 6.0, 1.2)
    text = (tmp_path / "p.yaml").read_text()
    (tmp_path / "big.yaml").write_text(text.replace("intake_ms: 6.0", "intake_ms: 12.0"))
    with pytest.raises(ProfileInputError, match="intake_ms must be at most api_overhead_ms"):
        Profile.from_yaml(tmp_path / "big.yaml")
    (tmp_path / "neg.yaml").write_text(text.replace("output_ms: 1.2", "output_ms: -1"))
    with pytest.raises(ProfileInputError, match="output_ms must be a number >= 0"):
        Profile.from_yaml(tmp_path / "neg.yaml")


def test_the_server_side_delay_is_set_by_the_server_s_own_ttft_in_the_window(tmp_path):
    """A run simulated with 10 ms before the scheduler, 4 of them intake, and the server's TTFT
    histogram scraped before, twice inside the window and after: the iteration-log fit
    recovers the 4 ms the server does not count and the 6 it does (within 1.5 ms: its
    between-steps overhead is estimated ~15 % high from the busy time, which the server-side
    delay absorbs); the window's scrapes leave the primers out."""
    from rackSim.validate.colocated import simulate_colocated
    from rackSim.validate.runs import run_workload
    from rackSim.workload.sources import load_sessions

    truth = Profile(coeffs=dict(TRUE_COEFFS), overhead_ms=1.0, api_overhead_ms=10.0,
                    intake_ms=4.0, server=ServerShape())
    run = simulated_run_dir(tmp_path / "run", 4, 2, window_s=8.0, truth=truth,
                            iteration_log=True)
    wl, seed = run_workload(run)
    sim = simulate_colocated(load_sessions(wl, seed), wl.replay, truth, seed=seed)
    done = [r for r in sim.records if r.first_token_s == r.first_token_s]

    def ttft_by(t: float) -> dict[str, float]:
        seen = [(r.prefill_end_s - r.send_s) - 4e-3 for r in done if r.prefill_end_s <= t]
        return {"vllm:time_to_first_token_seconds_sum": sum(seen),
                "vllm:time_to_first_token_seconds_count": len(seen)}

    a, b = sim.window_start_s + 1.0, sim.window_end_s - 1.0
    lines = [{"t_s": t, "endpoint": "http://x", "label": label,
              "samples": [[n, {}, v] for n, v in ttft_by(t).items()]}
             for t, label in ((-1.0, "before"), (a, "during"), (b, "during"),
                              (sim.sim_s + 1.0, "after"))]
    (run / "scrapes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    prof = fit_run(run, "log", ServerShape())
    assert prof.intake_ms == pytest.approx(4.0, abs=0.01)
    assert prof.api_overhead_ms - prof.intake_ms == pytest.approx(6.0, abs=1.5)
    prov = prof.provenance["intake_ms"]
    assert prov["window_s"] == [a, b] and prov["window_server_ttft_mean_ms"] > 0
    # placed by a line through the window's TTFT simulated at six delays: it grows about one
    # for one with the delay (each request waits it once), within a few ms of the line
    line = prov["server_delay_line"]
    assert len(line["x"]) == len(line["y"]) == 6
    assert 0.7 < line["slope"] < 1.3 and line["residual"] < 3.0
