"""Endpoints that are not usable vLLM servers get a clear error before anything is sent."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rackSim.validate import driver
from rackSim.validate.command import EXIT_BAD_INPUT, EXIT_ENDPOINT, EXIT_OK, main
from rackSim.validate.driver import (
    DRIVER_WAIT_LIMIT,
    DriverOutcome,
    DriverSettings,
    driver_wait_share,
    run_driver,
    thread_cpu_s,
)
from rackSim.validate.scrape import EndpointError
from rackSim.validate.server import (
    ENGINE_CORE,
    WORKER,
    ServerSettings,
    autogroup_nice,
    confine_to_host_cpus,
    deprioritize,
    driver_on,
    free_port,
    group_cpu_s,
    group_processes,
    renice_group,
    start_server,
)
from rackSim.validate.workloads import cpu_tiny_workload
from rackSim.workload.sources import load_sessions


@pytest.fixture
def plain_http(tmp_path):
    """python's http.server: answers GET with files, not a vLLM API."""
    (tmp_path / "index.html").write_text("<html>hello</html>")

    def handler(*a, **k):
        return http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _settings(url: str) -> tuple:
    wl = cpu_tiny_workload(1, window_s=1.0, num_sessions=2)
    return load_sessions(wl, 0), DriverSettings(endpoints=[url], replay=wl.replay)


def test_not_vllm_is_refused(plain_http, tmp_path):
    sessions, settings = _settings(plain_http)
    with pytest.raises(EndpointError, match="not a vLLM"):
        run_driver(sessions, settings, tmp_path / "run")
    assert not (tmp_path / "run" / "records.jsonl").exists()


def test_unreachable_is_refused(tmp_path):
    sessions, settings = _settings(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(EndpointError, match="unreachable"):
        run_driver(sessions, settings, tmp_path / "run")


def test_command_exit_codes(plain_http, tmp_path, capsys):
    assert main(["run", "--endpoint", plain_http, "--out", str(tmp_path / "a")]) \
        == EXIT_ENDPOINT
    assert "not a vLLM" in capsys.readouterr().err
    for flag, value in (("--concurrency", "0"), ("--max-errors", "-1")):
        with pytest.raises(SystemExit) as ex:  # argparse's usage error
            main(["run", "--endpoint", plain_http, "--out", str(tmp_path / "b"), flag, value])
        assert ex.value.code == EXIT_BAD_INPUT and flag in capsys.readouterr().err
    assert main(["compare", "--run", str(tmp_path / "nope"), "--profile", "x.yaml"]) \
        == EXIT_BAD_INPUT
    assert "--run" in capsys.readouterr().err
    assert main(["run", "--endpoint", plain_http, "--out", str(tmp_path / "d"),
                 "--resume"]) == EXIT_BAD_INPUT
    assert "--resume" in capsys.readouterr().err


def test_renice_group_finds_the_named_processes_of_a_group_only():
    """`--engine-nice` renices the server's engine core: the processes of the server's group
    with that name, and no other (a child in its own session stands in for the server)."""
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert renice_group(child.pid, "sleep", 7) == [child.pid]
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 7
        assert renice_group(child.pid, "VLLM::EngineCor", 9) == []  # no such name there
        assert renice_group(os.getpgrp(), "sleep", 9) == []  # not in this test's group
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 7
    finally:
        child.kill()
        child.wait()


def test_a_group_s_cpu_is_summed_per_process_name_over_its_threads():
    """The server's CPU per run (run.json `server_cpu_s`): a child spinning for 0.3 s of CPU
    in its own group (standing in for the server) shows it under its name, within the
    kernel's accounting, and nothing else is in that group."""
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n" \
           "time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        got = {}
        while time.monotonic() < deadline:
            got = group_cpu_s(child.pid)
            if got and max(cpu for cpu, _ in got.values()) >= 0.3:
                break
            time.sleep(0.1)
        (name, (cpu, wait)), = got.items()
        assert name.startswith("python") and 0.3 <= cpu < 5.0 and wait >= 0.0
    finally:
        child.kill()
        child.wait()


def test_deprioritize_sets_the_process_and_its_session_autogroup():
    """`--server-nice`: the server's process (so the children it starts later) and its
    session's autogroup, not the caller's (a child in its own session stands in)."""
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    mine = autogroup_nice(os.getpid())
    try:
        deprioritize(child.pid, 6)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 6
        assert autogroup_nice(child.pid) in (6, None)
        assert autogroup_nice(os.getpid()) == mine and os.getpriority(os.PRIO_PROCESS, 0) == 0
    finally:
        child.kill()
        child.wait()


def test_a_process_in_no_autogroup_of_its_own_has_none_to_set(monkeypatch):
    """Where a process is in no autogroup of its own (CI's container) the kernel prints an
    empty autogroup line: there is no autogroup niceness to read or set, its own counts."""
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    real_read = Path.read_text
    writes = []
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: (
        "" if self.name == "autogroup" else real_read(self, *a, **k)))
    monkeypatch.setattr(Path, "write_text", lambda self, text, *a, **k: writes.append(self))
    try:
        assert autogroup_nice(child.pid) is None
        deprioritize(child.pid, 4)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 4 and writes == []
    finally:
        child.kill()
        child.wait()


# a stand-in server: a session leader with a thread, and a child named as vLLM's model worker
# and bound to CPU 0, as vLLM's CPU backend binds it
_FAKE_WORKER = (f"import ctypes, os, time; ctypes.CDLL(None).prctl(15, b'{WORKER}', 0, 0, 0); "
                "os.sched_setaffinity(0, {0}); time.sleep(30)")
