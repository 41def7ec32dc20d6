"""`racksim-validate fit / compare / ingest` end to end on a run directory, no server: the
records are the colocated model's own (a run directory laid out exactly as `run` writes it)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from validate_support import TRUE_COEFFS, simulated_run_dir

from rackSim.config.errors import ProfileInputError
from rackSim.perf.measured import Profile, ServerShape
from rackSim.validate.command import EXIT_BAD_INPUT, EXIT_ENDPOINT, EXIT_OK, main

COEF = TRUE_COEFFS


@pytest.fixture
def run_dir(tmp_path):
    return simulated_run_dir(tmp_path / "run", concurrency=3, seed=1)


def test_fit_then_compare(run_dir, capsys):
    assert main(["fit", "--run", str(run_dir), "--refine"]) == EXIT_OK
    prof = run_dir / "profile-driver_records.yaml"
    assert Profile.from_yaml(prof).provenance["refined"]["targets"]
    assert main(["compare", "--run", str(run_dir), "--profile", str(prof)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "TTFT P50" in out and "throughput" in out
    df = pd.read_csv(run_dir / "compare" / "comparison.csv")
    assert (run_dir / "compare" / "comparison.png").stat().st_size > 10_000
    err = df.set_index("key")["error_pct"]
    # the records came from the model itself: the refit predicts them closely
    for key in ("ttft_p50_ms", "itl_p50_ms", "throughput_tok_s_gpu"):
        assert abs(err[key]) < 15, (key, err[key])


def test_ingest_and_bad_inputs(run_dir, tmp_path, capsys):
    assert main(["ingest", "--run", str(run_dir), "--out", str(tmp_path / "i")]) == EXIT_OK
    df = pd.read_csv(tmp_path / "i" / "requests.csv")
    assert len(df) > 20 and {"ttft_ms", "cached_tokens", "token_times_s"} <= set(df.columns)
    assert main(["fit", "--run", str(run_dir), "--source", "log"]) == EXIT_BAD_INPUT
    assert "--log" in capsys.readouterr().err
    assert main(["ingest", "--out", str(tmp_path / "j")]) == EXIT_BAD_INPUT
    (tmp_path / "bad.yaml").write_text("format: other\n")
    assert main(["compare", "--run", str(run_dir), "--profile",
                 str(tmp_path / "bad.yaml")]) == ProfileInputError.exit_code == 3
    assert "racksim-validate fit" in capsys.readouterr().err


@pytest.mark.parametrize("flag, given, says", [
    ("--log", "missing.log", "--log {tmp}/missing.log: no such file; give a vLLM server log"),
    ("--bench", "", "--bench {tmp}: a directory; give a `vllm bench serve` JSON"),
    ("--run", "", "--run {tmp}: no records.jsonl in it; give a `racksim-validate run` "
     "directory"),
])
def test_ingest_names_a_missing_input_and_writes_nothing(tmp_path, capsys, flag, given, says):
    out = tmp_path / "out"
    assert main(["ingest", flag, str(tmp_path / given), "--out", str(out)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == f"racksim-validate ingest: {says.format(tmp=tmp_path)}\n"
    assert not out.exists()


def _edit_meta(run_dir, **changes) -> None:
    path = run_dir / "run.json"
    meta = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    path.write_text(json.dumps(meta))


def test_fit_uses_the_recorded_shape_and_refuses_contradictions(run_dir, capsys):
    assert main(["fit", "--run", str(run_dir)]) == EXIT_OK
    prof = Profile.from_yaml(run_dir / "profile-driver_records.yaml")
    assert prof.server == ServerShape()
    assert main(["fit", "--run", str(run_dir), "--max-num-seqs", "8"]) == EXIT_BAD_INPUT
    assert "--max-num-seqs 8: the run recorded 64" in capsys.readouterr().err
    _edit_meta(run_dir, scheduler=None)  # a remote server: no log, limits unknown
    assert main(["fit", "--run", str(run_dir)]) == EXIT_BAD_INPUT
    assert "give --max-num-seqs and --max-num-batched-tokens" in capsys.readouterr().err
    assert main(["fit", "--run", str(run_dir), "--max-num-seqs", "32",
                 "--max-num-batched-tokens", "1024"]) == EXIT_OK
    prof = Profile.from_yaml(run_dir / "profile-driver_records.yaml")
    assert (prof.server.max_num_seqs, prof.server.max_num_batched_tokens) == (32, 1024)


def test_compare_refuses_a_profile_of_another_shape(run_dir, tmp_path, capsys):
    other = Profile(coeffs=dict(COEF), server=ServerShape(max_num_seqs=8))
    other.to_yaml(tmp_path / "other.yaml")
    args = ["compare", "--run", str(run_dir), "--profile", str(tmp_path / "other.yaml")]
    assert main(args) == EXIT_BAD_INPUT
    assert "max_num_seqs: run 64, profile 8" in capsys.readouterr().err
    assert main([*args, "--allow-other-shape", "--out", str(tmp_path / "c")]) == EXIT_OK


def test_runs_that_are_not_whole_are_not_fitted(run_dir, capsys):
    _edit_meta(run_dir, server_changed="http://x: process_start_s: 1.0 -> 2.0")
    assert main(["fit", "--run", str(run_dir)]) == EXIT_BAD_INPUT
    assert "changed mid-run" in capsys.readouterr().err
    _edit_meta(run_dir, server_changed=None)
    (run_dir / "records.jsonl").write_text("")
    assert main(["fit", "--run", str(run_dir)]) == EXIT_BAD_INPUT
    assert "no request records" in capsys.readouterr().err


def test_serve_refuses_a_model_that_is_neither_a_preset_nor_a_config(tmp_path, capsys):
    """A flag error (exit 2), before any server is started or announced."""
    assert main(["serve", "--model", str(tmp_path), "--work-dir", str(tmp_path)]) \
        == EXIT_BAD_INPUT
    got = capsys.readouterr()
    assert got.err == (f"racksim-validate serve: --model '{tmp_path}': neither a preset "
                       "(tiny-moe, tiny-dense) nor a directory with a config.json\n")
    assert "starting" not in got.out


@pytest.mark.parametrize("argv, says", [
    (["run", "--out", "o", "--endpoint", "http://x", "--concurrency", "-1"],
     "argument --concurrency: -1 must be above 0"),
    (["run", "--out", "o", "--endpoint", "http://x", "--max-requests", "0"],
     "argument --max-requests: 0 must be above 0"),
    (["run", "--out", "o", "--endpoint", "http://x", "--window-s", "nan"],
     "argument --window-s: nan must be above 0"),
    (["run", "--out", "o", "--endpoint", "http://x", "--seed", "-1"],
     "argument --seed: -1 must be at least 0"),
    (["serve", "--max-num-seqs", "0"], "argument --max-num-seqs: 0 must be above 0"),
    (["fit", "--run", "r", "--log-start", "-1"], "argument --log-start: -1 must be at least 0"),
    (["grid", "--out", "g", "--concurrency", "4", "x"], "argument --concurrency: 'x' is not a"),
    (["grid", "--out", "g", "--busy-retries", "-1"], "--busy-retries: -1 must be at least 0"),
    (["machine", "--out", "m", "--window-s", "0"], "argument --window-s: 0 must be above 0"),
])
def test_number_flags_out_of_range_are_usage_errors(argv, says, tmp_path, monkeypatch, capsys):
    """Refused by argparse (exit 2) before a server starts or a directory is made; before,
    `run --concurrency -1` printed pydantic's dump of WorkloadSpec."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ex:
        main(argv)
    assert ex.value.code == 2 and says in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_an_unreachable_endpoint_leaves_no_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--endpoint", "http://127.0.0.1:9",
                 "--connect-timeout-s", "2"]) == EXIT_ENDPOINT
    assert "endpoint http://127.0.0.1:9: unreachable" in capsys.readouterr().err
    assert not out.exists()
    out.mkdir()  # a directory that was there before is kept, with the files it had
    (out / "notes.txt").write_text("mine")
    assert main(["run", "--out", str(out), "--endpoint", "http://127.0.0.1:9",
                 "--connect-timeout-s", "2"]) == EXIT_ENDPOINT
    assert (out / "notes.txt").read_text() == "mine"
