"""Predicting a run at the speed it measured: a profile priced slower per kind of work, the
run's speeds read from its iteration log, `compare --at-run-speed`, and the grid's second
prediction.

The runs are the colocated model's own, with the simulated steps written as the server's
iteration log; a 'slow' run is the same model with its decode-side work priced 1.3x and its
prefill work 1.1x slower, so the speeds to recover and the error they explain are known
exactly."""

from __future__ import annotations

import pytest
from validate_support import TRUE_COEFFS, simulated_run_dir

from rackSim.config.errors import ProfileInputError
from rackSim.perf.measured import Profile, ServerShape
from rackSim.validate.command import EXIT_BAD_INPUT, EXIT_OK, main
from rackSim.validate.grid import AT_RUN_SPEED, GridSpec, held_out_table, run_grid
from rackSim.validate.runs import fit_run, predict_run, run_speed

TRUTH = Profile(coeffs=dict(TRUE_COEFFS), overhead_ms=1.0, api_overhead_ms=10.0,
                server=ServerShape())
SLOW, PREFILL = 1.3, 1.1  # the slow run's decode-side and prefill work, x the fitting run's


def test_a_profile_at_speed_scales_each_kind_of_work_by_its_factor():
    p = TRUTH.at_speed(decode=SLOW, prefill=1.1)
    c = TRUE_COEFFS
    # a step with 1000 prefill tokens of 2 requests and 5 decodes, by hand
    decode_side = SLOW * (c["const_ms"] + 5 * c["per_decode_request_ms"] + 1.0)
    prefill_side = 1.1 * (1000 * c["per_prefill_token_ms"] + 2 * c["per_prefill_request_ms"])
    assert p.step_ms(1000, 2, 5) == pytest.approx(decode_side + prefill_side, rel=1e-12)
    assert p.overhead_ms == pytest.approx(SLOW) and p.api_overhead_ms == 10.0
    assert TRUTH.coeffs == TRUE_COEFFS  # the original is left alone
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="prefill speed factor"):
            TRUTH.at_speed(1.0, bad)


def test_the_reference_speeds_are_the_fitting_run_s_medians_per_kind_of_step():
    rows = [("e", i, 0.0, ms, pr, pt, d, d, 0.0, 0, 0.0) for i, (ms, pr, pt, d) in enumerate(
        [(3.0, 0, 0, 1), (3.6, 0, 0, 2), (9.0, 0, 0, 4), (20.0, 1, 500, 0)])]
    prof = Profile(coeffs=dict(TRUE_COEFFS), overhead_ms=1.0)
    # fitted (overhead excluded): 2.4, 2.8, 3.6 ms decode-only, median ratio 3.6 / 2.8; the
    # prefill step's 20 ms less its decode side (2 ms at that ratio) over 10 + 3 ms of prefill
    decode = 3.6 / 2.8
    assert prof.ratios(rows) == pytest.approx({"decode": decode,
                                               "prefill": (20.0 - decode * 2.0) / 13.0})
    assert prof.ratios(rows[:1]) == pytest.approx({"decode": 3.0 / 2.4})
    assert prof.ratios(rows[3:]) == pytest.approx({"prefill": 18.0 / 13.0})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A fitting run (4 lanes) at the profile's speed and a held-out run (8 lanes) whose
    decode-side work is 1.3x and prefill work 1.1x slower, both with iteration logs, and the
    profile fitted on the first one's log."""
    d = tmp_path_factory.mktemp("speed")
    fit = simulated_run_dir(d / "fit", 4, 1, window_s=10.0, truth=TRUTH, iteration_log=True)
    slow = simulated_run_dir(d / "slow", 8, 2, window_s=10.0,
                             truth=TRUTH.at_speed(SLOW, PREFILL), iteration_log=True)
    return fit, slow, fit_run(fit, "log", TRUTH.server)


def test_the_run_speed_is_read_from_its_iteration_log(runs):
    fit, slow, prof = runs
    # noise-free steps: the fit recovers the truth, so the speeds come out exact to 1 %
    assert run_speed(fit, prof) == pytest.approx({"decode": 1.0, "prefill": 1.0}, rel=0.01)
    assert run_speed(slow, prof) == pytest.approx({"decode": SLOW, "prefill": PREFILL},
                                                  rel=0.01)


