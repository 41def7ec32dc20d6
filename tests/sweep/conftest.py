"""A small real sweep (Hydra multirun through the joblib launcher), shared by the sweep tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sweep_support import AXES, JOBLIB, run_sweep


@pytest.fixture(scope="session")
def joblib_sweep(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    sweep_dir = tmp_path_factory.mktemp("sweep") / "joblib"
    return sweep_dir, run_sweep(sweep_dir, *JOBLIB, *AXES)