_FAKE_SERVER = ("import subprocess, sys, threading, time; "
                "threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
                f"w = subprocess.Popen([sys.executable, '-c', {_FAKE_WORKER!r}]); "
                "print('ready', flush=True); w.wait()")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_host_processes_are_pinned_off_the_worker_cpus():
    leader = subprocess.Popen([sys.executable, "-c", _FAKE_SERVER], start_new_session=True,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert leader.stdout.readline().strip() == "ready"
        names: dict[int, str] = {}
        deadline = time.monotonic() + 10
        while WORKER not in names.values() and time.monotonic() < deadline:
            names = dict(group_processes(leader.pid))
            time.sleep(0.05)
        host = confine_to_host_cpus(leader.pid)
        assert host == os.sched_getaffinity(0) - {0}
        for pid, name in names.items():
            tasks = [int(t.name) for t in Path(f"/proc/{pid}/task").glob("*")]
            want = {0} if name == WORKER else host
            assert all(os.sched_getaffinity(t) == want for t in tasks), (name, tasks)
        assert len(list(Path(f"/proc/{leader.pid}/task").glob("*"))) >= 2  # its thread too
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def test_a_group_without_a_bound_worker_is_left_alone():
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        before = os.sched_getaffinity(child.pid)
        assert confine_to_host_cpus(child.pid) == set()
        assert os.sched_getaffinity(child.pid) == before
    finally:
        child.kill()
        child.wait()


def test_driver_on_moves_the_calling_thread_and_restores_it():
    before = os.sched_getaffinity(0)
    one = {min(before)}
    with driver_on(one):
        assert os.sched_getaffinity(0) == one
    assert os.sched_getaffinity(0) == before
    with driver_on(set()):  # nothing pinned: nothing moves
        assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize("flag", ["--engine-nice", "--server-nice"])
def test_nice_out_of_range_is_refused(capsys, tmp_path, flag):
    with pytest.raises(SystemExit) as exc:
        main(["serve", flag, "25", "--work-dir", str(tmp_path)])
    assert exc.value.code == EXIT_BAD_INPUT
    assert flag in capsys.readouterr().err


def test_the_driver_thread_cpu_and_wait_are_read_from_the_kernel():
    before = thread_cpu_s()
    if before is None:
        pytest.skip("this kernel keeps no schedstat")
    t_end = time.thread_time() + 0.05
    while time.thread_time() < t_end:  # 50 ms on a CPU
        pass
    after = thread_cpu_s()
    assert after[0] - before[0] >= 0.045 and after[1] >= before[1] >= 0


def test_driver_wait_share_of_a_segment():
    seg = {"start_s": 1.0, "end_s": 21.0, "driver_cpu_s": 3.0, "driver_wait_s": 8.0}
    assert driver_wait_share(seg) == pytest.approx(0.4)
    assert driver_wait_share({**seg, "driver_wait_s": None}) is None
    assert driver_wait_share({"start_s": 0.0, "end_s": 5.0}) is None  # older run.json


@pytest.mark.parametrize("wait_s,warned", [(8.0, True), (0.2, False)])
def test_run_says_when_the_driver_waited_for_a_cpu(monkeypatch, tmp_path, capsys, wait_s,
                                                   warned):
    """The summary names a driver that waited for a CPU beyond DRIVER_WAIT_LIMIT of the run
    (the run itself is replaced: only the summary is under test)."""
    seg = {"start_s": 0.0, "end_s": 20.0, "driver_cpu_s": 2.0, "driver_wait_s": wait_s}
    assert (wait_s / 20.0 > DRIVER_WAIT_LIMIT) == warned

    def fake_run(_sessions, _settings, out):
        return DriverOutcome(out, 10, 0, 0, "window", 0.0, 20.0, out / "records.jsonl",
                             {"segments": [seg], "probe": {}})

    monkeypatch.setattr(driver, "run_driver", fake_run)
    assert main(["run", "--endpoint", f"http://127.0.0.1:{free_port()}",
                 "--out", str(tmp_path / "r")]) == EXIT_OK
    out = capsys.readouterr().out
    assert ("the driver waited for a CPU 40% of the run" in out) == warned


@pytest.mark.slow
def test_a_local_server_runs_niced_and_pinned_off_its_worker_cpus(tmp_path):
    server = start_server(tmp_path, ServerSettings(model="tiny-dense", server_nice=3,
                                                   engine_nice=5))
    try:
        pids = _session(server.proc.pid)
        engine = [pid for pid in pids
                  if Path(f"/proc/{pid}/comm").read_text().startswith(ENGINE_CORE)]
        assert len(engine) == 1
        assert os.getpriority(os.PRIO_PROCESS, engine[0]) == 3 + 5
        others = [os.getpriority(os.PRIO_PROCESS, p) for p in pids if p not in engine]
        assert others and set(others) == {3}  # the API server and the worker it started
        assert autogroup_nice(server.proc.pid) in (3, None)
        # the API server and the engine core run off the model worker's CPUs
        worker = [pid for pid in pids
                  if Path(f"/proc/{pid}/comm").read_text().startswith(WORKER)]
        assert len(worker) == 1 and server.host_cpus
        assert not server.host_cpus & os.sched_getaffinity(worker[0])
        for pid in (server.proc.pid, engine[0]):
            assert os.sched_getaffinity(pid) == server.host_cpus
    finally:
        server.stop()


def _session(sid: int) -> list[int]:
    """Pids of session `sid` (the server starts its own)."""
    out = subprocess.run(["ps", "-o", "pid=", "-s", str(sid)], capture_output=True,
                         text=True, check=True).stdout
    return [int(p) for p in out.split()]
