"""`racksim-fidelity`: how well the model reproduces the published figures, and what that is worth.

One table row per published figure (calibration/published_figures.csv; a figure with several
values, e.g. C1 ring and recursive doubling, gives one row per value): published, predicted,
relative error, and a status:

- fitted: some profile parameter's `fitted_to` lists it (or the headline fit's `fitted_to`);
- predicted: the model predicts it and nothing was fitted to it;
- input: a model spec, mechanism, layout or price used as an input (and M7, E3, H4);
- qualitative: a statement, not a number; not modelled: nothing predicts it.

Fitted calibration rows also get a leave-one-out prediction (rackSim.calibrate.loo) and the
size of the group of figures fitted together (free parameters vs target values: with as many
parameters as targets a zero error is no evidence). End-to-end rows (H1-H4) come from one
simulation: of the fitted headline scenario (`workload=agentx_fitted
deployment=agentx_fitted`, as its fit evaluated it: window, warm-up, seed) when the headline
fit converged (calibration/headline_fit.yaml exists; its leave-one-out values are then the
rows' evidence), of the default scenario otherwise; the same scenario at the next seeds
(`--headline-seeds`) gives each of H1-H3 the range of its error over seeds, so a fitted
error can be read against the noise of its window. Effects (rackSim.calibrate.effects)
compare variants of the default scenario with the directions the publication reports.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from joblib import delayed

from rackSim.calibrate import figures
from rackSim.calibrate.effects import (
    complete_summary,
    default_effects,
    effect_noise,
    one_line,
    run_effects,
)
from rackSim.calibrate.fit import fit_table
from rackSim.calibrate.loo import calibration_loo, figure_id, parallel_map
from rackSim.calibrate.scenario import CALIBRATION, operating_point
from rackSim.config import RunConfig, compose_scenario
from rackSim.config.errors import InputError, ScenarioError
from rackSim.config.flags import count, positive_float, positive_int, unwritable
from rackSim.perf.profile import Profile
from rackSim.report.fidelity_plots import plot_fidelity
from rackSim.run import layout_name

HEADLINE_FIT = CALIBRATION / "headline_fit.yaml"
#: the scenario `racksim-calibrate workload` writes when the headline fit converges
FITTED_SCENARIO = ("workload=agentx_fitted", "deployment=agentx_fitted")
#: end-to-end figure -> the simulation summary key that predicts it
HEADLINE_KEYS = {"H1": "throughput_tok_s_gpu", "H2": "interactivity_tok_s",
                 "H3": "revenue_usd_gpu_h"}
#: `use` values of published_figures.csv that are inputs to the model, not outputs
INPUT_USES = frozenset({"model spec", "mechanism", "deployment", "pricing"})
#: further inputs: M7 sets the accepted tokens per step, E3 the EPLB interval, H4 bounds the
#: layout's GPU count (checked, not predicted)
INPUT_IDS = frozenset({"M7", "E3", "H4"})
TABLE_COLUMNS = [
    "id", "key", "quantity", "unit", "value", "status", "published", "predicted", "error",
    "check", "fit_params", "fit_targets", "exactly_determined", "loo_predicted", "loo_error",
    "refit_predicted", "loo_note", "seed_error_min", "seed_error_max"]


class FidelityError(ScenarioError):
    """Bad input to racksim-fidelity; the message names the option or file."""


def _tags(entry: dict[str, Any]) -> list[str]:
    tags = entry.get("fitted_to") or []
    return [tags] if isinstance(tags, str) else [str(t) for t in tags]


def fitted_ids(profile: Profile, headline_fit: dict[str, Any] | None = None) -> set[str]:
    """Figure ids some parameter was fitted to (kernel-table tags like 'aic:...' are not
    figures), plus the headline fit's `fitted_to`."""
    ids = {t for e in profile.params.values() for t in _tags(e) if not t.startswith("aic:")}
    return ids | {str(t) for t in (headline_fit or {}).get("fitted_to") or []}


def classify(fid: str, figure: dict[str, str], fitted: set[str], predicted: bool) -> str:
    """Status of figure `fid` (its published_figures.csv row `figure`)."""
    if fid in fitted:
        return "fitted"
    if figure["value"].strip() == "qualitative":
        return "qualitative"
    if figure["use"].strip() in INPUT_USES or fid in INPUT_IDS:
        return "input"
    return "predicted" if predicted else "not modelled"


