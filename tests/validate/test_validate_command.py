"""`racksim-validate fit / compare / ingest` end to end on a run directory, no server: the
records are the colocated model's own (a run directory laid out exactly as `run` writes it)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from rackSim.perf.measured import Profile, ServerShape
from rackSim.validate.colocated import simulate_colocated
from rackSim.validate.command import EXIT_BAD_INPUT, EXIT_OK, main
from rackSim.validate.recording import RecordWriter
from rackSim.validate.workloads import cpu_tiny_workload
from rackSim.workload.sources import load_sessions

COEF = {"const_ms": 2.0, "per_prefill_token_ms": 0.02, "per_prefill_request_ms": 3.0,
        "per_decode_request_ms": 0.4, "per_context_token_ms": 0.0}


@pytest.fixture
def run_dir(tmp_path):
    wl = cpu_tiny_workload(3, window_s=15.0)
    truth = Profile(coeffs=dict(COEF), overhead_ms=1.0, api_overhead_ms=10.0,
                    server=ServerShape())
    sim = simulate_colocated(load_sessions(wl, 1), wl.replay, truth, seed=1)
    d = tmp_path / "run"
    w = RecordWriter(d / "records.jsonl", fsync=False)
    for r in sim.records:
        w.write(r, f"{r.session_key}:{r.rid}:r", "sim")
    w.close()
    (d / "run.json").write_text(json.dumps({"window_start_s": sim.window_start_s,
                                            "window_end_s": sim.window_end_s}))
    (d / "workload.json").write_text(json.dumps({"workload": json.loads(wl.model_dump_json()),
                                                 "seed": 1}))
    return d


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
                 str(tmp_path / "bad.yaml")]) == EXIT_BAD_INPUT
    assert "racksim-validate fit" in capsys.readouterr().err
