"""Fitting: known coefficients are recovered; the profile round-trips; the step model prices
steps by hand arithmetic; the black-box fit recovers a profile from simulated records."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.stats import norm

from rackSim.perf.measured import (
    COEFFS,
    JITTER_LEVELS,
    MeasuredStepModel,
    Profile,
    ServerShape,
)
from rackSim.perf.step import DecodeBatch, PrefillBatch
from rackSim.validate.colocated import simulate_colocated
from rackSim.validate.compare import delivery_gaps, summarize_run
from rackSim.validate.fit import fit_driver_records, fit_iteration_log
from rackSim.validate.refine import refine_overheads, solve_by_line
from rackSim.validate.workloads import cpu_tiny_workload
from rackSim.workload.sources import load_sessions

TRUE = {"const_ms": 2.0, "per_prefill_token_ms": 0.02, "per_prefill_request_ms": 3.0,
        "per_decode_request_ms": 0.4, "per_context_token_ms": 0.0}


def _steps(n: int = 600, noise_ms: float = 0.2, seed: int = 0, jitter_sigma: float = 0.0
           ) -> list[tuple]:
    """Logged steps of a server with the TRUE coefficients, additive normal noise (ms) and a
    multiplicative log-normal jitter of the step time."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        p_req = int(rng.integers(0, 3))
        p_tok = int(rng.integers(50, 2000)) * p_req
        d_req = int(rng.integers(0, 12))
        t = (TRUE["const_ms"] + TRUE["per_prefill_token_ms"] * p_tok
             + TRUE["per_prefill_request_ms"] * p_req + TRUE["per_decode_request_ms"] * d_req
             + rng.normal(0, noise_ms)) * math.exp(rng.normal(0, jitter_sigma))
        rows.append(("engine-0", i, math.nan, t, p_req, p_tok, d_req, float(d_req), math.nan, 0,
                     math.nan) + (math.nan,) * 10)
    return rows


def test_log_fit_recovers_coefficients():
    prof = fit_iteration_log(_steps())
    for k in ("const_ms", "per_prefill_token_ms", "per_prefill_request_ms",
              "per_decode_request_ms"):
        assert prof.coeffs[k] == pytest.approx(TRUE[k], rel=0.05, abs=0.02), k
    assert prof.residuals["all"]["rmse_ms"] == pytest.approx(0.2, rel=0.2)
    assert prof.residuals["all"]["r2"] > 0.99


def test_log_fit_measures_the_step_jitter():
    """Steps 0.3 log-normal around their counts' time: the profile's jitter quantiles are the
    log-normal's (the soft-L1 fit centres the median), within 8 %."""
    q = np.array(fit_iteration_log(_steps(4000, noise_ms=0.0, jitter_sigma=0.3)).step_jitter)
    assert len(q) == JITTER_LEVELS and np.all(np.diff(q) >= 0)
    for level in (4, 20, 36):  # P11, P51, P91
        p = (level + 0.5) / JITTER_LEVELS
        assert q[level] == pytest.approx(math.exp(0.3 * norm.ppf(p)), rel=0.08), level


def test_step_jitter_multiplies_the_model_time_not_the_overhead():
    """Each step draws one of the profile's jitter factors (seeded) and scales the step's
    model time by it; the between-steps overhead stays."""
    prof = Profile(coeffs=dict(TRUE), overhead_ms=1.0, step_jitter=[0.5, 1.5])
    batch = DecodeBatch(requests_per_rank=[8], context_tokens_per_rank=[100],
                        tokens_per_request=1.0, draft_tokens=0, new_loads=0,
                        admitted_prompt_tokens=0, step_index=0)

    def totals(seed: int) -> list[float]:
        model = MeasuredStepModel.from_profile(prof, seed=seed)
        return [model.decode_step(batch).total_ms for _ in range(5000)]

    base = 2.0 + 0.4 * 8
    a = totals(3)
    assert set(np.round(a, 9)) == {round(1.0 + 0.5 * base, 9), round(1.0 + 1.5 * base, 9)}
    assert np.mean(a) == pytest.approx(1.0 + base, rel=0.03)
    assert a == totals(3) and a != totals(4)
    plain = MeasuredStepModel.from_profile(Profile(coeffs=dict(TRUE), overhead_ms=1.0))
    assert plain.decode_step(batch).total_ms == pytest.approx(1.0 + base)


