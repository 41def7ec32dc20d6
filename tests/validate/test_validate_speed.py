"""Predicting a run at the speed it measured: a profile priced `factor` times slower, the run's
speed read from its iteration log, `compare --at-run-speed`, and the grid's second prediction.

The runs are the colocated model's own, with the simulated steps written as the server's
iteration log; a 'slow' run is the same model priced 1.3x slower, so the speed to recover and
the error it explains are known exactly."""

from __future__ import annotations

import pytest
from validate_support import TRUE_COEFFS, simulated_run_dir

from rackSim.perf.measured import Profile, ServerShape
from rackSim.validate.command import EXIT_BAD_INPUT, EXIT_OK, main
from rackSim.validate.grid import AT_RUN_SPEED, GridSpec, held_out_table, run_grid
from rackSim.validate.runs import fit_run, predict_run, run_speed

TRUTH = Profile(coeffs=dict(TRUE_COEFFS), overhead_ms=1.0, api_overhead_ms=10.0,
                server=ServerShape())
SLOW = 1.3


def test_a_profile_at_speed_scales_the_engine_not_the_front_end():
    p = TRUTH.at_speed(SLOW)
    # the step's model time and the between-steps overhead scale; the request's front-end not
    assert p.step_ms(1000, 2, 5) == pytest.approx(SLOW * TRUTH.step_ms(1000, 2, 5), rel=1e-12)
    assert p.overhead_ms == pytest.approx(SLOW) and p.api_overhead_ms == 10.0
    assert TRUTH.coeffs == TRUE_COEFFS  # the original is left alone
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="speed factor"):
            TRUTH.at_speed(bad)


def test_the_reference_speed_is_the_median_of_the_step_jitter():
    assert Profile(coeffs=dict(TRUE_COEFFS), step_jitter=[0.8, 0.9, 1.1, 1.5]).fit_run_ratio \
        == pytest.approx(1.0)
    assert TRUTH.fit_run_ratio is None  # no jitter: not fitted on an iteration log


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A fitting run (4 lanes) at the profile's speed and a held-out run (8 lanes) 1.3x
    slower, both with iteration logs, and the profile fitted on the first one's log."""
    d = tmp_path_factory.mktemp("speed")
    fit = simulated_run_dir(d / "fit", 4, 1, window_s=10.0, truth=TRUTH, iteration_log=True)
    slow = simulated_run_dir(d / "slow", 8, 2, window_s=10.0, truth=TRUTH.at_speed(SLOW),
                             iteration_log=True)
    return fit, slow, fit_run(fit, "log", TRUTH.server)


def test_the_run_speed_is_read_from_its_iteration_log(runs):
    fit, slow, prof = runs
    # noise-free steps: the fit recovers the truth, so the speeds come out exact to 1 %
    assert run_speed(fit, prof) == pytest.approx(1.0, rel=0.01)
    assert run_speed(slow, prof) == pytest.approx(SLOW, rel=0.01)


def test_predicting_at_run_speed_removes_the_machine_s_share_of_the_error(runs):
    fit, slow, prof = runs
    own = predict_run(fit, prof).table.set_index("key").error_pct
    raw = predict_run(slow, prof).table.set_index("key").error_pct
    fixed = predict_run(slow, prof, at_run_speed=True)
    err = fixed.table.set_index("key").error_pct
    assert fixed.speed == pytest.approx(SLOW, rel=0.01)
    # priced at the fitting run's speed, the slow run's ITL comes out ~1/1.3 - 1 = -23 %;
    # at its own speed, what is left is the profile's own error, the one it makes on its
    # fitting run (its between-steps overhead is estimated ~15 % high from the busy time):
    # ITL the same within 1.5 points, throughput (another load) within 6 %
    assert raw["itl_p50_ms"] < -15 and raw["throughput_tok_s_gpu"] > 10
    for key in ("itl_p50_ms", "itl_p90_ms"):
        assert abs(err[key] - own[key]) < 1.5, (key, err[key], own[key])
    assert abs(err["throughput_tok_s_gpu"]) < 6


def test_at_run_speed_needs_a_log_profile_and_a_run_with_a_log(runs, tmp_path):
    fit, _, prof = runs
    with pytest.raises(ValueError, match="no step jitter.*fit --source log"):
        predict_run(fit, TRUTH, at_run_speed=True)
    bare = simulated_run_dir(tmp_path / "bare", 2, 1, window_s=5.0)
    with pytest.raises(ValueError, match="kept no server log range.*--server-log"):
        run_speed(bare, prof)


def test_compare_at_run_speed(runs, tmp_path, capsys):
    fit, slow, prof = runs
    path = prof.to_yaml(tmp_path / "p.yaml")
    assert main(["compare", "--run", str(slow), "--profile", str(path), "--at-run-speed",
                 "--out", str(tmp_path / "c")]) == EXIT_OK
    assert "at the run's speed (1.30x its fitting run's step time)" in capsys.readouterr().out
    bare = simulated_run_dir(tmp_path / "bare", 2, 1, window_s=5.0)
    assert main(["compare", "--run", str(bare), "--profile", str(path),
                 "--at-run-speed"]) == EXIT_BAD_INPUT
    assert "--server-log" in capsys.readouterr().err


def test_the_grid_predicts_log_profiles_again_at_each_run_s_speed(tmp_path):
    def runner(concurrency, seed, out):
        out.mkdir(parents=True, exist_ok=True)
        truth = TRUTH if concurrency == 4 else TRUTH.at_speed(SLOW)
        return simulated_run_dir(out, concurrency, seed, window_s=8.0, truth=truth,
                                 iteration_log=True)

    spec = GridSpec(fit_concurrency=4, concurrencies=(8,), seeds=(3,), window_s=8.0,
                    sources=("iteration_log",), repeat=False)
    df = run_grid(spec, runner, tmp_path, "sim", progress=lambda _: None)
    assert set(df.profile) == {"iteration_log", "iteration_log" + AT_RUN_SPEED}
    held = df[df.role == "held_out"]
    assert held[held.profile == "iteration_log"].speed.eq(1.0).all()
    assert held[held.profile.str.endswith(AT_RUN_SPEED)].speed.iloc[0] == pytest.approx(
        SLOW, rel=0.01)
    wide = held_out_table(df).set_index("profile")
    assert abs(wide.loc["iteration_log", "itl_p50_ms"]) > 15
    assert abs(wide.loc["iteration_log" + AT_RUN_SPEED, "itl_p50_ms"]) < 6
