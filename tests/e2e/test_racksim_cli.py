"""`racksim` end to end on the small scenario: files, plots, numbers, Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from rackSim.config import compose_scenario, with_changes
from rackSim.metrics.records import REQUEST_COLUMNS, STEP_COLUMNS
from rackSim.run import simulate, simulate_to

CMD = [sys.executable, "-c", "from rackSim.cli import run; run()"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    p = subprocess.run([*CMD, f"hydra.run.dir={out}", "experiment=smoke", "progress=false"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return out, p.stdout


def test_writes_every_artefact(smoke_run):
    out, stdout = smoke_run
    for name in ("summary.json", "requests.parquet", "steps.parquet", "scenario.json",
                 "throughput_timeseries.csv", "itl_histogram.csv", "throughput.png",
                 "latency.png", "decode_breakdown.png"):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "PARTIAL").exists()
    assert "throughput" in stdout and "interactivity" in stdout
    assert "  layout                       P2xDEP2+DEP4, 8 GPUs\n" in stdout


def test_tables_load_with_pandas_and_follow_the_schema(smoke_run):
    out, _ = smoke_run
    req = pd.read_parquet(out / "requests.parquet")
    steps = pd.read_parquet(out / "steps.parquet")
    assert set(REQUEST_COLUMNS) <= set(req.columns)
    assert list(steps.columns) == list(STEP_COLUMNS)
    assert {"decode", "prefill-0", "prefill-1"} == set(steps["instance"])
    comps = [c for c in STEP_COLUMNS if c.endswith("_ms") and c != "duration_ms"]
    assert (steps[comps].sum(axis=1) - steps["duration_ms"]).abs().max() < 1e-6


def test_summary_is_consistent(smoke_run):
    out, _ = smoke_run
    s = json.loads((out / "summary.json").read_text())
    parts = s["cached_input_tok_s_gpu"] + s["uncached_input_tok_s_gpu"] + s["output_tok_s_gpu"]
    assert s["throughput_tok_s_gpu"] == pytest.approx(parts)
    assert s["interactivity_tok_s"] == pytest.approx(1e3 / s["itl_p90_ms"])
    assert s["ttft_p50_ms"] <= s["ttft_p90_ms"] <= s["ttft_p99_ms"]
    assert s["requests_finished"] > 100 and s["partial"] is False
    assert s["num_gpus"] == 8 and s["window_s"] == pytest.approx(60)
    assert 0.5 < s["cache_hit_rate"] < 1.0  # agentic turns re-send their context


def test_speculation_shows_in_interactivity(smoke_cfg):
    """1 vs 3.25 tokens per step: interactivity scales by 3.25 x the step-time ratio (the
    published headline's arithmetic), up to the spread of step times across the window."""
    base = simulate(smoke_cfg, progress=False)
    no_spec = compose_scenario(["experiment=smoke", "progress=false",
                                "deployment.decode.speculative.accepted_tokens_per_step=1"])
    one = simulate(no_spec, progress=False)

    def p90_step_ms(r):
        """P90 of decode step duration over emitted tokens (ITL = step / tokens per step)."""
        d = r.steps[(r.steps["instance"] == "decode")].sort_values("duration_ms")
        w = d["decode_tokens"].cumsum() / d["decode_tokens"].sum()
        return float(d["duration_ms"][w >= 0.9].iloc[0])

    ratio = base.summary["interactivity_tok_s"] / one.summary["interactivity_tok_s"]
    expected = 3.25 * p90_step_ms(one) / p90_step_ms(base)
    assert ratio == pytest.approx(expected, rel=0.1)
    assert ratio > 2.5


def test_measured_profile_prices_the_steps(smoke_cfg):
    """A profile fitted from a real server (racksim-validate fit) drives the engine: its steps
    cost what that profile says, not what the GB300 model says."""
    measured = compose_scenario(["experiment=smoke", "progress=false", "perf.model=measured",
                                 "perf.profile=calibration/cpu-tiny-moe__vllm-cpu.yaml",
                                 "workload.replay.window_s=10"])
    from rackSim.perf import build_step_model
    from rackSim.perf.measured import MeasuredStepModel

    assert isinstance(build_step_model(measured, "decode"), MeasuredStepModel)
    r = simulate(measured, progress=False)
    gb300 = simulate(with_changes(smoke_cfg, workload={"replay": {"window_s": 10}}),
                     progress=False)
    assert r.summary["requests_finished"] > 0
    assert r.summary["itl_p50_ms"] > 2 * gb300.summary["itl_p50_ms"]  # a CPU is slower


def test_ctrl_c_writes_partial_results(tmp_path):
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err_file:
        p = subprocess.Popen([*CMD, f"hydra.run.dir={tmp_path / 'run'}", "experiment=smoke",
                              "workload.replay.window_s=100000"],
                             stdout=subprocess.DEVNULL, stderr=err_file, text=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and p.poll() is None:
            if "window:" in err_path.read_text():  # the window's progress bar is up
                break
            time.sleep(0.2)
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            pytest.fail("racksim did not exit within 120 s of Ctrl-C; its stderr:\n"
                        + err_path.read_text()[-3000:])
    err = err_path.read_text()
    assert p.returncode == 130, err
    assert "PARTIAL" in err
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["partial"] is True
    assert (tmp_path / "run" / "PARTIAL").exists()


def test_plots_false_writes_the_tables_and_no_figure(tmp_path):
    p = subprocess.run([*CMD, f"hydra.run.dir={tmp_path}", "experiment=smoke", "progress=false",
                        "plots=false", "workload.replay.window_s=10"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "steps.parquet").is_file()
    assert not list(tmp_path.glob("*.png"))


def test_a_run_into_a_used_directory_leaves_nothing_of_the_last_run(tmp_path, smoke_cfg):
    """The same hydra.run.dir twice: the second run (plots=false, another seed) leaves no
    figure, table or PARTIAL marker of the first beside its own; other files stay."""
    cfg = with_changes(smoke_cfg, workload={"replay": {"window_s": 10}})
    simulate_to(cfg, tmp_path, plots=True)
    (tmp_path / "PARTIAL").write_text("an earlier interrupted run\n")
    (tmp_path / "notes.txt").write_text("mine\n")
    second = simulate_to(with_changes(cfg, seed=1), tmp_path, plots=False)
    assert not list(tmp_path.glob("*.png")) and not (tmp_path / "PARTIAL").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["requests_finished"] == second.summary["requests_finished"]
    assert json.loads((tmp_path / "scenario.json").read_text())["seed"] == 1


def _interrupted_run(tmp_path, patch: str) -> subprocess.CompletedProcess:
    """`racksim` with Ctrl-C raised by the patched function `patch` of rackSim.run (a
    KeyboardInterrupt where a real Ctrl-C would land outside the simulation loop)."""
    code = ("import rackSim.run as r\n"
            "def interrupted(*a, **k): raise KeyboardInterrupt\n"
            f"r.{patch} = interrupted\n"
            "from rackSim.cli import run; run()")
    return subprocess.run([sys.executable, "-c", code, f"hydra.run.dir={tmp_path / 'run'}",
                           "experiment=smoke", "progress=false"],
                          capture_output=True, text=True, timeout=300)


def test_ctrl_c_before_the_simulation_is_one_line_and_130(tmp_path):
    p = _interrupted_run(tmp_path, "simulate_to")
    assert p.returncode == 130, p.stderr
    assert p.stderr.strip() == ("racksim: interrupted before a result was complete; nothing "
                                "written is a result (a directory holding part of one is "
                                "marked PARTIAL)")
    assert not (tmp_path / "run" / "summary.json").exists()


def test_ctrl_c_while_writing_marks_the_directory_partial(tmp_path):
    p = _interrupted_run(tmp_path, "write_result")
    assert p.returncode == 130 and "Traceback" not in p.stderr, p.stderr
    marker = (tmp_path / "run" / "PARTIAL").read_text()
    assert "interrupted while its results were being written" in marker


@pytest.mark.parametrize("entry, module, command", [
    ("calibrate", "rackSim.calibrate.command", "racksim-calibrate"),
    ("validate", "rackSim.validate.command", "racksim-validate"),
    ("workload", "rackSim.workload.command", "racksim-workload"),
    ("plot", "rackSim.report.command", "racksim-plot"),
    ("fidelity", "rackSim.calibrate.fidelity", "racksim-fidelity"),
])
def test_ctrl_c_in_the_other_commands_is_one_line_and_130(entry, module, command, monkeypatch,
                                                          capsys):
    """A Ctrl-C the command does not handle itself (long ones keep what they did and say
    so): one line, exit 130, no traceback."""
    import importlib

    from rackSim import cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(module), "main", interrupted)
    with pytest.raises(SystemExit) as ended:
        getattr(cli, entry)()
    assert ended.value.code == 130
    assert capsys.readouterr().err == f"{command}: interrupted\n"


def test_help_names_the_command_and_its_groups():
    p = subprocess.run([*CMD, "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("racksim simulates LLM serving on GPU racks")
    assert "hardware: b200_hgx, b300_hgx, gb200_nvl72, gb300_nvl72, h200_hgx" in p.stdout
