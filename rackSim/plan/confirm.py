"""Stage 2: the best screened candidates simulated by the engine, through a Hydra launcher.

Each candidate becomes one option of a `candidate` config group written under the plan's
output directory (`candidates/candidate/<id>.yaml`, `# @package _global_`: hardware,
layout, router, clients, window). One `racksim -m` multirun then runs them all, with the
plan's launcher (joblib locally, racksim_ray on a cluster) and the scenario overrides the plan
was composed with, into `<out>/confirm/`: a sweep like any other (job.json per job, the sweep
table at the end), and resumable like one: a candidate id is a hash of its file, so re-running
the plan into the same directory skips every candidate already simulated.

`confirm.fleet: true` (the default) simulates the whole fleet: `deployment.racks` racks of the
layout, the global router's session affinity (docs/fleets.md), the full demand.
`confirm.fleet: false` simulates *one* rack of the candidate at `agents / racks` clients,
R times cheaper: with session affinity to a rack, identical racks split the demand evenly and
exchange no KV, so one rack stands for each of them; what it leaves out is the router's
imbalance and spill-over between racks. The report says which was done.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import yaml

from rackSim.config.specs import RunConfig
from rackSim.metrics.summary import TTFT_STAGES
from rackSim.plan.layout import RackLayout
from rackSim.plan.screen import layout_deployment
from rackSim.plan.spec import PlanSpec
from rackSim.report.sweep_table import build_table

CANDIDATE_GROUP = "candidate"
#: The metrics compared between the screen and the simulation.
COMPARED = ("throughput_tok_s_gpu", "output_tok_s_gpu", "interactivity_tok_s", "ttft_p50_ms",
            "ttft_p90_ms")


class ConfirmError(RuntimeError):
    """The confirmation sweep could not run at all (not: a candidate failed)."""


def candidate_config(row: pd.Series, plan: PlanSpec, cfg: RunConfig) -> dict:
    """The scenario changes that make the base scenario `cfg` this candidate."""
    fleet = plan.confirm.fleet
    racks = int(row["racks"])
    if plan.demand.agents is not None:
        agents = plan.demand.agents if fleet else math.ceil(plan.demand.agents / racks)
    else:  # open-loop demand: the clients the screen predicted at that session rate
        agents = math.ceil(row["agents_per_rack"] * (racks if fleet else 1))
    layout = RackLayout(row["family"], *(int(row[c]) for c in (
        "prefill_instances", "prefill_gpus", "decode_instances", "decode_gpus",
        "colocated_instances", "colocated_gpus")),
        *(bool(row[c]) for c in ("prefill_dbo", "decode_dbo", "colocated_dbo")))
    deployment: dict = {
        **layout_deployment(cfg, layout, plan.space),
        "name": "plan candidate" if fleet else f"plan candidate, 1 rack of {racks}",
        "racks": racks if fleet else 1,
        "router": "session_affinity",
        "fleet_router": {"policy": "session_affinity"},
    }
    profile = plan.option(row["hardware"]).profile
    return {"defaults": [{"override /hardware": row["hardware"]}],
            **({"perf": {"profile": str(profile)}} if profile is not None else {}),
            "deployment": deployment,
            "workload": {"replay": {"concurrency": agents,
                                    "warmup_requests_per_lane":
                                        plan.confirm.warmup_requests_per_lane,
                                    "window_s": plan.confirm.window_s}}}


def write_candidates(rows: pd.DataFrame, plan: PlanSpec, out_dir: Path, cfg: RunConfig,
                     overrides: Sequence[str] = ()) -> list[str]:
    """Write each row's config file; returns their ids (`<hardware>_<layout>_r<racks>_<hash>`,
    e.g. `gb200_nvl72_p4x8dbo_d1x32_r2_0f3a9c1d`: `dbo` marks an overlapping instance kind).

    The scenario's command-line `overrides` are applied after the candidate files, so one
    that sets a key a candidate sets (`deployment.prefill.gpus_per_instance=4`,
    `perf.profile=...`) would undo the candidate's layout or profile: those keys are written
    into every file instead (the scenario's value where the candidate sets none), and
    `confirm_command` leaves such overrides out."""
    group = out_dir / "candidates" / CANDIDATE_GROUP
    group.mkdir(parents=True, exist_ok=True)
    configs = [candidate_config(row, plan, cfg) for _, row in rows.iterrows()]
    scenario = cfg.model_dump(mode="json")
    pinned = {k for o in overrides if (k := _override_key(o)) and _sets(configs, k)}
    ids = []
    for (_, row), config in zip(rows.iterrows(), configs, strict=True):
        for key in sorted(pinned):
            _pin(config, key, scenario)
        body = yaml.safe_dump(config, sort_keys=False)
        digest = hashlib.sha1(body.encode()).hexdigest()[:8]
        name = f"{row['hardware']}_{_layout_id(row)}_r{row['racks']}_{digest}"
        (group / f"{name}.yaml").write_text("# @package _global_\n" + body)
        ids.append(name)
    return ids


def _override_key(override: str) -> str | None:
    """The dotted key a value override sets (`deployment.decode.gpus=16`, `+perf.x=1`);
    None for a config group's choice (`model=deepseek_v3`) or a top-level value."""
    key = override.split("=", 1)[0].lstrip("+~")
    return key if "." in key and "/" not in key and "@" not in key else None


def _leaves(tree: dict, prefix: str = "") -> set[str]:
    """Dotted keys of the values of a candidate's config (not its defaults list)."""
    out: set[str] = set()
    for k, v in tree.items():
        if k == "defaults" and not prefix:
            continue
        out |= _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
    return out


def _sets(configs: Sequence[dict], key: str) -> bool:
    """Whether a candidate config sets `key` or a key under it."""
    return any(leaf == key or leaf.startswith(key + ".") for c in configs
               for leaf in _leaves(c))


def _pin(config: dict, key: str, scenario: dict) -> None:
    """Set `key` in `config` to the scenario's value, under what the config itself sets."""
    *parents, last = key.split(".")
    src, dst = scenario, config
    for p in parents:
        src, dst = src[p], dst.setdefault(p, {})
    dst[last] = _under(src[last], dst.get(last))


def _under(base, top):
    """`top` merged over `base` (dicts key by key; anything else: `top` if given)."""
    if isinstance(base, dict) and isinstance(top, dict):
        return {**base, **{k: _under(base.get(k), v) for k, v in top.items()}}
    return base if top is None else top


def _layout_id(row: pd.Series) -> str:
    """`p4x8dbo_d1x32`, `c2x16`: instances x width per kind, `dbo` where they overlap."""
    def part(kind: str, instances: str, width: str) -> str:
        return f"{kind[0]}{row[instances]}x{row[width]}{'dbo' if row[f'{kind}_dbo'] else ''}"
    if row["family"] == "colocated":
        return part("colocated", "colocated_instances", "colocated_gpus")
    return (f"{part('prefill', 'prefill_instances', 'prefill_gpus')}_"
            f"{part('decode', 'decode_instances', 'decode_gpus')}")


def held_by_candidates(ids: Sequence[str], out_dir: Path, overrides: Sequence[str]
                       ) -> list[str]:
    """The `overrides` of keys the candidate files `ids` set (`write_candidates`)."""
    group = out_dir / "candidates" / CANDIDATE_GROUP
    configs = [yaml.safe_load((group / f"{i}.yaml").read_text()) for i in ids]
    return [o for o in overrides if (k := _override_key(o)) and _sets(configs, k)]


def confirm_command(ids: Sequence[str], plan: PlanSpec, out_dir: Path,
                    scenario_overrides: Sequence[str]) -> list[str]:
    """The `racksim -m` command line that simulates `ids` (written by `write_candidates`),
    without the `scenario_overrides` of keys their files set (those files hold them)."""
    c = plan.confirm
    held = set(held_by_candidates(ids, out_dir, scenario_overrides))
    kept = [o for o in scenario_overrides if o not in held]
    return [sys.executable, "-c", "from rackSim.cli import run; run()", "-m",
            f"hydra/launcher={c.launcher}", *c.launcher_overrides,
            f"hydra.searchpath=[file://{(out_dir / 'candidates').resolve()}]",
            f"hydra.sweep.dir={(out_dir / 'confirm').resolve()}", "progress=false",
            *kept, f"+{CANDIDATE_GROUP}={','.join(ids)}"]


def run_confirmation(ids: Sequence[str], plan: PlanSpec, out_dir: Path,
                     scenario_overrides: Sequence[str]) -> pd.DataFrame:
    """Simulate the candidates `ids`; one row per candidate of the sweep table (status,
    error, metrics), indexed by candidate id."""
    cmd = confirm_command(ids, plan, out_dir, scenario_overrides)
    returncode = _run_sweep(cmd)
    try:
        table = build_table(out_dir / "confirm")
    except FileNotFoundError:
        raise ConfirmError(f"the confirmation sweep ran no job (exit {returncode}): "
                           f"{' '.join(cmd[3:])}") from None
    table = table[table[CANDIDATE_GROUP].isin(ids)]
    return table.set_index(CANDIDATE_GROUP)


def _run_sweep(cmd: Sequence[str]) -> int:
    """Run the sweep; its exit code. On Ctrl-C the sweep gets one SIGINT and is let finish
    its own interrupt (it keeps what it simulated and writes its table) before
    KeyboardInterrupt goes on. It runs in a process group of its own, so that one SIGINT is
    this one whether Ctrl-C came from a terminal (which signals only this process's group)
    or to this process alone: a second one could land while the sweep writes its table."""
    sweep = subprocess.Popen(cmd, stdout=sys.stderr, process_group=0)
    try:
        return sweep.wait()
    except KeyboardInterrupt:
        os.killpg(sweep.pid, signal.SIGINT)  # the sweep and its launcher's workers
        sweep.wait()
        raise


def compare(screened: pd.DataFrame, simulated: pd.DataFrame) -> pd.DataFrame:
    """Screen beside simulation for each confirmed candidate: `des_<metric>` and the screen's
    relative error `err_<metric>` = screen / DES - 1, and the simulated TTFT's mean by stage
    (`des_ttft_<stage>_ms`)."""
    out = screened.copy()
    sim = simulated.reindex(out["candidate"])
    out["des_status"] = sim["status"].to_numpy()
    out["des_error"] = sim["error"].to_numpy()
    for m in COMPARED:
        des = pd.to_numeric(sim[m], errors="coerce").to_numpy() if m in sim else math.nan
        out[f"des_{m}"] = des
        out[f"err_{m}"] = out[m] / des - 1
    for stage, _, _, _ in TTFT_STAGES:  # where the simulated TTFT went (the screen has no split)
        key = f"ttft_{stage}_ms"
        out[f"des_{key}"] = (pd.to_numeric(sim[key], errors="coerce").to_numpy()
                             if key in sim else math.nan)
    return out