def test_a_decode_step_draws_its_whole_time_from_the_decode_jitter():
    """With a decode_jitter, a step without prefill scales its model time and the time
    between steps by a draw from it; a step with prefill keeps step_jitter on its model time
    only."""
    prof = Profile(coeffs=dict(TRUE), overhead_ms=1.0, step_jitter=[0.5, 1.5],
                   decode_jitter=[0.8, 1.2])
    model = MeasuredStepModel.from_profile(prof, seed=5)
    decode = DecodeBatch(requests_per_rank=[8], context_tokens_per_rank=[100],
                         tokens_per_request=1.0, draft_tokens=0, new_loads=0,
                         admitted_prompt_tokens=0, step_index=0)
    prefill = PrefillBatch(new_tokens=100, attended_tokens=100, num_requests=1,
                           admitted_prompt_tokens=100, ranks=1)
    whole = 1.0 + 2.0 + 0.4 * 8
    got = {round(model.decode_step(decode).total_ms, 9) for _ in range(200)}
    assert got == {round(0.8 * whole, 9), round(1.2 * whole, 9)}
    work = 2.0 + 0.02 * 100 + 3.0
    got = {round(model.prefill_step(prefill).total_ms, 9) for _ in range(200)}
    assert got == {round(1.0 + 0.5 * work, 9), round(1.0 + 1.5 * work, 9)}


def test_log_fit_needs_steps():
    with pytest.raises(ValueError, match="need at least 8"):
        fit_iteration_log(_steps(5))


def test_profile_yaml_roundtrip_and_errors(tmp_path):
    prof = fit_iteration_log(_steps())
    prof.overhead_ms, prof.api_overhead_ms = 1.5, 7.0
    path = prof.to_yaml(tmp_path / "p.yaml")
    back = Profile.from_yaml(path)
    assert back.coeffs == pytest.approx(prof.coeffs)
    assert (back.overhead_ms, back.api_overhead_ms) == (1.5, 7.0)
    assert back.residuals["all"]["n"] == 600 and back.provenance["source"] == "iteration_log"
    assert back.step_jitter == pytest.approx(prof.step_jitter) and len(back.step_jitter) == 40
    (tmp_path / "bad.yaml").write_text("format: something-else\n")
    with pytest.raises(ValueError, match="racksim-validate fit"):
        Profile.from_yaml(tmp_path / "bad.yaml")
    bad = path.read_text().replace("step_jitter:", "step_jitter: [0.0, 1.0]\nold_jitter:")
    (tmp_path / "bad_jitter.yaml").write_text(bad)
    with pytest.raises(ValueError, match="step_jitter must be a list of positive numbers"):
        Profile.from_yaml(tmp_path / "bad_jitter.yaml")
    prof.intake_stall_ms, prof.intake_stall_per_token_ms = 2.5, 0.0004
    prof.decode_jitter = [1.0] * len(prof.step_jitter)
    back = Profile.from_yaml(prof.to_yaml(path))
    assert (back.intake_stall_ms, back.intake_stall_per_token_ms) == (2.5, 0.0004)
    assert back.decode_jitter == prof.decode_jitter
    text = path.read_text()
    (tmp_path / "neg.yaml").write_text(text.replace("intake_stall_ms: 2.5",
                                                    "intake_stall_ms: -1.0"))
    with pytest.raises(ValueError, match="intake_stall_ms must be a number >= 0"):
        Profile.from_yaml(tmp_path / "neg.yaml")
    (tmp_path / "short.yaml").write_text(text.replace("decode_jitter:\n- 1.0\n",
                                                      "decode_jitter:\n"))
    with pytest.raises(ValueError, match="decode_jitter has 39 levels, step_jitter 40"):
        Profile.from_yaml(tmp_path / "short.yaml")


