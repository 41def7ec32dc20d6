"""The grid (fit at one concurrency, predict the others) on runs whose records come from the
colocated model itself: the bookkeeping, the held-out table, the files, and bad specs."""

from __future__ import annotations

import pandas as pd
import pytest
from validate_support import simulated_run_dir

from rackSim.validate.compare import HEADLINE
from rackSim.validate.grid import (
    GridSpec,
    format_held_out,
    format_repeatability,
    held_out_table,
    repeatability,
    run_grid,
    write_grid,
)


def _runner(concurrency: int, seed: int, out):
    out.mkdir(parents=True, exist_ok=True)
    return simulated_run_dir(out, concurrency, seed, window_s=10.0)


def test_grid_fits_once_per_seed_and_predicts_every_point(tmp_path):
    spec = GridSpec(fit_concurrency=3, concurrencies=(1, 5), seeds=(1, 2), window_s=10.0,
                    sources=("driver_records",))
    seen = []
    df = run_grid(spec, _runner, tmp_path, "sim", progress=seen.append)
    assert len(seen) == 8  # 2 seeds x (fit point + 2 held-out points + the fit point again)
    assert set(df.role) == {"fit", "held_out", "repeat"}
    assert set(df[df.role == "fit"].concurrency) == {3}
    assert set(df[df.role == "repeat"].concurrency) == {3}
    assert (tmp_path / "seed2" / "c3-repeat" / "records.jsonl").exists()
    # the simulated server repeats itself exactly: the floor under every prediction is 0
    rep = repeatability(df)
    assert len(rep) == 2 and set(HEADLINE) <= set(rep.columns)
    assert (rep[list(HEADLINE)].abs() < 1e-9).all().all()
    assert format_repeatability(rep).count("\n") == 3
    assert (tmp_path / "seed1" / "profile-driver_records.yaml").exists()
    wide = held_out_table(df)
    assert len(wide) == 4 and set(HEADLINE) <= set(wide.columns)
    # records from the model itself: the refined black-box fit predicts them within 25 %
    for m in ("itl_p50_ms", "throughput_tok_s_gpu"):
        assert wide[m].abs().max() < 25, (m, wide[m].tolist())
    text = format_held_out(wide)
    assert text.count("\n") == 4 and ("met" in text or "missed" in text)
    csv, png = write_grid(df, tmp_path / "out")
    assert len(pd.read_csv(csv)) == len(df) and png.stat().st_size > 10_000


@pytest.mark.parametrize("kwargs,match", [
    ({"concurrencies": ()}, "--concurrency:"), ({"seeds": ()}, "--seeds"),
    ({"concurrencies": (0, 2)}, "lanes must be >= 1"), ({"window_s": 0.0}, "--window-s"),
    ({"warmup_s": -1.0}, "--warmup-s must be >= 0"),
    ({"sources": ("guess",)}, "--sources: unknown")])
def test_bad_grid_specs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GridSpec(**kwargs)


def test_the_warm_up_replay_runs_at_the_grid_s_most_lanes():
    assert GridSpec(concurrencies=(2, 16, 4), warmup_s=5.0).warmup == (16, 5.0)
    assert GridSpec(warmup_s=0.0).warmup is None


def test_a_grid_without_the_repeat_has_no_repeatability_to_report(tmp_path):
    spec = GridSpec(fit_concurrency=2, concurrencies=(1,), seeds=(1,), window_s=10.0,
                    sources=("driver_records",), repeat=False)
    df = run_grid(spec, _runner, tmp_path, "sim", progress=lambda _: None)
    assert "repeat" not in set(df.role) and repeatability(df).empty


def test_a_repeat_that_moved_past_the_goal_is_named():
    rep = pd.DataFrame({"model": ["m", "m"], "seed": [1, 2], "ttft_p50_ms": [-3.0, 4.0],
                        "itl_p50_ms": [2.0, -31.0], "throughput_tok_s_gpu": [5.0, 1.0]})
    last = format_repeatability(rep).splitlines()[-1]
    # ITL P50 moved 31 % (goal 10 %); TTFT P50's 4 % and throughput's 5 % are within theirs
    assert "itl_p50 31 % > 10 %" in last and "ttft" not in last and "throughput" not in last


def _waited(run, wait_s: float):
    """`run` as if its model worker had waited `wait_s` for a CPU over a 20-s replay."""
    import json

    meta = json.loads((run / "run.json").read_text())
    meta["segments"] = [{"start_s": 0.0, "end_s": 20.0}]
    meta["server_cpu_s"] = {"VLLM::Worker": {"cpu_s": 20.0, "wait_s": wait_s},
                            "python": {"cpu_s": 3.0, "wait_s": 1.0}}
    (run / "run.json").write_text(json.dumps(meta))
    return run


def test_a_run_on_a_busy_machine_is_named(tmp_path):
    """A run during which one of the server's processes waited for a CPU more than a second
    per second of the replay (run.json `server_cpu_s`) is marked busy in the table and the
    progress line; the others (waits of a quiet machine, or none measured) are not."""

    def runner(concurrency: int, seed: int, out):
        return _waited(_runner(concurrency, seed, out), 30.0 if concurrency == 5 else 2.0)

    spec = GridSpec(fit_concurrency=3, concurrencies=(1, 5), seeds=(1,), window_s=10.0,
                    sources=("driver_records",), repeat=False)
    seen = []
    df = run_grid(spec, runner, tmp_path, "sim", progress=seen.append)
    assert df[df.concurrency == 5].busy.all() and not df[df.concurrency != 5].busy.any()
    assert df[df.concurrency == 5].server_wait_s_per_s.iloc[0] == pytest.approx(1.5)
    assert df[df.concurrency == 1].server_wait_s_per_s.iloc[0] == pytest.approx(0.1)
    assert [("machine busy" in line) for line in seen] == [False, False, True]
    lines = format_held_out(held_out_table(df)).splitlines()[1:]
    assert [line.endswith("(machine busy)") for line in lines] == [False, True]
    plain = run_grid(spec, _runner, tmp_path / "plain", "sim", progress=lambda _m: None)
    assert plain.server_wait_s_per_s.isna().all() and not plain.busy.any()


