"""Every input class ends in one plain message naming the file, line or field and the fix,
with its class's exit code (rackSim.config.errors)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rackSim.calibrate.scenario import DEFAULT_PROFILE
from rackSim.config import compose_scenario
from rackSim.config.errors import (
    InputError,
    PoolInputError,
    ProfileInputError,
    ScenarioError,
    TraceInputError,
    WorkloadFileError,
)
from rackSim.config.loading import load_workload_file
from rackSim.config.scenarios import check_overrides
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.measured import Profile as MeasuredProfile
from rackSim.perf.profile import Profile

CMD = [sys.executable, "-c", "from rackSim.cli import run; run()"]


def test_exit_codes_are_distinct_per_class():
    import rackSim.config.errors as errors

    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, InputError) and c is not InputError]
    codes = [c.exit_code for c in classes]
    assert len(set(codes)) == len(codes) == 7 and 0 not in codes


@pytest.mark.parametrize("override,match", [
    ("workload=nonexistent", r"workload=nonexistent: no such option in scenarios/workload/; "
                             r"choose one of .*agentx"),
    ("foo.bar=1", r"foo.bar: no such scenario key; check its spelling"),
    ("deployment.decode.gpuz=3", r"deployment.decode.gpuz: no such scenario key"),
    # a field of the scenario that its YAML leaves at the default: Hydra wants a '+'
    ("model.gemm_dtype=fp4", r"model.gemm_dtype: not in the composed YAML, which leaves it at "
                             r"its default \('fp8'\); set it with a leading '\+': "
                             r"\+model.gemm_dtype=fp4$"),
    ("workload.agentx.turns.median=3",
     r"workload.agentx.turns.median: its section workload.agentx.turns is not in the composed "
     r"YAML, which leaves it at its default \(\{kind: lognormal, median: 25.0, sigma: 0.7, "
     r"min: 1.0, max: 300.0\}\); give the whole section with a leading '\+': "
     r"'\+workload.agentx.turns=\{kind: lognormal, .*\}' with your values$")])
def test_unknown_keys_and_options_are_named(override, match):
    with pytest.raises(ScenarioError, match=match):
        check_overrides(["experiment=smoke", override])


def test_good_overrides_and_hydra_flags_pass():
    check_overrides(["experiment=smoke", "deployment.decode.gpus=16", "hydra.run.dir=/tmp/x"])
    check_overrides(["-m", "nonsense.key=1,2"])  # sweeps: each job validates its scenario


@pytest.mark.parametrize("args", [["hydra.run.dir={d}"], ["-m", "seed=1,2", "hydra.sweep.dir={d}"]])
def test_run_and_sweep_directories_that_cannot_be_made(tmp_path, args):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    args = [a.format(d=blocker / "run") for a in args]
    key = args[-1].partition("=")[0]
    with pytest.raises(ScenarioError, match=f"^{key}={blocker / 'run'}: {blocker} is a file, so "):
        check_overrides(["experiment=smoke", *args])
    assert list(tmp_path.iterdir()) == [blocker]


def test_profiles_that_are_not_profiles(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: x\nparams: {a: [1, 2\n")
    with pytest.raises(ProfileInputError, match=r"bad.yaml:3: not valid YAML"):
        Profile.load(bad_yaml)
    other = tmp_path / "other.yaml"
    other.write_text("format: something-else\n")
    with pytest.raises(ProfileInputError, match=r"no 'name' field, so this is not a calibration"):
        Profile.load(other)
    with pytest.raises(ProfileInputError, match=r"cannot read it"):
        Profile.load(tmp_path / "absent.yaml")
    with pytest.raises(ProfileInputError, match=r"racksim-validate fit"):
        MeasuredProfile.from_yaml(other)


def test_workload_yaml_errors_name_line_and_field(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("name: w\nsource: synthetic\nreplay: {concurrency: [\n")
    with pytest.raises(WorkloadFileError, match=r"w.yaml:\d+: not valid YAML"):
        load_workload_file(path)
    path.write_text("name: w\nsource: synthetic\nreplay: {concurrency: -1}\n")
    with pytest.raises(WorkloadFileError, match=r"replay.concurrency: Input should be greater"):
        load_workload_file(path)


def _racksim(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, f"hydra.run.dir={tmp_path / 'run'}", "experiment=smoke",
                           "progress=false", *overrides], capture_output=True, text=True,
                          timeout=300)


def test_a_profile_prices_only_the_model_it_was_fitted_for():
    """A profile names the model it was fitted for; pricing another model with it ended in a
    KeyError traceback (a parameter the other model needs is missing) or priced the wrong
    layers with the parameters both happen to have."""
    cfg = compose_scenario(["experiment=smoke"])
    qwen = "calibration/gb300_nvl72__qwen3_235b_a22b.yaml"
    other = Profile.load(qwen)
    with pytest.raises(ProfileInputError, match=(
            r"^perf.profile calibration/gb300_nvl72__qwen3_235b_a22b.yaml: profile "
            r"'gb300_nvl72__qwen3_235b_a22b' was fitted for model "
            r"qwen3_235b_a22b on GB300-NVL72, not for DeepSeek-V4.1-Flash; give "
            r"DeepSeek-V4.1-Flash's profile \(calibration/<hardware>__<model>.yaml")):
        CalibratedStepModel(cfg, "decode", profile=other)
    with pytest.raises(ProfileInputError, match=r"^perf.profile \S+qwen3_235b_a22b.yaml: "):
        CalibratedStepModel(compose_scenario(["experiment=smoke", f"perf.profile={qwen}"]))
    anonymous = Profile.load(qwen)
    del anonymous.meta["model"]  # a profile that names no model is taken at its word
    anonymous.require_model("DeepSeek-V4.1-Flash")
    Profile.load(DEFAULT_PROFILE).require_model(cfg.model.name)


@pytest.mark.parametrize("case", ["key", "profile", "other model's profile", "pool", "trace",
                                  "silent window"])
def test_racksim_ends_in_one_line_and_the_class_code(case, tmp_path):
    rows = [(0, 500), (1000, 400), (300_000, 500)]  # ms, tokens; nothing from 1 to 300 s
    files = {"profile": ("p.yaml", "format: x\n"),
             "pool": ("pool.jsonl", '{"format": "racksim-workload", "version": 1}\n{"sess\n'),
             "trace": ("t.jsonl", '{"timestamp": 1, "input_length": -3}\n'),
             "silent window": ("t.jsonl", "".join(
                 f'{{"timestamp": {t}, "input_length": {n}, "output_length": 20, '
                 f'"hash_ids": [{t}]}}\n' for t, n in rows))}
    overrides, code = {
        "key": (["deployment.decode.gpuz=3"], ScenarioError.exit_code),
        "profile": ([f"perf.profile={tmp_path / 'p.yaml'}"], ProfileInputError.exit_code),
        "other model's profile": (["perf.profile=calibration/h200_hgx__qwen3_235b_a22b.yaml"],
                                  ProfileInputError.exit_code),
        "pool": (["workload=imported_logs", f"workload.path={tmp_path / 'pool.jsonl'}"],
                 PoolInputError.exit_code),
        "trace": (["workload=mooncake_conversation", f"workload.path={tmp_path / 't.jsonl'}"],
                  TraceInputError.exit_code),
        # a trace that sends nothing in the measurement window: refused, not reported as zeros
        "silent window": (["workload=mooncake_conversation",
                           f"workload.path={tmp_path / 't.jsonl'}", "workload.replay.warmup_s=10",
                           "workload.replay.window_s=60", "+workload.open_loop.jitter_s=0"],
                          ScenarioError.exit_code)}[case]
    if case in files:
        name, text = files[case]
        (tmp_path / name).write_text(text)
    p = _racksim(tmp_path, *overrides)
    assert p.returncode == code, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines[0].startswith("racksim: ") and "Traceback" not in p.stderr
    assert "HYDRA_FULL_ERROR" not in p.stderr
    assert not (tmp_path / "run" / "summary.json").exists()
    if case == "silent window":
        assert lines[0] == (
            "racksim: workload.replay.window_s=60: no request of the trace arrives in the "
            "measurement window (10-70 s of the replay, after the 10-s warm-up; the last "
            "arrival before it is at 1.0 s, the next after it at 300.0 s); widen the window, "
            "or move it with workload.open_loop.offset_s (trace seconds skipped) or "
            "workload.open_loop.speedup")


def test_racksim_workload_describe_uses_the_class_codes(tmp_path, capsys):
    from rackSim.workload.command import main

    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"format": "racksim-workload", "version": 1}\n')
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 1, "input_length": -1}\n')
    assert main(["--jsonl", str(pool)]) == PoolInputError.exit_code
    assert main(["--mooncake", str(trace)]) == TraceInputError.exit_code
    err = capsys.readouterr().err
    assert "pool.jsonl:1: field 'block_tokens'" in err and "t.jsonl:1: field 'input_length'" in err


@pytest.mark.parametrize("args, code, says", [
    # a source file that is not there, or a directory: the source's class, flag and file named
    (["--mooncake", "{tmp}/none.jsonl"], 6, "--mooncake {tmp}/none.jsonl: no such file; give"),
    (["--azure", "{tmp}"], 6, "--azure {tmp}: a directory; give the azure file's path"),
    (["--jsonl", "{tmp}"], 5, "--jsonl {tmp}: a directory"),
    # a spec or scenario that is not a mapping, not valid, or not found: the workload YAML class
    (["--agentx", "{tmp}/list.yaml"], 4, "--agentx {tmp}/list.yaml: expected a mapping of "
     "AgentXSpec fields"),
    (["--agentx", "{tmp}/bad_agentx.yaml"], 4, "--agentx {tmp}/bad_agentx.yaml: invalid AgentX "
     "spec:\n  turnz: unknown key"),
    (["--scenario", "{tmp}/list.yaml"], 4, "workload {tmp}/list.yaml: expected a mapping of "
     "WorkloadSpec fields"),
    (["--scenario", "azure_cod"], 4, "--scenario azure_cod: no such file or workload scenario; "
     "give a WorkloadSpec YAML or one of ['agentx', "),
])
def test_racksim_workload_describe_names_the_flag_and_file(tmp_path, capsys, args, code, says):
    from rackSim.workload.command import main

    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "bad_agentx.yaml").write_text("turnz: 5\n")
    assert main([a.format(tmp=tmp_path) for a in args]) == code
    err = capsys.readouterr().err
    assert err.startswith(f"racksim-workload: {says.format(tmp=tmp_path)}")
    assert "Traceback" not in err and "Errno" not in err


@pytest.mark.parametrize("flag, value, says", [
    ("--cache-tokens", "-5", "-5 must be above 0"), ("--sessions", "0", "0 must be above 0"),
    ("--speedup", "0", "0 must be above 0"), ("--concurrency", "-1", "-1 must be above 0"),
    ("--tpot-s", "-0.1", "-0.1 must be at least 0"), ("--ttft-s", "x", "'x' is not a number"),
    ("--sessions", "1.5", "'1.5' is not a whole number"),
    ("--seed", "-1", "-1 must be at least 0"),  # was numpy's traceback
])
def test_racksim_workload_describe_refuses_bad_numbers(capsys, flag, value, says):
    from rackSim.workload.command import main

    with pytest.raises(SystemExit) as stop:
        main(["--agentx", flag, value])
    assert stop.value.code == 2
    assert f"argument {flag}: {says}" in capsys.readouterr().err


def test_racksim_workload_describe_takes_a_scenario_by_name(capsys):
    from rackSim.workload.command import main

    assert main(["--scenario", "synthetic", "--sessions", "3"]) == 0
    out = capsys.readouterr().out
    assert "scenarios/workload/synthetic.yaml (synthetic)" in out
    assert out.splitlines()[1].split() == ["sessions", "3"]