def test_measured_step_model_arithmetic(tmp_path):
    prof = Profile(coeffs=dict(TRUE), overhead_ms=1.0)
    cfg = SimpleNamespace(perf=SimpleNamespace(profile=prof.to_yaml(tmp_path / "p.yaml")))
    model = MeasuredStepModel(cfg, role="prefill", seed=1)  # the build_step_model hook
    pf = model.prefill_step(PrefillBatch(new_tokens=1000, attended_tokens=1500, num_requests=2,
                                         admitted_prompt_tokens=1000, ranks=1))
    assert pf.total_ms == pytest.approx(2.0 + 1.0 + 0.02 * 1000 + 3.0 * 2)
    dc = model.decode_step(DecodeBatch(requests_per_rank=[5, 8], context_tokens_per_rank=[1, 2],
                                       tokens_per_request=1.0, draft_tokens=0, new_loads=0,
                                       admitted_prompt_tokens=0, step_index=3))
    assert dc.total_ms == pytest.approx(2.0 + 1.0 + 0.4 * 8)
    with pytest.raises(ValueError, match="perf.profile"):
        MeasuredStepModel(SimpleNamespace(perf=SimpleNamespace(profile=None)))


def test_the_time_between_steps_grows_with_the_requests_in_the_step(tmp_path):
    """overhead_ms per step plus overhead_per_request_ms per prefill or decode request in it,
    on the engine's side (scaled by the decode speed, kept by the profile file)."""
    prof = Profile(coeffs=dict(TRUE), overhead_ms=1.0, overhead_per_request_ms=0.25)
    model = MeasuredStepModel.from_profile(prof)
    mixed = model.mixed_step(
        PrefillBatch(new_tokens=100, attended_tokens=100, num_requests=2,
                     admitted_prompt_tokens=100, ranks=1),
        DecodeBatch(requests_per_rank=[3], context_tokens_per_rank=[0.0], tokens_per_request=1.0,
                    draft_tokens=0, new_loads=0, admitted_prompt_tokens=0, step_index=0))
    between = 1.0 + 0.25 * (2 + 3)
    assert mixed.cpu == pytest.approx(2.0 + between)
    assert mixed.total_ms == pytest.approx(2.0 + 0.02 * 100 + 3.0 * 2 + 0.4 * 3 + between)
    assert prof.step_ms(100, 2, 3) == pytest.approx(mixed.total_ms)
    assert prof.at_speed(2.0, 1.0).between_steps_ms(5) == pytest.approx(2 * between)
    back = Profile.from_yaml(prof.to_yaml(tmp_path / "p.yaml"))
    assert back.overhead_per_request_ms == 0.25
    text = (tmp_path / "p.yaml").read_text()
    (tmp_path / "neg.yaml").write_text(text.replace("overhead_per_request_ms: 0.25",
                                                    "overhead_per_request_ms: -0.1"))
    with pytest.raises(ValueError, match="overhead_per_request_ms must be a number >= 0"):
        Profile.from_yaml(tmp_path / "neg.yaml")


def _fit_between_steps(tmp_path, lanes: int, stall: tuple[float, float] = (0.0, 0.0)
                       ) -> Profile:
    """The log fit of a run on `lanes` lanes of a server whose engine spends 0.5 ms + 0.3 ms
    per request between the logged steps, and `stall` (ms, ms per prompt token) of a
    decode-only step per request sent during it."""
    from validate_support import simulated_run_dir

    from rackSim.validate.runs import fit_run

    truth = Profile(coeffs=dict(TRUE), overhead_ms=0.5, overhead_per_request_ms=0.3,
                    api_overhead_ms=10.0, intake_stall_ms=stall[0],
                    intake_stall_per_token_ms=stall[1], server=ServerShape())
    run = simulated_run_dir(tmp_path / "run", lanes, 1, window_s=10.0, truth=truth,
                            iteration_log=True)
    return fit_run(run, "log", ServerShape())