def fit_dof(profile: Profile, keys: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Figure id -> (free parameters, target values) of its fit group: the figures joined by
    shared parameters, transitively. A parameter at a bound is not free. `keys`: the
    fit-table keys (one per target value, e.g. 'C1.ring')."""
    targets = Counter(figure_id(k) for k in keys)
    groups: list[tuple[set[str], int]] = []
    for entry in profile.params.values():
        ids = {t for t in _tags(entry) if t in targets}
        if not ids:
            continue
        joined = [g for g in groups if g[0] & ids]
        groups = [g for g in groups if not g[0] & ids]
        groups.append((ids.union(*(g[0] for g in joined)),
                       int(not entry.get("at_bound")) + sum(g[1] for g in joined)))
    return {fid: (free, sum(targets[f] for f in ids)) for ids, free in groups for fid in ids}


def headline_dof(headline_fit: dict[str, Any] | None) -> dict[str, tuple[int, int]]:
    """Figure id -> (free parameters, targets) of the headline fit: its `priors` (one per free
    parameter; they also act as soft targets) against its `fitted_to`."""
    priors, fitted = (headline_fit or {}).get("priors"), (headline_fit or {}).get("fitted_to")
    if not isinstance(priors, dict) or not fitted:
        return {}
    return {str(fid): (len(priors), len(fitted)) for fid in fitted}


def loo_note(dof: tuple[int, int] | None, values: int) -> str:
    """What leaving out a figure with `values` values leaves of its fit group `dof` (free
    parameters, target values): nothing (its parameters keep their initial guesses), fewer
    values than parameters (underdetermined), or enough (empty note)."""
    if dof is None:
        return ""
    params, rest = dof[0], dof[1] - values
    if rest == 0:
        return f"nothing else constrains its {params} params: initial guesses"
    return f"underdetermined without it: {params} params, {rest} values" if params > rest else ""


def read_headline_fit(path: Path = HEADLINE_FIT) -> dict[str, Any] | None:
    """The lead's headline fit (`fitted_to: [ids]`, `loo: {id: {predicted, note}}`), or None
    when the file does not exist."""
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict) or not isinstance(data.get("loo") or {}, dict):
            raise ValueError("expected a mapping with 'fitted_to' and 'loo'")
        for entry in (data.get("loo") or {}).values():
            entry["predicted"] = float(entry["predicted"])  # YAML reads 9.5e5 as a string
    except (yaml.YAMLError, ValueError, TypeError, KeyError) as err:
        raise FidelityError(one_line(f"{path}: {err}")) from err
    return data


def headline_predictions(figs: dict[str, dict[str, str]], summary: dict[str, Any]
                         ) -> dict[str, list[dict[str, Any]]]:
    """H1-H3 from a simulation summary; H4 checks its GPU count against the published range."""
    out = {}
    for fid, key in HEADLINE_KEYS.items():
        pub, pred = float(figs[fid]["value"]), float(summary[key])
        out[fid] = [{"key": fid, "published": pub, "predicted": pred, "error": pred / pub - 1}]
    bounds = re.fullmatch(r"\s*(\d+)\s*to\s*(\d+)\s*", figs["H4"]["value"])
    if bounds is None:
        raise FidelityError(f"published_figures.csv: H4 value '{figs['H4']['value']}' is not "
                            "'<min> to <max>'")
    n = int(summary["num_gpus"])
    ok = int(bounds[1]) <= n <= int(bounds[2])
    out["H4"] = [{"key": "H4", "predicted": float(n), "check": "ok" if ok else "outside"}]
    return out


def seed_spread(headline: dict[str, list[dict[str, Any]]],
                at_seeds: list[dict[str, list[dict[str, Any]]]]) -> None:
    """Give each H1-H3 row of `headline` the range of its error over its own seed and
    `at_seeds` (headline_predictions of the same scenario at other seeds), in place."""
    for fid in HEADLINE_KEYS:
        errors = [headline[fid][0]["error"], *(h[fid][0]["error"] for h in at_seeds)]
        headline[fid][0] |= {"seed_error_min": min(errors), "seed_error_max": max(errors)}


def _fit_rows(fit_rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in fit_rows:
        key, err = str(r["figure"]), r["error"]
        numeric = isinstance(err, float)
        out.setdefault(figure_id(key), []).append({
            "key": key, "published": float(r["published"]) if numeric else math.nan,
            "predicted": float(r["predicted"]), "error": err if numeric else math.nan,
            "check": "" if numeric else str(err)})
    return out


def _loo_cells(fid: str, key: str, status: str, published: float, note: str,
               loo: pd.DataFrame | None, headline_fit: dict[str, Any] | None) -> dict[str, Any]:
    nan = math.nan
    if fid in HEADLINE_KEYS:
        if headline_fit is None:
            return {"loo_note": "n/a (no headline fit)"}
        entry = (headline_fit.get("loo") or {}).get(fid)
        if entry is None:
            return {"loo_note": "n/a (not in the headline fit's loo)"}
        pred = float(entry["predicted"])
        return {"loo_predicted": pred, "loo_error": pred / published - 1,
                "loo_note": str(entry.get("note", ""))}
    if status != "fitted":
        return {}
    if loo is None:
        return {"loo_note": "not run (--no-loo)"}
    hit = loo[loo["key"] == key]
    if hit.empty:
        return {"loo_note": "no leave-one-out prediction"}
    pred, refit = float(hit["loo_predicted"].iloc[0]), float(hit["refit_predicted"].iloc[0])
    return {"loo_predicted": pred, "loo_error": pred / published - 1 if published else nan,
            "refit_predicted": refit, "loo_note": note}


def build_table(figs: dict[str, dict[str, str]], fit_rows: list[dict[str, Any]],
                profile: Profile, headline: dict[str, list[dict[str, Any]]] | None = None,
                headline_fit: dict[str, Any] | None = None,
                loo: pd.DataFrame | None = None) -> pd.DataFrame:
    """The published-vs-predicted table (TABLE_COLUMNS), one row per figure value.

    `figs`: published_figures.csv rows by id; `fit_rows`: rackSim.calibrate.fit.fit_table of
    `profile`; `headline`: headline_predictions (None: not simulated); `loo`:
    leave_one_out's table for the fitted calibration figures (None: not run)."""
    preds = _fit_rows(fit_rows) | (headline or {})
    fitted = fitted_ids(profile, headline_fit)
    dof = fit_dof(profile, [str(r["figure"]) for r in fit_rows if isinstance(r["error"], float)])
    dof |= headline_dof(headline_fit)
    rows = []
    for fid, fig in figs.items():
        status = classify(fid, fig, fitted, fid in preds)
        params, targets = dof.get(fid, (None, None))
        note = loo_note(dof.get(fid), len(preds.get(fid, [])))
        for p in preds.get(fid, [{"key": fid}]):
            row = {"id": fid, "key": p["key"], "quantity": fig["quantity"], "unit": fig["unit"],
                   "value": fig["value"], "status": status, "check": p.get("check", ""),
                   "fit_params": params, "fit_targets": targets,
                   "exactly_determined": None if params is None else params >= targets}
            for col in ("published", "predicted", "error", "seed_error_min",
                        "seed_error_max"):
                row[col] = p.get(col, math.nan)
            row.update(_loo_cells(fid, p["key"], status, row["published"], note, loo,
                                  headline_fit))
            rows.append(row)
    df = pd.DataFrame(rows).reindex(columns=TABLE_COLUMNS)
    df["loo_note"] = df["loo_note"].fillna("")
    return df


def _abs_stats(values: pd.Series, keys: pd.Series) -> dict[str, Any]:
    v = values.abs().dropna()
    if v.empty:
        return {"rows": 0}
    return {"rows": int(v.size), "median_abs": float(v.median()), "max_abs": float(v.max()),
            "worst": str(keys[v.idxmax()])}


def summary(table: pd.DataFrame, effects: pd.DataFrame | None, **meta: Any) -> dict[str, Any]:
    """The fidelity.json summary: errors by status, leave-one-out errors, effect agreement."""
    ids = table.drop_duplicates("id")
    out: dict[str, Any] = {"complete": True, **meta,
                           "figures_by_status": ids["status"].value_counts().to_dict()}
    for status in ("fitted", "predicted"):
        sel = table[table["status"] == status]
        out[f"{status}_error"] = _abs_stats(sel["error"], sel["key"])
    out["loo_error"] = _abs_stats(table["loo_error"], table["key"])
    seeded = table[table["seed_error_min"].notna()]
    out["error_over_seeds"] = {k: [float(lo), float(hi)] for k, lo, hi in zip(
        seeded["key"], seeded["seed_error_min"], seeded["seed_error_max"], strict=True)}
    drift = (table["refit_predicted"] / table["predicted"] - 1).abs().dropna()
    out["refit_drift_max"] = float(drift.max()) if len(drift) else None
    out["exactly_determined"] = sorted(set(table.loc[table["exactly_determined"].eq(True),
                                                     "id"]))
    if effects is not None:
        def names(verdict: str) -> list[str]:
            return list(effects.loc[effects["agrees"] == verdict, "effect"])

        sized = effects[effects["size_vs_published"].notna()]
        out["effects"] = {"rows": len(effects), "agree": names("yes"), "disagree": names("no"),
                          "within_noise": names("within noise"),
                          "noise": effect_noise(effects),
                          "size_vs_published": dict(zip(sized["effect"],
                                                        sized["size_vs_published"].astype(float),
                                                        strict=True)),
                          "failed": list(effects.loc[effects["error"] != "", "effect"])}
    return out


# -- command ---------------------------------------------------------------------------------
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="racksim-fidelity", description=__doc__.split("\n")[0])
    ap.add_argument("--window-s", type=positive_float, default=120.0,
                    help="measurement window of the default scenario's headline simulation, "
                         "s (default %(default)s; a converged headline fit's scenario runs its "
                         "fit's window)")
    ap.add_argument("--effects-window-s", type=positive_float, default=60.0,
                    help="measurement window of each effect run, s (default %(default)s)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default runs/fidelity/<timestamp>)")
    ap.add_argument("--jobs", type=positive_int, default=2, help="parallel processes (default 2)")
    ap.add_argument("--headline-seeds", type=count, default=2, metavar="K",
                    help="also simulate the headline scenario at its next K seeds, for the "
                         "range of H1-H3's errors over seeds (default %(default)s; 0: skip)")
    ap.add_argument("--no-loo", action="store_true", help="skip the leave-one-out refits")
    ap.add_argument("--no-effects", action="store_true", help="skip the effects table")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="Hydra override for every scenario run (repeatable), e.g. "
                         "experiment=smoke")
    return ap


