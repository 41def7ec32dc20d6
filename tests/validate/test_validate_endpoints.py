"""Endpoints that are not usable vLLM servers get a clear error before anything is sent."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
from pathlib import Path

import pytest

from rackSim.validate.command import EXIT_BAD_INPUT, EXIT_ENDPOINT, main
from rackSim.validate.driver import DriverSettings, run_driver
from rackSim.validate.scrape import EndpointError
from rackSim.validate.server import (
    ENGINE_CORE,
    ServerSettings,
    free_port,
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
    assert main(["run", "--endpoint", plain_http, "--out", str(tmp_path / "b"),
                 "--concurrency", "0"]) == EXIT_BAD_INPUT
    assert "concurrency" in capsys.readouterr().err
    assert main(["run", "--endpoint", plain_http, "--out", str(tmp_path / "c"),
                 "--max-errors", "-1"]) == EXIT_BAD_INPUT
    assert "--max-errors" in capsys.readouterr().err
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


def test_engine_nice_out_of_range_is_refused(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--engine-nice", "25", "--work-dir", str(tmp_path)])
    assert exc.value.code == EXIT_BAD_INPUT
    assert "--engine-nice" in capsys.readouterr().err


@pytest.mark.slow
def test_a_server_started_with_engine_nice_has_its_engine_core_reniced(tmp_path):
    server = start_server(tmp_path, ServerSettings(model="tiny-dense", engine_nice=5))
    try:
        engine = [pid for pid in _session(server.proc.pid)
                  if Path(f"/proc/{pid}/comm").read_text().startswith(ENGINE_CORE)]
        assert len(engine) == 1
        assert os.getpriority(os.PRIO_PROCESS, engine[0]) == 5
        assert os.getpriority(os.PRIO_PROCESS, server.proc.pid) == 0  # the API server is not
    finally:
        server.stop()


def _session(sid: int) -> list[int]:
    """Pids of session `sid` (the server starts its own)."""
    out = subprocess.run(["ps", "-o", "pid=", "-s", str(sid)], capture_output=True,
                         text=True, check=True).stdout
    return [int(p) for p in out.split()]