def test_the_log_fit_splits_the_time_between_steps_by_the_clients_token_gaps(tmp_path):
    """A server whose engine spends 0.5 ms + 0.3 ms per request between the logged steps:
    the log has the steps without it, the records' token gaps with it. The fit reads the
    line of the median gap on the requests decoding (2.5 + 0.7 ms per request) and takes
    the logged model step (2 + 0.4 ms per request) from it; the medians per decoding count
    and the line are kept in the provenance."""
    prof = _fit_between_steps(tmp_path, lanes=6)
    assert prof.coeffs["per_decode_request_ms"] == pytest.approx(0.4, abs=0.02)
    # the gaps at each decoding count are whole steps (the prefill steps left out), so the
    # line is exact; the busy time per step is not (it also counts requests inside their
    # 10 ms before the scheduler at an idle engine)
    assert prof.overhead_per_request_ms == pytest.approx(0.3, abs=0.01)
    assert prof.overhead_ms == pytest.approx(0.5, abs=0.01)
    assert prof.provenance["between_steps_ms"] > 0.5 + 0.3 * 2
    gaps = prof.provenance["token_gaps"]
    assert gaps["decoding"][0] == 1 and len(gaps["decoding"]) >= 3
    assert gaps["slope_ms_per_request"] == pytest.approx(0.7, abs=0.01)
    assert gaps["intercept_ms"] == pytest.approx(2.5, abs=0.02)
    # a decode step of a server without jitter takes its median time at every count
    assert prof.decode_jitter == pytest.approx([1.0] * JITTER_LEVELS, abs=1e-6)
    assert prof.provenance["intake_stall"]["stall_ms"] == pytest.approx(0.0, abs=1e-6)


def test_the_log_fit_reads_the_intake_stall_from_the_gaps_a_request_was_sent_in(tmp_path):
    """A server whose decode steps take 2 ms + 0.001 ms per prompt token longer for each
    request sent while they run: the gaps with one send in them exceed the median at their
    decoding count by exactly that, and the fit reads the line back; the other gaps (the
    time between steps, the spread) are as without it."""
    prof = _fit_between_steps(tmp_path, lanes=6, stall=(2.0, 0.001))
    stall = prof.provenance["intake_stall"]
    assert stall["samples"] >= 30
    assert prof.intake_stall_ms == pytest.approx(2.0, abs=0.02)
    assert prof.intake_stall_per_token_ms == pytest.approx(0.001, abs=2e-5)
    # a 1,500-token prompt stalls the step in progress 2 + 0.001 x 1,500 = 3.5 ms
    assert prof.intake_stall_ms + prof.intake_stall_per_token_ms * 1500 == pytest.approx(
        3.5, abs=0.05)
    assert prof.overhead_ms == pytest.approx(0.5, abs=0.01)
    assert prof.overhead_per_request_ms == pytest.approx(0.3, abs=0.01)
    assert prof.decode_jitter == pytest.approx([1.0] * JITTER_LEVELS, abs=1e-6)


def test_an_intake_stalls_the_decode_step_in_progress_and_a_prefill_step_absorbs_it():
    """Every decode-only step takes, on top of its priced time, 2 ms + 0.001 ms per prompt
    token of each request sent while it ran (its extension included); a step that computes
    a prompt takes nothing for the requests sent during it, and an idle engine nothing."""
    from rackSim.metrics.records import STEP_COLUMNS

    truth = Profile(coeffs=dict(TRUE), overhead_ms=0.5, api_overhead_ms=4.0,
                    intake_stall_ms=2.0, intake_stall_per_token_ms=0.001)
    wl = cpu_tiny_workload(6, window_s=10.0)
    sim = simulate_colocated(load_sessions(wl, 3), wl.replay, truth, seed=3)
    sends = sorted((r.send_s, r.prompt_tokens) for r in sim.records)
    cpu = STEP_COLUMNS.index("cpu_ms")
    stalled = absorbed = 0
    for row in sim.steps:
        start, end = row[2], row[2] + row[3] / 1e3
        # sent strictly inside (a send at the step's end, one rounding apart, is not)
        inside = [n for t, n in sends if start + 1e-9 < t < end - 1e-9]
        extra = row[cpu] - TRUE["const_ms"] - truth.between_steps_ms(row[4] + row[6])
        if row[4]:  # a prompt's chunk in the step
            assert extra == pytest.approx(0.0, abs=1e-9)
            absorbed += bool(inside)
        else:
            assert extra == pytest.approx(sum(2.0 + 0.001 * n for n in inside), abs=1e-9)
            stalled += bool(inside)
    assert stalled >= 30 and absorbed >= 5