def _check(args: argparse.Namespace) -> Path:
    """Check --out (the numbers are checked by their argparse types); returns the output
    directory (not created yet)."""
    out = args.out or Path("runs/fidelity") / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    reason = unwritable(out, "directory")
    if reason is not None:
        raise FidelityError(f"--out {out}: {reason}")
    return out


def _at_seed(args: argparse.Namespace, headline_fit: dict[str, Any] | None, seed: int
             ) -> RunConfig:
    """The headline scenario (the fitted one, or the default with the headline window) at
    `seed`, with --override."""
    if headline_fit is not None:
        return fitted_headline_scenario(headline_fit, [*args.override, f"seed={seed}"])
    return _default_scenario(args, f"seed={seed}")


def _default_scenario(args: argparse.Namespace, *extra: str) -> RunConfig:
    """The default scenario with --override, the headline window and `extra` overrides."""
    try:
        return compose_scenario([*args.override, f"workload.replay.window_s={args.window_s}",
                                 "progress=false", *extra])
    except ScenarioError as err:
        raise FidelityError(one_line(f"scenario: {err}")) from err


def _reference(args: argparse.Namespace) -> tuple[RunConfig, Profile]:
    """The default scenario (with --override and the headline window) and its profile."""
    cfg = _default_scenario(args)
    reference = operating_point().model.name
    if cfg.model.name != reference:
        raise FidelityError(f"model: the published figures are {reference}'s, so the report "
                            f"needs that model, not {cfg.model.name}; drop the model override")
    if cfg.perf.profile is None:
        raise FidelityError("perf.profile: the scenario has no calibration profile "
                            f"(perf.model={cfg.perf.model})")
    profile = Profile.load(cfg.perf.profile, "perf.profile")  # names the file and the fix
    profile.require_model(cfg.model.name)
    return cfg, profile


