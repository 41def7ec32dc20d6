"""`racksim-calibrate workload`: fit the workload and layout to H1-H3 and write the fitted
reference scenario (rackSim.calibrate.workload_fit explains the fit).

Writes, only when the best layout's fit puts every target within the tolerance:
* `scenarios/workload/agentx_fitted.yaml` - the AgentX generator with the fitted medians and
  concurrency, each line marked `FITTED to H1-H3`;
* `scenarios/deployment/agentx_fitted.yaml` - the base deployment with the fitted layout;
* `calibration/headline_fit.yaml` - the record: priors, fitted values, simulated figures and
  errors, every alternative fit (identifiability) with its what-if, and leave-one-out.
A fit that does not converge says so, exits 3 and writes none of them; with `--write-best` it
writes its best point under other names (`agentx_headline_best`, `calibration/headline_best.yaml`),
every value marked NOT CONVERGED with the errors, never as the fitted reference.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from rackSim.calibrate.headline import (
    Headline,
    HeadlineError,
    Layout,
    calibrated_decode_step,
    depth_at_step,
    read_headline,
)
from rackSim.calibrate.scenario import CALIBRATION, DEFAULT_PROFILE, SCENARIOS
from rackSim.calibrate.workload_fit import (
    FREE_PARAMETERS,
    TARGET_KEYS,
    Evaluator,
    FitSettings,
    LayoutFit,
    WorkloadFit,
    layout_label,
    starting_points,
)
from rackSim.config.flags import above, output_file, positive_float, positive_int
from rackSim.perf.profile import Profile

EXIT_NOT_CONVERGED = 3
#: The router of the fitted layout: session affinity (a session stays on the prefill instance
#: that holds its prefix). The least-work `prefix_affinity` router is bistable at this load:
#: once its queues differ by more than a prompt it moves sessions, each move recomputes a whole
#: prefix, and the extra work keeps the queues long (docs/reference_scenario.md, measured).
ROUTER = "session_affinity"
BASE = ("workload=agentx", "deployment=agentx_p8_dep32", f"deployment.router={ROUTER}")
RECORD = CALIBRATION / "headline_fit.yaml"
WORKLOAD_YAML = SCENARIOS / "workload" / "agentx_fitted.yaml"
DEPLOYMENT_YAML = SCENARIOS / "deployment" / "agentx_fitted.yaml"
#: where --write-best puts the best point of a fit that did not converge
BEST_PATHS = (SCENARIOS / "workload" / "agentx_headline_best.yaml",
              SCENARIOS / "deployment" / "agentx_headline_best.yaml",
              CALIBRATION / "headline_best.yaml")
#: Alternative fits of the chosen layout with one parameter held away from its fitted value
#: (identifiability: do fits that meet H1-H3 as well predict the same what-if?): sessions
#: half as long as the prior's, and tool delays four times the prior's.
ALTERNATIVE_HOLDS = {"turns_median": (12.0,), "tool_delay_s_median": (6.0,)}


def parse_layouts(text: str, h: Headline) -> list[Layout]:
    """'16:12,32:16' -> DEP16 with 12 prefill instances, DEP32 with 16 (within H4)."""
    out = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+):(\d+)\s*", item)
        if m is None:
            raise ValueError(f"--layouts: '{item}' is not DECODE_GPUS:PREFILL_INSTANCES")
        lay = Layout(int(m.group(2)), h.prefill_gpus_per_instance, int(m.group(1)))
        if not h.gpus_min <= lay.gpus <= h.gpus_max:
            raise ValueError(f"--layouts: {layout_label(lay)} has {lay.gpus} GPUs, outside "
                             f"H4's {h.gpus_min}-{h.gpus_max}")
        out.append(lay)
    return out


def whatif_layout(lay: Layout) -> Layout:
    """The what-if of a fit: the other published decode width at the same prefill."""
    return Layout(lay.prefill_instances, lay.prefill_gpus_per_instance,
                  32 if lay.decode_gpus == 16 else 16)


def add_whatif(fit: LayoutFit, evaluate: Evaluator) -> None:
    other = whatif_layout(fit.layout)
    out = evaluate([(fit.params, other)])[0]
    fit.whatif = {"layout": layout_label(other),
                  "throughput_tok_s_gpu": out["throughput_tok_s_gpu"],
                  "interactivity_tok_s": out["interactivity_tok_s"],
                  "throughput_ratio": out["throughput_tok_s_gpu"]
                  / fit.figures["throughput_tok_s_gpu"],
                  "interactivity_ratio": out["interactivity_tok_s"]
                  / fit.figures["interactivity_tok_s"]}


def at_edge(fit: LayoutFit, margin: float = 0.05) -> list[str]:
    """Fitted parameters the fit moved to within `margin` (in log) of an end of their
    plausible range (a prior that is itself a range end, such as re-sending the whole
    response, is not flagged while the fit leaves it there)."""
    out = []
    for p in FREE_PARAMETERS:
        v = fit.params.get(p.name)
        if p.name in fit.fitted_names and v is not None and abs(math.log(v / p.prior)) > 0.01 \
                and (math.log(v / p.low) < margin or math.log(p.high / v) < margin):
            out.append(f"{p.name}={v:.4g} (range {p.low:g}-{p.high:g} {p.unit})")
    return out


def fit_summary(fit: LayoutFit) -> dict[str, Any]:
    return {"layout": layout_label(fit.layout), "gpus": fit.layout.gpus,
            "at_edge_of_plausible_range": at_edge(fit),
            "converged": fit.converged, "objective": round(fit.cost, 4),
            "fitted": sorted(fit.fitted_names), "targets": list(fit.targets),
            "params": {k: _round(v) for k, v in fit.params.items()},
            "posterior_log_sd": {k: _round(v) for k, v in fit.posterior_sd.items()},
            "errors": {k: round(v, 4) for k, v in fit.errors.items()},
            "figures": {k: _round(v) for k, v in fit.figures.items()},
            "whatif": {k: _round(v) if isinstance(v, float) else v
                       for k, v in fit.whatif.items()}}


def _round(v: float) -> float:
    return float(f"{v:.5g}") if math.isfinite(v) else v


def _mark(best: LayoutFit) -> str:
    """How a written value came about: FITTED, or the best point of a fit that missed."""
    if best.converged:
        return "FITTED to H1-H3"
    errs = ", ".join(f"{k} {v:+.0%}" for k, v in best.errors.items())
    return f"BEST COMPROMISE, NOT CONVERGED ({errs})"


def write_workload(best: LayoutFit, base_spec: dict[str, Any], path: Path, stamp: str,
                   record: Path = RECORD, drain_s: float = FitSettings.drain_s) -> None:
    """The fitted AgentX workload YAML, each fitted line marked (see `_mark`). Its replay
    drains for the fit's `drain_s` (s): a window's requests in flight at its end finish and
    count, as in the fit; without it a short window loses their output (docs/
    reference_scenario.md)."""
    mark = _mark(best)
    lines = [
        f"# AgentX-style workload: {mark} for the published headline H1-H3 ({stamp},",
        f"# racksim-calibrate workload; record with priors and errors: {record.name} in",
        "# calibration/). The assumed workload it started from stays available as",
        "# `workload=agentx`. Marked lines were fitted (MAP: the assumed defaults are the priors);",
        "# every other generator value is the assumed default of rackSim.workload.agentx (see",
        "# docs/reference_scenario.md).",
        f"name: {path.stem}", "source: agentx", "num_sessions: 393", "agentx:"]
    for p in FREE_PARAMETERS:
        if not p.path.startswith("workload.agentx.") or p.name not in best.params:
            continue
        key = p.path.split(".")[-1]
        how = (f"{mark} ({p.dist_field or 'value'}; prior {p.prior:g} {p.unit})"
               if p.name in best.fitted_names else
               f"ASSUMED: held at this value in the fit (prior {p.prior:g} {p.unit})")
        if p.dist_field is None:
            lines.append(f"  {key}: {_round(best.params[p.name])}  # {how}")
            continue
        dist = dict(base_spec[key])
        dist[p.dist_field] = _round(best.params[p.name])
        body = ", ".join(f"{k}: {v}" for k, v in dist.items() if v is not None)
        lines.append(f"  {key}: {{{body}}}  # {how}")
    conc = int(round(best.params["concurrency"]))
    lines += ["replay:",
              f"  concurrency: {conc}  # {mark} (live agent clients; not public)",
              "  start: steady", "  primer: true", "  warmup_requests_per_lane: 10   # AgentX",
              "  window_s: 3600                 # AgentX: one-hour window",
              f"  drain_s: {drain_s:g}                   # the fit's: the window's requests in "
              "flight finish and count", ""]
    path.write_text("\n".join(lines))


def _set_in_section(text: str, section: str, key: str, value: str) -> str:
    """Replace the value of the first two-space-indented `key:` inside the top-level
    `section:` block of a YAML text, keeping every other line (comments included)."""
    lines = text.splitlines(keepends=True)
    inside = False
    for i, line in enumerate(lines):
        if line.startswith("#"):
            continue
        if not line.startswith((" ", "\n")):
            inside = line.rstrip() == f"{section}:"
        elif inside and line.startswith(f"  {key}:"):
            lines[i] = f"  {key}: {value}\n"
            return "".join(lines)
    raise ValueError(f"no '{key}' under '{section}:' in the base deployment")


def write_deployment(best: LayoutFit, base_path: Path, path: Path, stamp: str) -> None:
    """The base deployment YAML with the fitted layout (instances, decode width), named after
    `path` as a scenario option is."""
    text = base_path.read_text()
    lay = best.layout
    mark = _mark(best)
    header = (f"# The AgentX layout within H4: {mark} ({stamp},\n# racksim-calibrate "
              "workload; record in calibration/). Everything else as in "
              f"{base_path.name}.\n")
    text = re.sub(r"(?m)^name: .*$", f"name: {path.stem}", text)
    text = re.sub(r"(?m)^router: .*$", f"router: {ROUTER}   # ASSUMED: see "
                  "docs/reference_scenario.md (least work is bistable here)", text)
    text = _set_in_section(text, "prefill", "instances",
                           f"{lay.prefill_instances}   # {mark} (within H4)")
    text = _set_in_section(text, "decode", "gpus", f"{lay.decode_gpus}   # {mark} (H4: 16 or 32)")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    path.write_text(header + body.lstrip("\n") + "\n")


def parse_holds(items: list[str]) -> dict[str, float]:
    """'turns_median=60' -> {'turns_median': 60.0}; names must be free parameters."""
    names = {p.name: p for p in FREE_PARAMETERS}
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in names:
            raise ValueError(f"--hold: '{name}' is not a free parameter ({', '.join(names)})")
        try:
            v = float(value)
        except ValueError:
            raise ValueError(f"--hold {name}: '{value}' is not a number") from None
        p = names[name]
        if not p.low <= v <= p.high:
            raise ValueError(f"--hold {name}={v:g}: outside its plausible range "
                             f"{p.low:g}-{p.high:g} {p.unit}")
        out[name] = v
    return out


def run_fit(h: Headline, layouts: list[Layout], evaluate: Evaluator,
            depth: Callable[[int], float], log: Callable[[str], None],
            alternatives: bool = True, loo: bool = True,
            held: dict[str, float] | None = None) -> dict[str, Any]:
    """Fit every layout (with `held` parameters fixed), pick the best, add alternatives,
    what-ifs and leave-one-out."""
    held = dict(held or {})
    wf = WorkloadFit(h, evaluate, fixed=held)
    fits = []
    for lay in layouts:
        log(f"fitting {layout_label(lay)} ({lay.gpus} GPUs)")
        start = wf.best_start(lay, starting_points(h, lay, depth(lay.decode_gpus)))
        log("  start: " + " ".join(f"{k}={v:.4g}" for k, v in start.items()))
        fits.append(wf.fit(lay, start, log=log))
    best = min(fits, key=lambda f: (not f.converged, f.cost))
    record: dict[str, Any] = {"best": best, "layouts": fits, "alternatives": [], "loo": {}}
    for f in fits:
        add_whatif(f, evaluate)
    if not best.converged:
        return record
    if alternatives:
        for name, ends in ALTERNATIVE_HOLDS.items():
            for value in ends:
                log(f"alternative: {name} held at {value:g}")
                alt = WorkloadFit(h, evaluate, fixed={**held, name: value}).fit(
                    best.layout, best.params, log=log,
                    max_evaluations=evaluate.settings.refit_evaluations)
                add_whatif(alt, evaluate)
                record["alternatives"].append((name, value, alt))
    if loo:
        for t in ("H1", "H2", "H3"):
            log(f"leave-one-out: refit without {t}")
            rest = tuple(x for x in ("H1", "H2", "H3") if x != t)
            f = wf.fit(best.layout, best.params, targets=rest, log=log,
                       max_evaluations=evaluate.settings.refit_evaluations)
            pred = f.figures[TARGET_KEYS[t]]
            record["loo"][t] = {"predicted": _round(pred),
                                "error": round(pred / wf.published(t) - 1.0, 4),
                                "note": f"refit to {'+'.join(rest)} with the priors, "
                                        f"{layout_label(best.layout)}"}
    return record


def record_yaml(record: dict[str, Any], h: Headline, settings: FitSettings,
                base: list[str], evaluations: int, stamp: str) -> dict[str, Any]:
    best: LayoutFit = record["best"]
    alts = record["alternatives"]
    ratios = [f.whatif["throughput_ratio"] for f in [best] + [a for _, _, a in alts]
              if f.whatif]
    return {
        "created_at": stamp, "created_by": "racksim-calibrate workload",
        "fitted_to": ["H1", "H2", "H3"],
        "published": {"H1": h.throughput_tok_s_gpu, "H2": h.interactivity_tok_s_user,
                      "H3": h.revenue_usd_gpu_h},
        "base_scenario": base,
        "settings": {"window_s": settings.window_s, "target_sigma": settings.target_sigma,
                     "warmup_requests_per_lane": settings.warmup_requests_per_lane,
                     "drain_s": settings.drain_s,
                     "seed": settings.seed, "tolerance": settings.tolerance},
        "simulations": evaluations,
        "held": {name: value for name, value in record["best"].params.items()
                 if name not in record["best"].fitted_names},
        "priors": {p.name: {"prior": p.prior, "log_sd": p.prior_width, "range": [p.low, p.high],
                            "unit": p.unit, "path": p.path, "why": p.why}
                   for p in FREE_PARAMETERS},
        "best": fit_summary(best),
        "layouts": [fit_summary(f) for f in record["layouts"]],
        "alternatives": [{"held": {name: value}, **fit_summary(a)} for name, value, a in alts],
        "whatif_throughput_ratio_range": [_round(min(ratios)), _round(max(ratios))]
        if ratios else None,
        "loo": record["loo"],
    }


def _reference_figures(window_s: float, overrides: tuple[str, ...] = ()) -> dict[str, float]:
    """H1-H3 of the default (reference) scenario, with `overrides`, over `window_s`."""
    from rackSim.config import compose_scenario
    from rackSim.run import simulate

    cfg = compose_scenario(["progress=false", *overrides,
                            f"workload.replay.window_s={window_s}"])
    s = simulate(cfg, progress=False).summary
    return {t: float(s[k]) for t, k in TARGET_KEYS.items()} | {
        "requests_sent": float(s["requests_sent"])}


def check_window(short_s: float, long_s: float, jobs: int, overrides: tuple[str, ...] = (),
                 fit: FitSettings | None = None) -> dict[str, Any]:
    """The reference scenario over a short window (with the warm-up and drain of `fit`, as
    the fit runs it; as configured without) and over a long one as configured: each one's
    H1-H3 and the short window's relative difference from the long one."""
    from joblib import Parallel, delayed

    warm = () if fit is None else (
        f"workload.replay.warmup_requests_per_lane={fit.warmup_requests_per_lane}",
        f"workload.replay.drain_s={fit.drain_s}")
    short, long = Parallel(n_jobs=min(jobs, 2))(
        delayed(_reference_figures)(w, o) for w, o in ((short_s, overrides + warm),
                                                       (long_s, overrides)))
    return {"short_window_s": short_s,
            "short_warmup_requests_per_lane": None if fit is None
            else fit.warmup_requests_per_lane,
            "short_drain_s": None if fit is None else fit.drain_s,
            "long_window_s": long_s,
            "short": {k: _round(v) for k, v in short.items()},
            "long": {k: _round(v) for k, v in long.items()},
            "short_vs_long": {t: round(short[t] / long[t] - 1.0, 4) for t in TARGET_KEYS}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="racksim-calibrate workload", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default="32:12",
                    help="candidate layouts DECODE_GPUS:PREFILL_INSTANCES (default: %(default)s)")
    ap.add_argument("--window-s", type=positive_float, default=15.0,
                    help="simulated window per evaluation (default: %(default)s)")
    ap.add_argument("--jobs", type=positive_int, default=2,
                    help="parallel simulations (default: 2)")
    ap.add_argument("--max-iterations", type=above(int, 2, equal=True), default=6,
                    help="least-squares evaluations per layout fit, at least 2: a start and "
                         "one step (default: %(default)s)")
    ap.add_argument("--refit-iterations", type=above(int, 2, equal=True), default=3,
                    help="evaluations per alternative or leave-one-out refit, which start from "
                         "the fitted point; at least 2 (default: %(default)s)")
    ap.add_argument("--context", type=positive_int, default=32768,
                    help="context per request for the starting decode depth (default: 32768)")
    ap.add_argument("--cache", type=output_file,
                    default=Path("runs/workload_fit/evaluations.jsonl"),
                    help="simulated points, reused by later fits (default: %(default)s)")
    ap.add_argument("--hold", action="append", default=[], metavar="NAME=VALUE",
                    help="hold a free parameter at a value instead of fitting it (repeatable)")
    ap.add_argument("--no-alternatives", action="store_true", help="skip identifiability")
    ap.add_argument("--no-loo", action="store_true", help="skip leave-one-out")
    ap.add_argument("--dry-run", action="store_true", help="fit and print, write nothing")
    ap.add_argument("--write-best", action="store_true",
                    help="when the fit does not converge, write its best point as "
                         "agentx_headline_best scenarios marked NOT CONVERGED (never as the "
                         "fitted reference); the exit code stays 3")
    ap.add_argument("--check-window", type=positive_float, nargs=2,
                    metavar=("SHORT_S", "LONG_S"),
                    help="do not fit: simulate the reference scenario over a short window "
                         "with the fit's warm-up and over a long one as configured, and record "
                         f"how far the short one is from the long one in {RECORD.name}")
    args = ap.parse_args(argv)
    prog = "racksim-calibrate workload"
    if args.check_window:
        if args.check_window[0] >= args.check_window[1]:
            ap.error("argument --check-window: SHORT_S {:g} must be below LONG_S {:g}".format(
                *args.check_window))
        if not RECORD.is_file():
            print(f"{prog}: {RECORD} does not exist: fit first", file=sys.stderr)
            return 2
        check = check_window(*args.check_window, args.jobs, fit=FitSettings())
        rec = yaml.safe_load(RECORD.read_text())
        rec["window_check"] = check
        RECORD.write_text(yaml.safe_dump(rec, sort_keys=False, width=100))
        print(yaml.safe_dump(check, sort_keys=False))
        return 0
    try:
        h = read_headline()
        layouts = parse_layouts(args.layouts, h)
        held = parse_holds(args.hold)
    except (HeadlineError, ValueError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    settings = FitSettings(window_s=args.window_s, jobs=args.jobs,
                           max_evaluations=args.max_iterations,
                           refit_evaluations=args.refit_iterations)
    args.cache.parent.mkdir(parents=True, exist_ok=True)
    evaluate = Evaluator(BASE, settings, args.cache)
    depths: dict[int, float] = {}
    profile = Profile.load(DEFAULT_PROFILE)

    def depth(n: int) -> float:
        if n not in depths:
            depths[n] = depth_at_step(calibrated_decode_step(profile, n, args.context),
                                      h.p90_step_ms)
        return depths[n]

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    try:
        record = run_fit(h, layouts, evaluate, depth, log, not args.no_alternatives,
                         not args.no_loo, held)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing written (simulated points kept in {args.cache})",
              file=sys.stderr)
        return 130
    best: LayoutFit = record["best"]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = record_yaml(record, h, settings, list(BASE), evaluate.simulations, stamp)
    print(yaml.safe_dump(out, sort_keys=False, width=100))
    paths = (WORKLOAD_YAML, DEPLOYMENT_YAML, RECORD)
    if not best.converged:
        errs = ", ".join(f"{k} {v:+.1%}" for k, v in best.errors.items())
        print(f"{prog}: the fit did not converge (best {layout_label(best.layout)}: {errs}; "
              f"tolerance {settings.tolerance:.0%}); nothing written as fitted", file=sys.stderr)
        if not args.write_best or args.dry_run:
            return EXIT_NOT_CONVERGED
        paths = BEST_PATHS
    elif args.dry_run:
        return 0
    from rackSim.config import compose_scenario
    from rackSim.workload.agentx import AgentXSpec

    base_cfg = compose_scenario(list(BASE))
    spec = (base_cfg.workload.agentx or AgentXSpec()).model_dump(mode="json")
    write_workload(best, spec, paths[0], stamp, paths[2], settings.drain_s)
    write_deployment(best, SCENARIOS / "deployment" / "agentx_p8_dep32.yaml", paths[1], stamp)
    paths[2].write_text(yaml.safe_dump(out, sort_keys=False, width=100))
    print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0 if best.converged else EXIT_NOT_CONVERGED