def test_blackbox_fit_recovers_simulated_server():
    """Records from the colocated model with a known profile -> black-box fit -> simulate
    again: the refit predicts the same TTFT P50 and throughput within 15 %."""
    truth = Profile(coeffs=dict(TRUE), api_overhead_ms=5.0,
                    server=ServerShape(max_num_batched_tokens=2048))
    wl = cpu_tiny_workload(4, window_s=30.0)
    sessions = load_sessions(wl, 5)
    sim = simulate_colocated(sessions, wl.replay, truth, seed=5)
    prof = fit_driver_records(sim.records, truth.server)
    again = simulate_colocated(sessions, wl.replay, prof, seed=5)
    a = summarize_run(sim.records, sim.window_start_s, sim.window_end_s, "truth").summary
    b = summarize_run(again.records, again.window_start_s, again.window_end_s, "refit").summary
    for key in ("ttft_p50_ms", "throughput_tok_s_gpu", "itl_p50_ms"):
        assert b[key] == pytest.approx(a[key], rel=0.15), key
    assert set(prof.coeffs) == set(COEFFS)


def test_refine_recovers_overheads():
    """Records simulated with known overheads; a profile with the right step coefficients but
    zero overheads is refined on them and reproduces TTFT P50 and ITL P50 within 5 %."""
    truth = Profile(coeffs=dict(TRUE), overhead_ms=1.5, api_overhead_ms=20.0)
    wl = cpu_tiny_workload(3, window_s=20.0)
    sessions = load_sessions(wl, 2)
    sim = simulate_colocated(sessions, wl.replay, truth, seed=2)
    measured = summarize_run(sim.records, sim.window_start_s, sim.window_end_s, "m").summary
    start = Profile(coeffs=dict(TRUE))
    got = refine_overheads(start, sessions, wl.replay, 2, measured)
    reached = got.provenance["refined"]["reached"]
    assert reached["ttft_p50_ms"] == pytest.approx(measured["ttft_p50_ms"], rel=0.05)
    assert reached["itl_p50_ms"] == pytest.approx(measured["itl_p50_ms"], rel=0.05)
    assert got.api_overhead_ms == pytest.approx(20.0, rel=0.25)
    assert got.overhead_ms == pytest.approx(1.5, rel=0.25)


def test_solve_by_line_reads_the_trend_through_the_noise():
    """f = 3 + 2 x with +-1 of noise that alternates: a bisection would stop at the first
    crossing, the line meets 13 at x = 5 within the noise's pull on the fit (0.15), and a
    flat or falling f gives no answer (the line is still kept)."""
    xs = np.linspace(0.0, 10.0, 6)
    noise = np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    x, line = solve_by_line(lambda v: 3.0 + 2.0 * v + noise[int(round(v / 2))], 13.0, xs)
    assert x == pytest.approx(5.0, abs=0.15)
    assert line["slope"] == pytest.approx(2.0, abs=0.2) and line["residual"] < 1.1
    assert line["x"] == list(xs) and len(line["y"]) == 6
    assert solve_by_line(lambda v: 3.0 + 2.0 * v, -100.0, xs)[0] == 0.0  # clamped at xs[0]
    none, flat = solve_by_line(lambda v: 7.0 - v, 5.0, xs)
    assert none is None and flat["slope"] < 0


def test_delivery_gaps():
    # first token, one 10 ms gap, then 3 tokens delivered together 30.2 ms later in all
    t = np.array([0.0, 10.0, 40.0, 40.1, 40.2]) / 1e3
    assert delivery_gaps(list(t)) == pytest.approx([10.0] + [30.2 / 3] * 3)
    # tokens delivered with the first token carry no gap
    assert delivery_gaps([0.0, 0.0001, 0.01]) == pytest.approx([9.9])
    assert delivery_gaps([1.0]).size == 0


def test_one_lane_gives_no_slope_and_keeps_the_time_between_steps_whole(tmp_path):
    """One lane decodes one request at a time: a single decoding count, no line to read, so
    no per-request part; the constant is the busy time the logged steps leave, per step."""
    prof = _fit_between_steps(tmp_path, lanes=1)
    gaps = prof.provenance["token_gaps"]
    assert gaps["decoding"] == [1] and "slope_ms_per_request" not in gaps
    assert prof.overhead_per_request_ms == 0.0
    assert prof.overhead_ms == pytest.approx(prof.provenance["between_steps_ms"])