def fitted_headline_scenario(headline_fit: dict[str, Any], overrides: tuple[str, ...] | list[str]
                             ) -> RunConfig:
    """The fitted headline scenario simulated as its fit evaluated it (the record's window,
    warm-up requests per lane, drain and seed), with --override after them. A record without
    a drain was fitted without one (before 2026-12-07's refit)."""
    try:
        s = headline_fit["settings"]
        window, warmup, seed = (s["window_s"], s["warmup_requests_per_lane"], s["seed"])
        drain = s.get("drain_s", 0.0)
    except (KeyError, TypeError) as err:
        raise FidelityError(f"{HEADLINE_FIT}: no settings.{err} to simulate the fitted "
                            "scenario with; run racksim-calibrate workload again") from None
    try:
        return compose_scenario([*FITTED_SCENARIO, f"workload.replay.window_s={window}",
                                 f"workload.replay.warmup_requests_per_lane={warmup}",
                                 f"workload.replay.drain_s={drain}",
                                 f"seed={seed}", *overrides, "progress=false"])
    except ScenarioError as err:
        raise FidelityError(one_line(f"fitted scenario: {err}")) from err


def _fmt(v: Any, fmt: str = "{:.4g}", text: str = "") -> str:
    return text if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def format_table(table: pd.DataFrame, effects: pd.DataFrame | None) -> str:
    """The terminal view of both tables (abridged columns)."""
    t = pd.DataFrame({
        "figure": table["key"], "status": table["status"],
        "published": [_fmt(p, text=v[:18]) for p, v in zip(table["published"],
                                                          table["value"], strict=True)],
        "predicted": table["predicted"].map(_fmt),
        "error": [_fmt(e, "{:+.1%}", c) for e, c in zip(table["error"], table["check"],
                                                       strict=True)],
        "exact": table["exactly_determined"].map({True: "yes", False: "no"}).fillna(""),
        "LOO": table["loo_predicted"].map(_fmt), "LOO error": table["loo_error"].map(
            lambda e: _fmt(e, "{:+.1%}")),
        "over seeds": [_fmt(lo, "{:+.1%}") + (f" to {hi:+.1%}" if lo == lo else "")
                       for lo, hi in zip(table["seed_error_min"], table["seed_error_max"],
                                         strict=True)],
        "note": table["loo_note"]})
    parts = [t.to_string(index=False)]
    if effects is not None:
        e = pd.DataFrame({
            "effect": effects["effect"], "figure": effects["figure"],
            "tok/s/GPU": effects["throughput_ratio"].map(lambda r: _fmt(r, "{:.3f}")),
            "interactivity": effects["interactivity_ratio"].map(lambda r: _fmt(r, "{:.3f}")),
            "published": effects["published_ratio"].map(lambda r: _fmt(r, "{:.3f}")),
            "size": effects["size_vs_published"].map(lambda r: _fmt(r, "{:.1f}x")),
            "agrees": effects["agrees"],
            "error": effects["error"].str[:40]})
        parts += ["", "effects (variant / baseline ratios)", e.to_string(index=False)]
    return "\n".join(parts)


