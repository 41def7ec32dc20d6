"""A Hydra launcher that runs each multirun job as a Ray task (`hydra/launcher=racksim_ray`).

Hydra finds it by scanning the `hydra_plugins` namespace package (this directory, installed
with rackSim). Each job is one `ray.remote` task that composes its sweep config and calls
Hydra's `run_job`, exactly as the joblib launcher does in a local process.

    racksim -m hydra/launcher=racksim_ray hydra.launcher.address=auto deployment.decode.gpus=4,8

`address` is passed to `ray.init`: `auto` joins the running cluster (`ray start --head` on
this machine, or RAY_ADDRESS), `local` starts a private instance for the sweep, `HOST:PORT`
joins a cluster's GCS and `ray://HOST:10001` uses Ray Client. If Ray is already initialised in
this process it is reused. `init` takes further `ray.init` arguments (`runtime_env`,
`namespace`, `_node_ip_address`), `remote` the task options (`num_cpus` per job). Jobs run in
the driver's working directory, so relative paths (`hydra.sweep.dir`, `perf.profile`) need a
file system that every node shares.
"""

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


@dataclass
class RayLauncherConf:
    """Hydra config of the launcher (no `from __future__ import annotations` in this module:
    OmegaConf reads these annotations as types)."""

    _target_: str = "hydra_plugins.racksim_ray_launcher.ray_launcher.RayLauncher"
    address: Optional[str] = "auto"  # noqa: UP045 - OmegaConf structured config
    init: dict[str, Any] = field(default_factory=dict)
    remote: dict[str, Any] = field(default_factory=lambda: {"num_cpus": 1})


ConfigStore.instance().store(group="hydra/launcher", name="racksim_ray", node=RayLauncherConf,
                             provider="racksim")


def execute_job(idx: int, overrides: Sequence[str], hydra_context: HydraContext,
                config: DictConfig, task_function: TaskFunction,
                singleton_state: dict[Any, Any], cwd: str) -> JobReturn:
    """One job inside a Ray worker: restore Hydra's state, compose the sweep config, run."""
    os.chdir(cwd)
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return run_job(hydra_context=hydra_context, config=sweep_config,
                   task_function=task_function, job_dir_key="hydra.sweep.dir",
                   job_subdir_key="hydra.sweep.subdir")


class RayLauncher(Launcher):
    """Submit every job of a sweep to Ray and wait for all of them."""

    def __init__(self, address: Optional[str] = "auto", init: Any = None,  # noqa: UP045
                 remote: Any = None) -> None:
        self.address = address
        self.init = _plain(init)
        self.remote = _plain(remote)
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        import ray

        assert self.config is not None and self.task_function is not None
        assert self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        started = not ray.is_initialized()
        if started:
            connect(self.address, self.init)
        try:
            gcs = ray.get_runtime_context().gcs_address
            log.info(f"Ray ({gcs}) is launching {len(job_overrides)} jobs, "
                     f"sweep output dir: {self.config.hydra.sweep.dir}")
            for idx, overrides in enumerate(job_overrides):
                log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))}")
            task = ray.remote(**self.remote)(execute_job)
            state, cwd = Singleton.get_state(), os.getcwd()
            refs = [task.remote(initial_job_idx + idx, list(overrides), self.hydra_context,
                                self.config, self.task_function, state, cwd)
                    for idx, overrides in enumerate(job_overrides)]
            return ray.get(refs)
        finally:
            if started:
                ray.shutdown()


def connect(address: Optional[str], init: dict[str, Any]) -> None:  # noqa: UP045
    """`ray.init` at `address`; a cluster that does not answer ends the sweep before any job
    with one line naming the address and the fix (exit 2, as a bad scenario value)."""
    import ray

    try:
        ray.init(address=address, **init)
    except ConnectionError as err:
        print(f"racksim: hydra.launcher.address={address}: {err}; start one there "
              "(`ray start --head`), or use address=local for a private Ray instance on this "
              "machine", file=sys.stderr)
        raise SystemExit(2) from None


def _plain(node: Any) -> dict[str, Any]:
    if node is None:
        return {}
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)