def test_a_busy_run_is_measured_again_and_kept_beside(tmp_path):
    """`retry_busy`: a run on a busy machine is measured again (up to the retries given), the
    busy one kept as <run>-busy<k>; a quiet run is measured once; no retries, no second
    measurement; a negative count is refused."""
    from rackSim.validate.grid import retry_busy

    def busy_first(times: int, calls: list):
        """A runner whose first `times` measurements meet a busy machine."""
        def run(concurrency: int, seed: int, out):
            calls.append(out.name)
            return _waited(_runner(concurrency, seed, out), 30.0 if len(calls) <= times else 2.0)
        return run

    calls, said = [], []
    got = retry_busy(busy_first(2, calls), 2, said.append)(5, 1, tmp_path / "c5")
    assert got == tmp_path / "c5" and calls == ["c5"] * 3 and len(said) == 2
    assert (tmp_path / "c5-busy1" / "run.json").exists()
    assert (tmp_path / "c5-busy2" / "run.json").exists()
    assert "machine busy" in said[0] and "c5-busy1" in said[0]
    calls = []
    retry_busy(busy_first(0, calls), 5, said.append)(4, 1, tmp_path / "c4")
    assert calls == ["c4"] and not list(tmp_path.glob("c4-busy*"))
    calls = []
    got = retry_busy(busy_first(9, calls), 0, said.append)(2, 1, tmp_path / "c2")
    assert calls == ["c2"] and not list(tmp_path.glob("c2-busy*"))
    calls = []
    retry_busy(busy_first(9, calls), 1, said.append)(3, 1, tmp_path / "c3")  # still busy
    assert calls == ["c3"] * 2
    assert sorted(p.name for p in tmp_path.glob("c3*")) == ["c3", "c3-busy1"]
    with pytest.raises(ValueError, match="--busy-retries -1: must be >= 0"):
        retry_busy(busy_first(0, []), -1)


def test_a_recorded_grid_is_fitted_and_predicted_again_without_measuring(tmp_path, capsys):
    """`grid --recorded SRC --out DST`: the runs of SRC, fitted and predicted again with the
    code as it is (here the same code: the same table), profiles and tables written into DST,
    no run recorded there; a run the grid asks for that SRC does not hold is named."""
    from rackSim.validate.command import EXIT_BAD_INPUT, EXIT_OK, main

    spec = GridSpec(fit_concurrency=3, concurrencies=(1, 5), seeds=(1,), window_s=10.0,
                    repeat=False, sources=("driver_records",))
    src, dst = tmp_path / "src", tmp_path / "dst"
    before = run_grid(spec, _runner, src, "sim", progress=lambda _m: None)
    write_grid(before, src)
    args = ["grid", "--recorded", str(src), "--out", str(dst), "--fit-concurrency", "3",
            "--seeds", "1", "--no-repeat", "--sources", "driver_records"]
    assert main([*args, "--concurrency", "1", "5"]) == EXIT_OK
    again = pd.read_csv(dst / "grid.csv")
    cols = ["model", "seed", "concurrency", "profile", "metric", "measured", "predicted"]
    pd.testing.assert_frame_equal(again[cols], pd.read_csv(src / "grid.csv")[cols])
    assert set(again.model) == {"sim"}  # the recorded grid's own name, not --model's default
    assert (dst / "seed1" / "profile-driver_records.yaml").exists()
    assert not list(dst.glob("seed1/c*"))
    capsys.readouterr()
    assert main([*args, "--concurrency", "1", "7"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "seed1/c7 holds no recorded run" in err and "--concurrency" in err
    assert main(["grid", "--recorded", str(tmp_path / "none"), "--out", str(dst)]) \
        == EXIT_BAD_INPUT
    assert "no such grid directory" in capsys.readouterr().err


def test_a_run_whose_server_drifted_is_named(tmp_path):
    """A run whose drift probe flagged the server (run.json `probe`) is marked drifting in
    the held-out table and its text; the others are not."""
    import json

    def runner(concurrency: int, seed: int, out):
        run = _runner(concurrency, seed, out)
        meta = json.loads((run / "run.json").read_text())
        meta["probe"] = {"http://x": {"drifting": concurrency == 5}}
        (run / "run.json").write_text(json.dumps(meta))
        return run

    spec = GridSpec(fit_concurrency=3, concurrencies=(1, 5), seeds=(1,), window_s=10.0,
                    sources=("driver_records",), repeat=False)
    seen = []
    wide = held_out_table(run_grid(spec, runner, tmp_path, "sim", progress=seen.append))
    assert wide.set_index("concurrency").drifting.to_dict() == {1: False, 5: True}
    assert [line.endswith("(server drifting)") for line in seen] == [False, False, True]
    lines = format_held_out(wide).splitlines()[1:]
    assert [line.endswith("(server drifting)") for line in lines] == [False, True]
