"""What a turn's prompt re-sends as earlier outputs: the server's own token ids by default (as an
agent does), the workload's with `prompt_outputs="workload"`; kept for a resumed run, recorded
in run.json and read back by the simulation side (`runs.reuses_outputs`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rackSim.validate.driver import OUTPUTS, DriverSettings, ReplayDriver, salted_ids
from rackSim.validate.runs import reuses_outputs
from rackSim.validate.workloads import cpu_tiny_workload
from rackSim.workload.graph import RequestSpec, SessionGraph, SessionInstance
from rackSim.workload.sources import load_sessions
from rackSim.workload.tokens import output_spans, prompt_token_ids


def _driver(tmp_path, sessions=None, **kw) -> ReplayDriver:
    wl = cpu_tiny_workload(2)
    sessions = sessions if sessions is not None else load_sessions(wl, 0)
    return ReplayDriver(sessions, DriverSettings(endpoints=["http://x"], replay=wl.replay,
                                                 token_salt=7, **kw), tmp_path)


def _chain() -> SessionGraph:
    r0 = RequestSpec(rid=0, parent=None, prefix_tokens=0, new_tokens=300, output_tokens=40)
    r1 = RequestSpec(rid=1, parent=0, prefix_tokens=340, new_tokens=20, output_tokens=10,
                     after=(0,))
    r2 = RequestSpec(rid=2, parent=1, prefix_tokens=370, new_tokens=5, output_tokens=3,
                     after=(1,))
    return SessionGraph("s", (r0, r1, r2))


def test_a_turn_re_sends_the_server_s_output_ids_where_it_generated_them(tmp_path):
    d = _driver(tmp_path, [_chain()])
    inst = SessionInstance(_chain(), key_base=5)
    workload = salted_ids(prompt_token_ids(inst, 2, 32_000), 7, 32_000)
    assert np.array_equal(d._prompt(inst, 2), workload)  # nothing generated yet
    d._keep_output("5:0", list(range(100, 140)))
    got = d._prompt(inst, 2)
    assert output_spans(inst, 2) == [(1, 360, 370), (0, 300, 340)]
    assert np.array_equal(got[300:340], np.arange(100, 140))
    # request 1's output was not generated in this run (say, it was a lane's one-token
    # primer): the workload's ids stay, as everywhere outside the outputs
    assert np.array_equal(got[:300], workload[:300])
    assert np.array_equal(got[340:], workload[340:])
    d._keep_output("5:1", [9])  # a primer's single token replaces only the first position
    got = d._prompt(inst, 2)
    assert got[360] == 9 and np.array_equal(got[361:370], workload[361:370])
    # another replay of the session (another key base) does not see these outputs
    assert np.array_equal(d._prompt(SessionInstance(_chain(), key_base=6), 2),
                          salted_ids(prompt_token_ids(SessionInstance(_chain(), 6), 2, 32_000),
                                     7, 32_000))


def test_with_the_workload_s_ids_nothing_is_spliced(tmp_path):
    d = _driver(tmp_path, [_chain()], prompt_outputs="workload")
    inst = SessionInstance(_chain(), key_base=5)
    d.outputs["5:0"] = np.arange(100, 140)
    assert np.array_equal(d._prompt(inst, 1), salted_ids(prompt_token_ids(inst, 1, 32_000), 7,
                                                         32_000))


def test_a_resumed_run_keeps_its_outputs_and_its_choice(tmp_path):
    d = _driver(tmp_path, [_chain()])
    d._keep_output("5:0", [11, 12, 13])
    with (tmp_path / OUTPUTS).open("a") as f:
        f.write('{"key": "5:1", "ids": [1, 2')  # a torn last line: skipped
    (tmp_path / "run.json").write_text(json.dumps({"prompt_outputs": "server"}))
    again = _driver(tmp_path, [_chain()], resume=True, prompt_outputs="workload")
    assert again.prompt_outputs == "server" and set(again.outputs) == {"5:0"}
    assert again.outputs["5:0"].tolist() == [11, 12, 13]
    # a run recorded before the choice existed re-sent the workload's ids, and still does
    (tmp_path / "run.json").write_text(json.dumps({"token_salt": 7}))
    assert _driver(tmp_path, [_chain()], resume=True).prompt_outputs == "workload"
    # a new run in the directory (no records yet) re-sends none of another run's outputs
    assert _driver(tmp_path, [_chain()]).outputs == {} and not (tmp_path / OUTPUTS).exists()


def test_explicit_paths_have_no_outputs_to_re_send(tmp_path):
    traced = SessionGraph("t", (RequestSpec(rid=0, parent=None, prefix_tokens=0,
                                            new_tokens=128, output_tokens=1, path=((9, 2),)),))
    assert _driver(tmp_path, [traced]).prompt_outputs == "workload"


def test_an_unknown_choice_is_refused(tmp_path):
    with pytest.raises(ValueError, match="prompt_outputs='agent'"):
        _driver(tmp_path, [_chain()], prompt_outputs="agent")


def test_the_simulation_follows_the_run_s_choice(tmp_path):
    assert not reuses_outputs(tmp_path)  # no run.json
    (tmp_path / "run.json").write_text(json.dumps({"token_salt": 1}))
    assert not reuses_outputs(tmp_path)  # recorded before the choice
    (tmp_path / "run.json").write_text(json.dumps({"prompt_outputs": "server"}))
    assert reuses_outputs(tmp_path)