def test_predicting_at_run_speed_removes_the_machine_s_share_of_the_error(runs):
    fit, slow, prof = runs
    own = predict_run(fit, prof).table.set_index("key").error_pct
    raw = predict_run(slow, prof).table.set_index("key").error_pct
    fixed = predict_run(slow, prof, at_run_speed=True)
    err = fixed.table.set_index("key").error_pct
    assert fixed.speed == pytest.approx({"decode": SLOW, "prefill": PREFILL}, rel=0.01)
    # priced at the fitting run's speed, the slow run's ITL comes out ~1/1.3 - 1 = -23 %;
    # at its own speed, what is left is the profile's own error, the one it makes on its
    # fitting run (its between-steps overhead is estimated ~15 % high from the busy time):
    # ITL P50 the same within 2 points, throughput (another load) within 6 %. ITL P90 sits
    # between the decode steps' gaps and the prefill steps' (twice as long) at 8 lanes, so a
    # small change of the mix moves it by 10-15 %: at its own speed it keeps at most a third
    # of the error priced at the fitting run's speed (-45 %)
    assert raw["itl_p50_ms"] < -15 and raw["throughput_tok_s_gpu"] > 5
    assert abs(err["itl_p50_ms"] - own["itl_p50_ms"]) < 2, (err["itl_p50_ms"], own["itl_p50_ms"])
    assert raw["itl_p90_ms"] < -30 and abs(err["itl_p90_ms"]) < abs(raw["itl_p90_ms"]) / 3
    assert abs(err["throughput_tok_s_gpu"]) < 6


def test_at_run_speed_needs_a_log_profile_and_a_run_with_a_log(runs, tmp_path):
    fit, _, prof = runs
    with pytest.raises(ValueError, match="no step_ratios.*fit --source log"):
        predict_run(fit, TRUTH, at_run_speed=True)
    bare = simulated_run_dir(tmp_path / "bare", 2, 1, window_s=5.0)
    with pytest.raises(ValueError, match="kept no server log range.*--server-log"):
        run_speed(bare, prof)


def test_compare_at_run_speed(runs, tmp_path, capsys):
    fit, slow, prof = runs
    path = prof.to_yaml(tmp_path / "p.yaml")
    assert main(["compare", "--run", str(slow), "--profile", str(path), "--at-run-speed",
                 "--out", str(tmp_path / "c")]) == EXIT_OK
    assert ("at the run's speed (decode 1.30x, prefill 1.10x its fitting run's step time)"
            in capsys.readouterr().out)
    bare = simulated_run_dir(tmp_path / "bare", 2, 1, window_s=5.0)
    assert main(["compare", "--run", str(bare), "--profile", str(path),
                 "--at-run-speed"]) == EXIT_BAD_INPUT
    assert "--server-log" in capsys.readouterr().err


def test_the_grid_predicts_log_profiles_again_at_each_run_s_speed(tmp_path):
    def runner(concurrency, seed, out):
        out.mkdir(parents=True, exist_ok=True)
        truth = TRUTH if concurrency == 4 else TRUTH.at_speed(SLOW, PREFILL)
        return simulated_run_dir(out, concurrency, seed, window_s=8.0, truth=truth,
                                 iteration_log=True)

    spec = GridSpec(fit_concurrency=4, concurrencies=(8,), seeds=(3,), window_s=8.0,
                    sources=("iteration_log",), repeat=False)
    df = run_grid(spec, runner, tmp_path, "sim", progress=lambda _: None)
    assert set(df.profile) == {"iteration_log", "iteration_log" + AT_RUN_SPEED}
    held = df[df.role == "held_out"]
    assert held[held.profile == "iteration_log"].speed_decode.eq(1.0).all()
    again = held[held.profile.str.endswith(AT_RUN_SPEED)].iloc[0]
    assert (again.speed_decode, again.speed_prefill) == pytest.approx((SLOW, PREFILL), rel=0.01)
    wide = held_out_table(df).set_index("profile")
    assert abs(wide.loc["iteration_log", "itl_p50_ms"]) > 15
    assert abs(wide.loc["iteration_log" + AT_RUN_SPEED, "itl_p50_ms"]) < 6


def test_the_profile_file_keeps_the_reference_speeds_and_refuses_bad_ones(runs, tmp_path):
    _, _, prof = runs
    path = prof.to_yaml(tmp_path / "p.yaml")
    assert Profile.from_yaml(path).step_ratios == pytest.approx(prof.step_ratios)
    assert set(prof.step_ratios) == {"decode", "prefill"}
    text = path.read_text()
    for bad in ("step_ratios: {decode: -1.0}", "step_ratios: {fast: 1.0}", "step_ratios: 3"):
        (tmp_path / "bad.yaml").write_text(
            text.replace("step_ratios:", bad + "\nold_ratios:", 1))
        with pytest.raises(ProfileInputError, match="step_ratios must map decode / prefill"):
            Profile.from_yaml(tmp_path / "bad.yaml")
