"""`racksim-validate machine`: the machine's own speed, sampled and summarised."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from rackSim.validate.command import main
from rackSim.validate.machine import KERNELS, KernelSizes, sample, steadiness

TINY = KernelSizes(loop_iterations=1_000, hidden=16, vocab=64, copy_mib=1)


def _frame(values: list[float], every_s: float = 10.0, kernel: str = "python") -> pd.DataFrame:
    return pd.DataFrame({"t_s": np.arange(len(values)) * every_s, "kernel": kernel,
                         "best_ms": values, "median_ms": values})


def test_steadiness_matches_hand_arithmetic():
    v = [10, 12, 10, 12, 10, 14, 16, 14, 16, 14]
    row = steadiness(_frame(v), window_s=30.0).iloc[0]
    # sorted 10 10 10 12 12 14 14 14 16 16: P10 at rank 0.9 -> 10, P50 at 4.5 -> 13, P90 at
    # 8.1 -> 16
    assert (row.p10_ms, row.p50_ms, row.p90_ms) == pytest.approx((10.0, 13.0, 16.0))
    assert row.p90_over_p10 == pytest.approx(1.6)
    # windows of 30 s: t 0-20, 30-50, 60-80 are whole (t 90 starts a cut one): means 32/3,
    # 36/3, 46/3 -> max / min 46 / 32
    assert row.window_spread == pytest.approx(46 / 32)
    x, y = np.array(v[:-1], float), np.array(v[1:], float)
    r = ((x - x.mean()) * (y - y.mean())).sum() / np.sqrt(
        ((x - x.mean()) ** 2).sum() * ((y - y.mean()) ** 2).sum())
    assert row.lag1_r == pytest.approx(r)
    assert row.samples == 10


def test_steadiness_of_a_steady_or_short_record():
    steady = steadiness(_frame([5.0] * 8), window_s=20.0).iloc[0]
    assert steady.p90_over_p10 == 1.0 and steady.window_spread == 1.0
    assert np.isnan(steady.lag1_r)  # no variation: no correlation to speak of
    short = steadiness(_frame([5.0, 6.0], every_s=1.0), window_s=60.0).iloc[0]
    assert np.isnan(short.lag1_r) and np.isnan(short.window_spread)
    with pytest.raises(ValueError, match="--window-s"):
        steadiness(_frame([5.0]), window_s=0)


def test_sample_times_every_kernel_and_ctrl_c_keeps_the_samples():
    calls = []

    def sleep(_s: float) -> None:
        calls.append(_s)
        if len(calls) == 3:
            raise KeyboardInterrupt

    before = os.sched_getaffinity(0)
    df, partial = sample(60.0, every_s=0.5, cpu=min(before), repeats=2, sizes=TINY,
                         sleep=sleep)
    assert partial and calls == [0.5, 0.5, 0.5]
    assert os.sched_getaffinity(0) == before  # unpinned again
    assert list(df.kernel) == list(KERNELS) * 3
    assert (df.best_ms > 0).all() and (df.best_ms <= df.median_ms).all()
    assert df.t_s.is_monotonic_increasing


@pytest.mark.parametrize("kwargs, flag", [
    ({"duration_s": 0}, "--duration-s"), ({"every_s": -1}, "--every-s"),
    ({"repeats": 0}, "--repeats"), ({"cpu": 4096}, "--cpu 4096"),
])
def test_sample_refuses_bad_input(kwargs, flag):
    args = {"duration_s": 1.0, **kwargs}
    with pytest.raises(ValueError, match=flag):
        sample(sizes=TINY, **args)


def test_machine_command_writes_table_and_figure(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["machine", "--out", str(out), "--duration-s", "0.2", "--every-s", "0",
                 "--repeats", "1", "--cpu", str(min(os.sched_getaffinity(0)))]) == 0
    df = pd.read_csv(out / "machine.csv")
    assert set(df.kernel) == set(KERNELS) and len(df) % len(KERNELS) == 0
    assert (out / "machine.png").stat().st_size > 0
    text = capsys.readouterr().out
    assert "P90/P10" in text and "60-s means max/min" in text


def test_machine_command_refuses_a_cpu_it_cannot_use(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["machine", "--out", str(out), "--duration-s", "1", "--cpu", "4096"]) == 2
    assert "--cpu 4096" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit) as ex:  # argparse's usage error
        main(["machine", "--out", str(out), "--duration-s", "1", "--window-s", "0"])
    assert ex.value.code == 2 and "--window-s: 0 must be above 0" in capsys.readouterr().err
    assert not out.exists()


def test_ctrl_c_writes_what_was_sampled_and_exits_130(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "m"
    proc = subprocess.Popen([sys.executable, "-m", "rackSim.validate.command", "machine",
                             "--out", str(out), "--duration-s", "600", "--every-s", "0.2",
                             "--repeats", "1", "--cpu", str(min(os.sched_getaffinity(0)))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        line = proc.stderr.readline()  # the first progress line: a sample is taken
        if "s of 600 s" in line:
            break
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted; the samples so far are written" in stderr
    assert len(pd.read_csv(out / "machine.csv")) >= len(KERNELS)
    assert "P90/P10" in stdout
