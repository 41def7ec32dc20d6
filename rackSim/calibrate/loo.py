"""Leave-one-out (LOO): refit without one target, then predict that target.

A fitted figure reproduced by its own fit says little (with as many parameters as targets it
is reproduced exactly); the same figure predicted by a fit that never saw it is evidence. The
machinery is generic: `leave_one_out` takes a fit function (left-out ids -> model) and a
predict function (model, id -> {key: value}); `calibration_loo` applies it to the profile fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import pandas as pd
from joblib import Parallel, delayed
from tqdm import tqdm

from rackSim.calibrate.fit import calibrate, fit_table
from rackSim.perf.profile import Profile

Fit = Callable[[frozenset[str]], Any]
Predict = Callable[[Any, str], dict[str, float]]
LOO_COLUMNS = ["left_out", "key", "loo_predicted", "refit_predicted"]


def _loo_one(fit: Fit, predict: Predict, fid: str) -> tuple[str, dict[str, float]]:
    return fid, predict(fit(frozenset({fid})), fid)


def _refit_all(fit: Fit, predict: Predict, ids: Sequence[str]) -> tuple[None, dict[str, float]]:
    model = fit(frozenset())
    return None, {k: v for fid in ids for k, v in predict(model, fid).items()}


def parallel_map(tasks: Iterable[Any], total: int, jobs: int, desc: str) -> list[Any]:
    """Run joblib `delayed` tasks over `jobs` processes with a tqdm bar (stderr, TTY only);
    results in completion order. Ctrl-C propagates as KeyboardInterrupt."""
    run = Parallel(n_jobs=jobs, return_as="generator_unordered")
    return list(tqdm(run(tasks), total=total, desc=desc, disable=None, leave=False))


def leave_one_out(ids: Sequence[str], fit: Fit, predict: Predict, jobs: int = 1,
                  desc: str = "leave-one-out") -> pd.DataFrame:
    """For each id: fit without it and predict its keys; also one fit with nothing left out.

    `fit(excluded ids) -> model`; `predict(model, id) -> {key: value}` (one id may have several
    keys, e.g. C1.ring and C1.recursive_doubling). Returns one row per (left_out, key):
    loo_predicted from the fit without `left_out`, refit_predicted from the fit with every id,
    so the difference is what leaving the id out changed. Fits run over `jobs` processes.
    """
    tasks = [delayed(_loo_one)(fit, predict, fid) for fid in ids]
    tasks.append(delayed(_refit_all)(fit, predict, list(ids)))
    results = dict(parallel_map(tasks, len(tasks), jobs, desc))
    full = results.pop(None)
    rows = [{"left_out": fid, "key": k, "loo_predicted": float(v),
             "refit_predicted": float(full[k])}
            for fid in ids for k, v in results[fid].items()]
    return pd.DataFrame(rows, columns=LOO_COLUMNS)


def figure_id(key: str) -> str:
    """The published figure id of a fit-table key: 'D5@DEP4' -> 'D5', 'C1.ring' -> 'C1'."""
    return key.split("@")[0].split(".")[0]


def calibration_fit(previous: Profile, exclude: frozenset[str]) -> Profile:
    """The profile fit (no kernel tables: kernel parameters kept from `previous`) without the
    figures in `exclude` (about 10 s)."""
    return calibrate(previous, use_aic=False, log=lambda _: None, exclude=exclude)


def calibration_predict(profile: Profile, fid: str) -> dict[str, float]:
    """The fit-table predictions of figure `fid` (its sub-keys) by `profile`."""
    return {str(r["figure"]): float(r["predicted"]) for r in fit_table(profile)
            if figure_id(str(r["figure"])) == fid and isinstance(r["error"], float)}


def calibration_loo(profile: Profile, ids: Sequence[str], jobs: int = 1) -> pd.DataFrame:
    """Leave-one-out over the profile's fitted figures `ids` (see `leave_one_out`)."""
    return leave_one_out(ids, partial(calibration_fit, profile), calibration_predict, jobs,
                         desc="leave-one-out refits")
