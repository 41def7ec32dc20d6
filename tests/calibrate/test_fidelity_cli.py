"""racksim-fidelity: writes its files, refuses bad input in one line, stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rackSim.calibrate import effects as fx
from rackSim.calibrate import fidelity
from rackSim.calibrate.effects import Effect
from rackSim.calibrate.fidelity import FidelityError
from rackSim.calibrate.figures import read_figures
from rackSim.config.errors import ProfileInputError

FAST = ["--override", "experiment=smoke", "--window-s", "5", "--effects-window-s", "5",
        "--jobs", "1", "--no-loo"]


def _two_effects(cfg):  # noqa: ANN001, ANN202 - stands in for default_effects
    return [Effect("push vs pull", ("deployment.kv_transfer.mode=pull",),
                   ("deployment.kv_transfer.mode=push",), "K1", "up", 1, 1),
            Effect("noise", (), (f"seed={cfg.seed + 1}",), noise=True)]


def test_cli_writes_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(fidelity, "default_effects", _two_effects)
    monkeypatch.setattr(fidelity, "HEADLINE_FIT", tmp_path / "absent.yaml")
    out = tmp_path / "a" / "report"
    assert fidelity.main([*FAST, "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"fidelity.csv", "effects.csv", "fidelity.png",
                                              "fidelity.json"}
    table = pd.read_csv(out / "fidelity.csv")
    assert set(table["id"]) == set(read_figures())
    assert list(table.columns) == fidelity.TABLE_COLUMNS
    h4 = table.set_index("key").loc["H4"]
    assert h4["status"] == "input" and h4["predicted"] == 8 and h4["check"] == "outside"
    assert (table.loc[table["status"] == "fitted", "loo_note"] == "not run (--no-loo)").all()
    eff = pd.read_csv(out / "effects.csv", keep_default_na=False)
    assert list(eff["effect"]) == ["push vs pull", "noise"]
    summ = json.loads((out / "fidelity.json").read_text())
    assert summ["complete"] is True and summ["num_gpus"] == 8
    assert summ["overrides"] == ["experiment=smoke"] and summ["headline_fit"] is None
    assert set(summ["timings_s"]) == {"headline_s", "headline_seeds_s", "effects_s", "total_s"}
    # the headline at seeds 0 (reported), 1 and 2: each of H1-H3 gets its error's range
    assert summ["headline_seeds"] == [0, 1, 2]
    rows = table.set_index("key")
    for fid in ("H1", "H2", "H3"):
        lo, hi = rows.loc[fid, ["seed_error_min", "seed_error_max"]]
        assert lo <= rows.loc[fid, "error"] <= hi
        assert summ["error_over_seeds"][fid] == pytest.approx([lo, hi])
    assert rows.drop(index=["H1", "H2", "H3"])[["seed_error_min", "seed_error_max"]].isna(
        ).all().all()
    assert summ["effects"]["noise"]["throughput"]["throughput_ratio"] == pytest.approx(
        abs(eff.set_index("effect").loc["noise", "throughput_ratio"] - 1))
    captured = capsys.readouterr()
    printed = captured.out
    assert "H1" in printed and "push vs pull" in printed and str(out / "fidelity.json") in printed
    # each stage says it has started (minutes each; the bars show on a terminal only)
    assert captured.err.splitlines() == [
        "racksim-fidelity: the reference scenario, a 5-s window ...",
        "racksim-fidelity: the same headline scenario at seeds 1, 2, over 1 process(es) ...",
        "racksim-fidelity: effects: 2 variant / baseline comparisons, simulated in 5-s windows "
        "over 1 process(es) ..."]


@pytest.mark.parametrize(("args", "expect"), [
    (["--window-s", "-1"], "argument --window-s: -1 must be above 0"),
    (["--window-s", "nan"], "argument --window-s: nan must be above 0"),
    (["--effects-window-s", "0"], "argument --effects-window-s: 0 must be above 0"),
    (["--jobs", "0"], "argument --jobs: 0 must be above 0"),
    (["--headline-seeds", "-1"], "argument --headline-seeds: -1 must be at least 0"),
])
def test_bad_numbers_are_usage_errors(args: list[str], expect: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ex:
        fidelity.main([*args, "--out", str(tmp_path / "o")])
    assert ex.value.code == 2 and expect in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("args", "expect"), [
    (["--override", "deployment.decode.gpus=5"], "deployment.decode.gpus=5: 384 routed"),
    (["--override", "deployment.no_such_key=1"],
     "scenario: deployment.no_such_key: no such scenario key; check its spelling"),
    (["--override", "workload=nope"],
     "scenario: workload=nope: no such option in scenarios/workload/; choose one of agentx"),
    # another model (with its own profile): the report compares published V4 figures
    (["--override", "model=qwen3_235b_a22b", "--override",
      "perf.profile=calibration/gb300_nvl72__qwen3_235b_a22b.yaml", "--override",
      "perf.weight_dtype=fp8", "--override", "workload=synthetic", "--override",
      "workload.synthetic.max_context_tokens=40960", "--override",
      "deployment.decode.speculative.num_draft_tokens=0", "--override",
      "deployment.decode.speculative.accepted_tokens_per_step=1"],
     "model: the published figures are DeepSeek-V4.1-Flash's, so the report needs that model, "
     "not qwen3_235b_a22b"),
])
def test_bad_input_one_line_and_exit_2(args: list[str], expect: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert fidelity.main([*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("racksim-fidelity: ") and expect in err and "\n" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("profile", "expect"), [
    ("not_a_profile", "no 'name' field, so this is not a calibration profile"),
    ("calibration/h200_hgx__qwen3_235b_a22b.yaml",
     "profile 'h200_hgx__qwen3_235b_a22b' was fitted for model qwen3_235b_a22b"),
])
def test_a_profile_that_cannot_price_the_scenario_is_the_profile_class(
        profile: str, expect: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both ended in a traceback (exit 1): a file that is not a profile, and another model's
    profile, which the scenario only met once the run priced its first step."""
    if profile == "not_a_profile":
        profile = str(tmp_path / "p.yaml")
        Path(profile).write_text("format: x\n")
    argv = ["--override", f"perf.profile={profile}", "--no-loo", "--no-effects"]
    assert fidelity.main([*argv, "--out", str(tmp_path / "o")]) == ProfileInputError.exit_code
    err = capsys.readouterr().err.strip()
    assert err.startswith("racksim-fidelity: perf.profile ") and expect in err
    assert "\n" not in err and not (tmp_path / "o").exists()