def run(args: argparse.Namespace, cfg: RunConfig, profile: Profile
        ) -> tuple[pd.DataFrame, pd.DataFrame | None, dict[str, Any]]:
    """Simulate the headline, refit leave-one-out, run the effects; returns both tables and
    the summary. Ctrl-C raises KeyboardInterrupt (an interrupted simulation too)."""
    timings: dict[str, float] = {}
    headline_fit = read_headline_fit(HEADLINE_FIT)
    figs = figures.read_figures()
    fit_rows = fit_table(profile)
    t0 = time.perf_counter()
    if headline_fit is None:
        hcfg = cfg
        _stage(f"the reference scenario, a {args.window_s:g}-s window")
    else:
        hcfg = fitted_headline_scenario(headline_fit, args.override)
        _stage(f"the fitted headline scenario, a {hcfg.workload.replay.window_s:g}-s window "
               "as its fit evaluated it")
    simulated = complete_summary(hcfg, progress=sys.stderr.isatty())
    timings["headline_s"] = time.perf_counter() - t0
    headline = headline_predictions(figs, simulated)
    seeds = [hcfg.seed + k for k in range(1, args.headline_seeds + 1)]
    if seeds:
        t0 = time.perf_counter()
        _stage(f"the same headline scenario at seeds {', '.join(map(str, seeds))}, over "
               f"{args.jobs} process(es)")
        runs = [_at_seed(args, headline_fit, s) for s in seeds]
        seed_spread(headline, [headline_predictions(figs, s) for s in parallel_map(
            (delayed(complete_summary)(c) for c in runs), len(runs), args.jobs,
            "headline seeds")])
        timings["headline_seeds_s"] = time.perf_counter() - t0
    loo = None
    if not args.no_loo:
        t0 = time.perf_counter()
        fitted = sorted({figure_id(str(r["figure"])) for r in fit_rows} & fitted_ids(profile))
        _stage(f"leave-one-out: {len(fitted) + 1} refits of the profile (without each of its "
               f"{len(fitted)} fitted figures, and with all) over {args.jobs} process(es)")
        loo = calibration_loo(profile, fitted, args.jobs)
        timings["loo_s"] = time.perf_counter() - t0
    effects = None
    if not args.no_effects:
        t0 = time.perf_counter()
        todo = default_effects(cfg)
        _stage(f"effects: {len(todo)} variant / baseline comparisons, simulated in "
               f"{args.effects_window_s:g}-s windows over {args.jobs} process(es)")
        effects = run_effects(todo, args.override, args.effects_window_s, args.jobs)
        timings["effects_s"] = time.perf_counter() - t0
    table = build_table(figs, fit_rows, profile, headline, headline_fit, loo)
    meta = {"scenario": simulated["scenario"], "layout": simulated["layout"],
            "num_gpus": simulated["num_gpus"], "overrides": list(args.override),
            "headline_scenario": layout_name(hcfg.deployment) + " | " + hcfg.workload.name,
            "window_s": hcfg.workload.replay.window_s, "headline_seeds": [hcfg.seed, *seeds],
            "effects_window_s": args.effects_window_s,
            "profile": str(cfg.perf.profile), "profile_created_at": profile.meta.get(
                "created_at"), "headline_fit": str(HEADLINE_FIT) if headline_fit else None,
            "timings_s": timings}
    return table, effects, summary(table, effects, **meta)


