"""Every output flag of every command: a path that cannot be written is refused before the
command runs (argparse's one usage line naming the flag, exit 2, nothing made), and a path
whose directories are missing is written, the directories made."""

from __future__ import annotations

import pandas as pd
import pytest

from rackSim.calibrate.command import main as calibrate
from rackSim.calibrate.scenario import DEFAULT_PROFILE
from rackSim.perf.profile import Profile
from rackSim.report.command import main as plot
from rackSim.validate.command import main as validate
from rackSim.workload.command import main as workload
from rackSim.workload.jsonl import load_jsonl

# (command, its arguments before the flag, the flag); the flag's value is put under a file
FLAGS = [
    (calibrate, [], "--out"),
    (calibrate, ["headline"], "--csv"),
    (calibrate, ["workload"], "--cache"),
    (calibrate, ["prefill"], "--out"),
    (calibrate, ["model", "Qwen/Qwen3-235B-A22B"], "--out-dir"),
    (calibrate, ["profile", "--model", "qwen3_235b_a22b", "--hardware", "h200_hgx"], "--out"),
    (calibrate, ["peer"], "--out"),
    (validate, ["serve"], "--work-dir"),
    (validate, ["run", "--endpoint", "http://127.0.0.1:9"], "--out"),
    (validate, ["ingest", "--bench", "b.json"], "--out"),
    (validate, ["fit", "--run", "r"], "--out"),
    (validate, ["compare", "--run", "r", "--profile", "p.yaml"], "--out"),
    (validate, ["grid"], "--out"),
    (validate, ["machine"], "--out"),
    (workload, ["--agentx"], "--out"),
    (workload, ["--agentx"], "--save-jsonl"),
    (workload, ["import", "logs"], "--out"),
    (workload, ["fit", "pool.jsonl"], "--out"),
    (workload, ["fit", "pool.jsonl"], "--yaml"),
    (plot, ["plots", "sweep"], "--out"),
]


@pytest.mark.parametrize("command, args, flag", FLAGS,
                         ids=[f"{c.__module__.split('.')[1]}-{' '.join(a[:1])}-{f}"
                              for c, a, f in FLAGS])
def test_unwritable_output_refused_before_running(tmp_path, capsys, command, args, flag):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as ended:
        command([*args, flag, str(blocker / "sub" / "out.x")])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {flag}: {blocker} is a file, so {blocker / 'sub' / 'out.x'} " \
           "cannot be made; give another path" in err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == [blocker]


def test_outputs_written_into_missing_directories(tmp_path, capsys):
    pool, report = tmp_path / "a" / "b" / "w.jsonl", tmp_path / "c" / "d"
    assert workload(["--agentx", "--sessions", "3", "--no-plot", "--save-jsonl", str(pool),
                     "--out", str(report)]) == 0
    assert len(load_jsonl(pool)) == 3
    assert pd.read_csv(report / "requests.csv").shape[0] > 0
    table = tmp_path / "e" / "layouts.csv"
    assert calibrate(["headline", "--csv", str(table)]) == 0
    assert pd.read_csv(table).shape[0] > 0
    saved = tmp_path / "f" / "g" / "profile.yaml"
    Profile.load(DEFAULT_PROFILE).save(saved)
    assert Profile.load(saved).params == Profile.load(DEFAULT_PROFILE).params