def test_out_under_a_file_or_unwritable(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert fidelity.main(["--out", str(blocker / "sub")]) == FidelityError.exit_code
    assert "--out" in capsys.readouterr().err
    assert fidelity.main(["--out", str(blocker)]) == FidelityError.exit_code
    assert "not a directory" in capsys.readouterr().err
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        assert fidelity.main(["--out", str(locked / "r")]) == FidelityError.exit_code
        assert "is not writable" in capsys.readouterr().err


def test_no_headline_seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """--headline-seeds 0 simulates the headline once: no range over seeds."""
    monkeypatch.setattr(fidelity, "HEADLINE_FIT", tmp_path / "absent.yaml")
    out = tmp_path / "o"
    assert fidelity.main([*FAST, "--no-effects", "--headline-seeds", "0", "--out",
                          str(out)]) == 0
    summ = json.loads((out / "fidelity.json").read_text())
    assert summ["headline_seeds"] == [0] and summ["error_over_seeds"] == {}
    assert "headline_seeds_s" not in summ["timings_s"]
    assert pd.read_csv(out / "fidelity.csv")["seed_error_min"].isna().all()
    assert "seeds" not in capsys.readouterr().err


def test_bad_headline_fit_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "headline_fit.yaml"
    bad.write_text("loo: {H1: {note: no value}}\n")
    monkeypatch.setattr(fidelity, "HEADLINE_FIT", bad)
    assert fidelity.main([*FAST, "--out", str(tmp_path / "o")]) == FidelityError.exit_code
    assert "headline_fit.yaml" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_ctrl_c_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(cfg):  # noqa: ANN001, ANN202 - stands in for fx.measure
        raise KeyboardInterrupt

    monkeypatch.setattr(fidelity, "default_effects", _two_effects)
    monkeypatch.setattr(fx, "measure", interrupted)
    out = tmp_path / "o"
    assert fidelity.main([*FAST, "--out", str(out)]) == fidelity.EXIT_INTERRUPTED
    assert "interrupted; nothing written" in capsys.readouterr().err
    assert not out.exists()


def test_ctrl_c_at_the_other_seeds_writes_nothing(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    real = fidelity.complete_summary

    def interrupted(cfg, progress=False):  # noqa: ANN001, ANN202 - the other seeds stop
        if cfg.seed > 0:
            raise KeyboardInterrupt
        return real(cfg, progress)

    monkeypatch.setattr(fidelity, "HEADLINE_FIT", tmp_path / "absent.yaml")
    monkeypatch.setattr(fidelity, "complete_summary", interrupted)
    out = tmp_path / "o"
    assert fidelity.main([*FAST, "--no-effects", "--out", str(out)]) == fidelity.EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "headline scenario at seeds 1, 2" in err  # the seeds' stage had started
    assert "interrupted; nothing written" in err
    assert not out.exists()


def test_console_script_is_installed(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("racksim-fidelity")
    proc = subprocess.run([str(exe), "--window-s", "0", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        "racksim-fidelity: error: argument --window-s: 0 must be above 0")


def test_a_converged_headline_fit_puts_its_scenario_under_the_headline_rows() -> None:
    """H1-H3 fitted: they are predicted by the fitted scenario as its fit evaluated it (the
    record's window, warm-up, drain and seed), --override last; a record without a drain was
    fitted without one; a record without its settings is refused with the file and the fix."""
    fit = {"settings": {"window_s": 15.0, "warmup_requests_per_lane": 3, "drain_s": 60.0,
                        "seed": 0}}
    cfg = fidelity.fitted_headline_scenario(fit, ["deployment.decode.gpus=16"])
    replay = cfg.workload.replay
    assert (cfg.workload.name, replay.window_s, replay.warmup_requests_per_lane,
            replay.drain_s, cfg.seed) == ("agentx_fitted", 15.0, 3, 60.0, 0)
    assert cfg.deployment.decode.gpus == 16 and not cfg.progress
    del fit["settings"]["drain_s"]
    assert fidelity.fitted_headline_scenario(fit, []).workload.replay.drain_s == 0.0
    with pytest.raises(fidelity.FidelityError, match=r"headline_fit.yaml: no settings.'seed' "
                                                     r".*run racksim-calibrate workload again"):
        fidelity.fitted_headline_scenario({"settings": {"window_s": 15.0,
                                                        "warmup_requests_per_lane": 1}}, [])
