"""A real Hydra multirun through the joblib launcher: one table row per scenario, failures
recorded with their error, resume re-simulates nothing, `racksim-plot table` rebuilds it."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time

import pandas as pd
import pytest
from sweep_support import AXES, CMD, run_sweep

from rackSim.config import compose_scenario
from rackSim.metrics.summary import SUMMARY_KEYS
from rackSim.report.command import main as plot_main
from rackSim.report.sweep_table import build_table, format_sweep, parse_overrides
from rackSim.run import JOB_RECORD


def _stamps(sweep_dir):
    """summary.json mtime (ns) of every finished job, by job directory."""
    return {p.parent.name: p.stat().st_mtime_ns for p in sweep_dir.glob("*/summary.json")}


def test_one_row_per_scenario_with_overrides_then_metrics(joblib_sweep):
    sweep_dir, proc = joblib_sweep
    assert "Joblib.Parallel(" in proc.stdout + proc.stderr  # really the joblib launcher
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    assert len(table) == 6
    assert list(table.columns[:5]) == ["experiment", "workload.replay.window_s", "progress",
                                       "deployment.decode.gpus", "workload.replay.concurrency"]
    assert set(SUMMARY_KEYS) <= set(table.columns)
    assert {(g, c) for g, c in zip(table["deployment.decode.gpus"],
                                   table["workload.replay.concurrency"], strict=True)} == \
        {(g, c) for g in (4, 8, 5) for c in (32, 64)}
    assert table["deployment.decode.gpus"].dtype.kind == "i"
    csv = pd.read_csv(sweep_dir / "sweep.csv")
    assert len(csv) == 6 and list(csv.columns) == list(table.columns)


def test_rows_carry_each_jobs_summary(joblib_sweep):
    sweep_dir, _ = joblib_sweep
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    ok = table[table["status"] == "ok"]
    assert len(ok) == 4
    for _, row in ok.iterrows():
        s = json.loads((sweep_dir / row["job_dir"] / "summary.json").read_text())
        assert s["concurrency"] == row["workload.replay.concurrency"]
        assert s["decode_gpus"] == row["deployment.decode.gpus"]
        assert row["layout"] == f"P2xDEP2+DEP{row['deployment.decode.gpus']}"
        for k in ("throughput_tok_s_gpu", "interactivity_tok_s", "margin_usd_gpu_h"):
            assert row[k] == pytest.approx(s[k], rel=1e-12)
        # the decode breakdown means add up to the mean step time
        parts = [c for c in table.columns if c.startswith("decode_") and c.endswith("_ms")
                 and c != "decode_step_ms"]
        assert len(parts) == 10
        assert row[parts].sum() == pytest.approx(row["decode_step_ms"], rel=1e-9)
    # more clients on the same layout: more tokens/s/GPU, less interactivity
    for g in (4, 8):
        lo, hi = (ok[(ok["deployment.decode.gpus"] == g)
                     & (ok["workload.replay.concurrency"] == c)].iloc[0] for c in (32, 64))
        assert hi["throughput_tok_s_gpu"] > lo["throughput_tok_s_gpu"]
        assert hi["interactivity_tok_s"] < lo["interactivity_tok_s"]


def test_failed_scenarios_are_listed_with_their_error(joblib_sweep):
    sweep_dir, _ = joblib_sweep
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    bad = table[table["status"] == "failed"]
    assert sorted(bad["deployment.decode.gpus"]) == [5, 5]
    for _, row in bad.iterrows():
        assert "ConfigError" in row["error"] and "divides 384" in row["error"]
        assert pd.isna(row["throughput_tok_s_gpu"])
        err = json.loads((sweep_dir / row["job_dir"] / "error.json").read_text())
        assert err["error_type"] == "ConfigError" and "deployment.decode.gpus=5" in err["error"]
        assert not (sweep_dir / row["job_dir"] / "summary.json").exists()


def test_a_sweep_with_nothing_finished_exits_1_after_its_table(tmp_path):
    """Every scenario refused by validation: the table is written (it lists why) and the
    command exits 1; the shared sweep above, with 2 of 6 failed, exits 0."""
    p = run_sweep(tmp_path / "s", "deployment.decode.gpus=5,7", exit_code=1)
    assert "2 scenarios, 2 failed" in p.stdout
    assert "racksim: no scenario of the sweep finished" in p.stderr
    assert len(pd.read_csv(tmp_path / "s" / "sweep.csv")) == 2


def test_the_sweep_prints_its_table(joblib_sweep):
    """The multirun ends with the table in the terminal: the swept keys (not the fixed
    ones), status, layout and the headline metrics of each scenario."""
    sweep_dir, proc = joblib_sweep
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines)
                if line.split()[:2] == ["deployment.decode.gpus", "workload.replay.concurrency"])
    assert "experiment" not in lines[head] and "tok/s/GPU" in lines[head]
    shown = lines[head + 1:head + 1 + len(table)]
    for line, (_, row) in zip(shown, table.iterrows(), strict=True):
        cells = line.split()
        assert cells[:3] == [str(row["deployment.decode.gpus"]),
                             str(row["workload.replay.concurrency"]), row["status"]]
        if row["status"] == "ok":
            assert f"{row['throughput_tok_s_gpu']:,.0f}" in cells
            assert f"{row['margin_usd_gpu_h']:.2f}" in cells


def test_a_long_sweep_prints_its_first_rows(joblib_sweep):
    table = pd.read_parquet(joblib_sweep[0] / "sweep.parquet")
    text = format_sweep(table, limit=2).splitlines()
    assert len(text) == 4 and text[-1] == "... 4 more scenarios in the table"


def test_resume_skips_finished_scenarios_and_retries_failed(joblib_sweep, tmp_path):
    src, _ = joblib_sweep
    sweep_dir = tmp_path / "resumed"
    shutil.copytree(src, sweep_dir)
    before = _stamps(sweep_dir)
    failed_at = {p.parent.name: json.loads(p.read_text())["finished_at"]
                 for p in sweep_dir.glob("*/error.json")
                 for p in [p.parent / "job.json"]}
    proc = run_sweep(sweep_dir, *AXES)  # the basic launcher this time
    assert proc.stderr.count("skipped (already done)") == 4
    assert _stamps(sweep_dir) == before  # nothing finished was simulated again
    for name, t in failed_at.items():  # failed ones were tried again (and failed again)
        assert json.loads((sweep_dir / name / "job.json").read_text())["finished_at"] > t
    assert len(pd.read_parquet(sweep_dir / "sweep.parquet")) == 6


def test_changed_sweep_in_same_dir_keeps_earlier_results(joblib_sweep, tmp_path):
    src, _ = joblib_sweep
    sweep_dir = tmp_path / "changed"
    shutil.copytree(src, sweep_dir)
    before = _stamps(sweep_dir)
    # job 0 is (4, 32): done; job 1 is (16, 32) but directory 1 holds (4, 64)
    run_sweep(sweep_dir, "deployment.decode.gpus=4,16", "workload.replay.concurrency=32")
    after = _stamps(sweep_dir)
    assert {k: after[k] for k in before} == before
    (new,) = set(after) - set(before)
    assert new.startswith("1-")
    table = build_table(sweep_dir)
    assert len(table) == 7
    row = table[table["job_dir"] == new].iloc[0]
    assert (row["deployment.decode.gpus"], row["status"]) == (16, "ok")


def test_table_command_rebuilds_the_same_table(joblib_sweep, tmp_path, capsys):
    src, _ = joblib_sweep
    sweep_dir = tmp_path / "again"
    shutil.copytree(src, sweep_dir)
    (sweep_dir / "sweep.parquet").unlink()
    (sweep_dir / "sweep.csv").unlink()
    assert plot_main(["table", str(sweep_dir)]) == 0
    assert "sweep.parquet" in capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_parquet(sweep_dir / "sweep.parquet"),
                                  pd.read_parquet(src / "sweep.parquet"))


def test_table_command_on_a_dir_without_jobs_fails_clearly(tmp_path, capsys):
    assert plot_main(["table", str(tmp_path)]) == 2
    assert "no sweep jobs" in capsys.readouterr().err


def test_parse_overrides():
    assert parse_overrides(["+a.b=1", "c=0.5", "d=true", "e=push", "f=null", "g=1e3"]) == \
        {"a.b": 1, "c": 0.5, "d": True, "e": "push", "f": None, "g": 1000.0}


def _job(sweep_dir, name, overrides, status="ok", finished_at=1.0, summary=None):
    d = sweep_dir / name
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"overrides": overrides, "status": status,
                                            "finished_at": finished_at, "layout": "L"}))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))


def test_table_from_hand_written_jobs(tmp_path):
    """Group overrides that clash with summary keys, re-runs, mixed value types, bad files."""
    _job(tmp_path, "0", ["deployment=a", "x=1"], summary={"deployment": "A", "m": 1.0})
    _job(tmp_path, "1", ["deployment=b", "x=push"], summary={"deployment": "B", "m": 2.0})
    _job(tmp_path, "2", ["deployment=a", "x=1"], finished_at=5.0,  # an older failed re-run
         status="failed")
    _job(tmp_path, "3", ["deployment=c", "x=2"], summary=None)  # ok but summary missing
    (tmp_path / "4").mkdir()
    (tmp_path / "4" / "job.json").write_text("{not json")
    table = build_table(tmp_path)
    assert list(table.columns[:2]) == ["deployment", "x"]
    assert "result.deployment" in table.columns and "m" in table.columns
    assert len(table) == 3  # the (a, 1) scenario once: its finished row wins over the failure
    a = table[table["deployment"] == "a"].iloc[0]
    assert (a["status"], a["job_dir"], a["result.deployment"], a["m"]) == ("ok", "0", "A", 1.0)
    c = table[table["deployment"] == "c"].iloc[0]
    assert c["status"] == "failed" and "summary.json" in c["error"]
    assert table["x"].tolist() == ["1", "push", "2"]  # mixed int / str: kept as text
    table.to_parquet(tmp_path / "t.parquet")  # and it fits Parquet


def test_ctrl_c_stops_the_sweep_and_writes_the_table_of_what_ran(tmp_path):
    """Ctrl-C while the first of three scenarios simulates: that scenario is kept as
    interrupted, the other two never start, the table is written and the sweep exits 130
    saying how to go on (before, only the scenario under way stopped and the sweep ran on)."""
    sweep_dir = tmp_path / "s"
    p = subprocess.Popen([*CMD, "-m", f"hydra.sweep.dir={sweep_dir}", "experiment=smoke",
                          "progress=false", "workload.replay.window_s=100000", "seed=1,2,3"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (sweep_dir / "0" / JOB_RECORD).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)  # inside the simulation or its set-up: both are an interrupted scenario
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-3000:]
    assert f"racksim: sweep interrupted; to go on, run the same command with " \
           f"hydra.sweep.dir={sweep_dir}: finished scenarios are skipped" in err
    assert "Traceback" not in err
    table = pd.read_csv(sweep_dir / "sweep.csv")
    assert table["seed"].tolist() == [1] and table["status"].tolist() == ["failed"]
    assert table["error"][0].startswith("interrupted")
    assert not (sweep_dir / "1").exists() and not (sweep_dir / "2").exists()


def test_a_sweep_job_records_ctrl_c_and_passes_it_on(tmp_path, monkeypatch):
    """Ctrl-C outside the simulation loop (here: in place of the simulation) is recorded in
    job.json as an interrupted, failed scenario (a resumed sweep runs it again) and raised."""
    import rackSim.run as run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "simulate_to", interrupted)
    tree = compose_scenario(["experiment=smoke"]).model_dump(mode="json")
    with pytest.raises(KeyboardInterrupt):
        run.run_sweep_job(tree, tmp_path / "0", tmp_path, ["seed=1"])
    rec = run.read_job(tmp_path / "0")
    assert rec["status"] == "failed"
    assert rec["error"] == "interrupted before its results were complete"


def test_a_single_runs_directory_is_named_as_such(tmp_path, capsys):
    """racksim-plot on a `racksim` run's directory: said to be a single run, whose figures
    racksim draws itself (it pointed to `racksim-plot table`, which then found no jobs)."""
    (tmp_path / "summary.json").write_text("{}")
    for command in ("plots", "table"):
        assert plot_main([command, str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path}; it is a single run's directory, whose figures `racksim` draws " \
               "itself" in err and "racksim-plot table" not in err
