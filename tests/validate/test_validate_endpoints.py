"""Endpoints that are not usable vLLM servers get a clear error before anything is sent."""

from __future__ import annotations

import http.server
import threading

import pytest

from rackSim.validate.command import EXIT_BAD_INPUT, EXIT_ENDPOINT, main
from rackSim.validate.driver import DriverSettings, run_driver
from rackSim.validate.scrape import EndpointError
from rackSim.validate.server import free_port
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