def _stage(what: str) -> None:
    """One line on stderr as a stage starts (the stages run for minutes; their progress
    bars show only on a terminal)."""
    print(f"racksim-fidelity: {what} ...", file=sys.stderr, flush=True)


def write(out: Path, table: pd.DataFrame, effects: pd.DataFrame | None,
          summ: dict[str, Any]) -> list[Path]:
    """fidelity.csv, effects.csv, fidelity.png, then fidelity.json (last: it marks a complete
    report)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "fidelity.csv"]
    table.to_csv(paths[0], index=False)
    if effects is not None:
        paths.append(out / "effects.csv")
        effects.to_csv(paths[-1], index=False)
    paths.append(plot_fidelity(table, effects, out / "fidelity.png"))
    paths.append(out / "fidelity.json")
    paths[-1].write_text(json.dumps(summ, indent=2, default=lambda v: v.item()) + "\n")
    return paths


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        out = _check(args)
        cfg, profile = _reference(args)
    except InputError as err:  # an option (FidelityError), the scenario or its profile
        print(f"racksim-fidelity: {err}", file=sys.stderr)
        return err.exit_code
    t0 = time.perf_counter()
    try:
        table, effects, summ = run(args, cfg, profile)
    except InputError as err:
        print(f"racksim-fidelity: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("racksim-fidelity: interrupted; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    summ["timings_s"]["total_s"] = time.perf_counter() - t0
    paths = write(out, table, effects, summ)
    print(format_table(table, effects))
    print("\n".join(["", *map(str, paths)]))
    return 0
