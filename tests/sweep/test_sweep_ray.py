"""A real sweep through rackSim's Ray launcher (`hydra/launcher=racksim_ray`) against a local
Ray instance on loopback, started once for this module and shut down afterwards."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from sweep_support import run_sweep

# Single-machine Ray: every address (GCS, raylet, workers) on 127.0.0.1. Read by Ray at import
# (this process) and inherited by the racksim driver and the Ray workers.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@pytest.fixture(scope="module")
def ray_cluster():
    mp = pytest.MonkeyPatch()
    mp.setenv(LOOPBACK_ENV, "0")
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants

    mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        mp.undo()


@pytest.fixture(scope="module")
def ray_sweep(ray_cluster, tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("sweep") / "ray"
    proc = run_sweep(sweep_dir, "hydra/launcher=racksim_ray",
                     f"hydra.launcher.address={ray_cluster}",
                     "deployment.decode.gpus=4,8,5", "workload.replay.concurrency=32")
    return sweep_dir, proc


def test_cluster_is_on_loopback(ray_cluster):
    assert ray_cluster.startswith("127.0.0.1:")


def test_jobs_ran_as_ray_tasks(ray_cluster, ray_sweep):
    import ray._private.state as ray_state

    sweep_dir, proc = ray_sweep
    out = proc.stdout + proc.stderr
    assert f"Ray ({ray_cluster}) is launching 3 jobs" in out
    drivers = [j for j in ray_state.jobs() if j["DriverPid"] != os.getpid()]
    assert drivers and all(j["DriverIPAddress"] == "127.0.0.1" for j in drivers)
    pids = {json.loads(p.read_text())["pid"] for p in sweep_dir.glob("*/job.json")}
    # jobs ran in Ray worker processes, not in the racksim driver
    assert not pids & {os.getpid(), *(j["DriverPid"] for j in drivers)}


def test_ray_sweep_table(ray_sweep):
    sweep_dir, _ = ray_sweep
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    assert len(table) == 3
    by_width = table.set_index("deployment.decode.gpus")
    assert by_width.loc[5, "status"] == "failed" and "divides 384" in by_width.loc[5, "error"]
    ok = by_width.loc[[4, 8]]
    assert (ok["status"] == "ok").all()
    assert (ok["throughput_tok_s_gpu"] > 1000).all()
    assert ok["layout"].tolist() == ["P2xDEP2+DEP4", "P2xDEP2+DEP8"]
    # same scenario, same seed: the Ray job reproduces a direct simulation exactly
    from rackSim.config import compose_scenario
    from rackSim.run import simulate

    cfg = compose_scenario(["experiment=smoke", "workload.replay.window_s=10", "progress=false",
                            "deployment.decode.gpus=8", "workload.replay.concurrency=32"])
    direct = simulate(cfg, progress=False).summary
    assert ok.loc[8, "throughput_tok_s_gpu"] == pytest.approx(direct["throughput_tok_s_gpu"],
                                                              rel=1e-12)


def test_a_cluster_that_does_not_answer_ends_the_sweep_in_one_line(monkeypatch, capsys):
    """`ray.init` gives up on an address after about a minute of retries with a
    ConnectionError: the sweep ends there, exit 2, naming the address and the fix."""
    ray = pytest.importorskip("ray")
    from hydra_plugins.racksim_ray_launcher.ray_launcher import connect

    def refuse(address, **_):
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(SystemExit) as ex:
        connect("10.255.255.1:6379", {})
    assert ex.value.code == 2
    assert capsys.readouterr().err == (
        "racksim: hydra.launcher.address=10.255.255.1:6379: Failed to connect to Ray cluster "
        "at 10.255.255.1:6379; start one there (`ray start --head`), or use address=local for "
        "a private Ray instance on this machine\n")
