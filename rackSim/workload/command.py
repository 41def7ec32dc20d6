"""`racksim-workload`: describe a workload (generator spec, JSONL file or trace).

Prints a short table, writes `summary.json`, `requests.csv` and `workload.png` to `--out`,
and can save the session graphs as JSONL. `racksim-workload import LOGS --out pool.jsonl`
turns agent session logs into an anonymised session-graph pool, `racksim-workload fit
pool.jsonl` fits the AgentX generator to a pool (docs/agent_logs.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import pandas as pd
import yaml
from pydantic import ValidationError

from rackSim.config.errors import (
    InputError,
    PoolInputError,
    TraceInputError,
    WorkloadFileError,
    read_yaml_mapping,
)
from rackSim.config.flags import (
    count,
    nonnegative_float,
    output_dir,
    output_file,
    positive_float,
    positive_int,
)
from rackSim.config.loading import describe_fields
from rackSim.workload.agentx import AgentXSpec
from rackSim.workload.graph import SessionGraph
from rackSim.workload.jsonl import save_jsonl
from rackSim.workload.sources import load_graphs
from rackSim.workload.stats import NominalTiming, WorkloadStats, describe


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="racksim-workload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--agentx", nargs="?", const="", metavar="SPEC.yaml",
                     help="AgentX-style generator (defaults, or an AgentXSpec YAML)")
    src.add_argument("--scenario", metavar="WORKLOAD.yaml",
                     help="a workload scenario: a scenarios/workload/*.yaml file or its name "
                          "(source agentx, synthetic, jsonl, mooncake or azure)")
    src.add_argument("--jsonl", metavar="FILE", help="a racksim-workload JSONL file")
    src.add_argument("--mooncake", metavar="FILE", help="a Mooncake trace (JSONL)")
    src.add_argument("--azure", metavar="FILE", help="an Azure LLM-inference trace (CSV)")
    p.add_argument("--sessions", type=positive_int,
                   help="sessions to generate (generators; default: the AgentX spec's own, "
                        "or the scenario's num_sessions)")
    p.add_argument("--seed", type=count, default=0, help="generator / jitter seed (default 0)")
    p.add_argument("--jitter-s", type=nonnegative_float,
                   help="Mooncake arrival jitter (default: auto)")
    p.add_argument("--speedup", type=positive_float, default=1.0,
                   help="trace time compression (default 1.0)")
    p.add_argument("--concurrency", type=positive_int,
                   help="closed-loop lanes (default: every session starts at t=0)")
    p.add_argument("--ttft-s", type=nonnegative_float, default=1.0,
                   help="nominal time to first token (s; default 1.0)")
    p.add_argument("--tpot-s", type=nonnegative_float, default=0.005,
                   help="nominal time per output token (s; default 0.005)")
    p.add_argument("--cache-tokens", type=positive_float, nargs="*",
                   default=[float(1 << 20)],
                   help="finite LRU prefix-cache capacities (tokens; default 1048576)")
    p.add_argument("--out", type=output_dir, help="directory for summary.json, requests.csv, PNG "
                   "(default: print the table only)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--save-jsonl", type=output_file, metavar="FILE",
                   help="save the graphs as JSONL")
    p.add_argument("--with-hashes", action="store_true",
                   help="write each prompt's block hashes into the saved JSONL")
    return p


#: the file flags of the trace and pool sources, each with its input class
FILE_SOURCES = {"jsonl": PoolInputError, "mooncake": TraceInputError,
                "azure": TraceInputError}


def load_source(args: argparse.Namespace) -> tuple[list[SessionGraph], str]:
    """The session graphs the arguments name, and a label for them; an `InputError` of the
    source's class names the flag, the file and the fix."""
    if args.agentx is not None:
        raw = read_yaml_mapping(args.agentx, "--agentx", WorkloadFileError,
                                "AgentXSpec fields (docs/workload.md)") if args.agentx else {}
        try:
            spec = AgentXSpec.model_validate(raw)
        except ValidationError as err:
            raise WorkloadFileError(f"--agentx {args.agentx}: invalid AgentX spec:\n"
                                    + "\n".join(describe_fields(err))) from None
        return load_graphs("agentx", seed=args.seed, num_sessions=args.sessions,
                           agentx=spec), f"agentx seed={args.seed}"
    if args.scenario:
        return _scenario(args.scenario, args)
    for source, error in FILE_SOURCES.items():
        path = getattr(args, source)
        if path:
            if not Path(path).is_file():
                what = "a directory" if Path(path).is_dir() else "no such file"
                raise error(f"--{source} {path}: {what}; give the {source} file's path")
            return load_graphs(source, seed=args.seed, path=path, jitter_s=args.jitter_s), path
    raise AssertionError("argparse requires one source")


def workload_scenario_path(name: str, flag: str) -> Path:
    """The file of a workload scenario given as a WorkloadSpec YAML path (as given, or
    relative to the project root) or as the name of one in scenarios/workload/; a
    WorkloadFileError naming `flag` and the names there otherwise."""
    from rackSim.config import SCENARIOS_DIR, scenario_options
    from rackSim.config.specs import resolve_path

    path = resolve_path(Path(name))
    if path is not None:
        return path
    known = scenario_options("workload")
    if name not in known:
        raise WorkloadFileError(f"{flag} {name}: no such file or workload scenario; "
                                f"give a WorkloadSpec YAML or one of {known}")
    return SCENARIOS_DIR / "workload" / f"{name}.yaml"


def _scenario(name: str, args: argparse.Namespace) -> tuple[list[SessionGraph], str]:
    """A workload scenario (`workload_scenario_path`), validated as `racksim` validates
    it."""
    from rackSim.config.loading import load_workload_file

    path = workload_scenario_path(name, "--scenario")
    # what is described is the source: a file without a name or a replay section is too
    w = load_workload_file(path, {"name": path.stem,
                                  "replay": {"concurrency": 1, "window_s": 1.0}})
    graphs = load_graphs(w.source, seed=args.seed, num_sessions=args.sessions or w.num_sessions,
                         path=w.path, agentx=w.agentx, synthetic=w.synthetic,
                         jitter_s=args.jitter_s)
    return graphs, f"{path} ({w.source})"


def print_table(stats: WorkloadStats) -> None:
    s = stats.summary
    rows = [("source", s["source"]), ("sessions", s["sessions"]), ("requests", s["requests"]),
            ("prompt tokens (mean / p50 / p99)",
             f"{s['prompt_tokens_mean']:,.0f} / {s['prompt_tokens_p50']:,.0f} / "
             f"{s['prompt_tokens_p99']:,.0f}"),
            ("output tokens (mean)", f"{s['output_tokens_mean']:,.1f}"),
            ("tokens: prompt / new / prefix / output",
             f"{s['prompt_tokens']:,} / {s['new_tokens']:,} / {s['prefix_tokens']:,} / "
             f"{s['output_tokens']:,}"),
            ("prefix reuse, infinite cache", f"{s['reuse_inf']:.1%}"),
            ("token mix at infinite cache: cached / uncached / output",
             f"{s['mix_cached_inf']:.2%} / {s['mix_uncached_inf']:.2%} / {s['mix_output']:.2%}"),
            ("main-agent turns per session (mean / p50)",
             f"{s['turns_per_session_mean']:.1f} / {s['turns_per_session_p50']:.0f}"),
            ("first / peak prompt per session (p50)",
             f"{s['first_prompt_tokens_p50']:,.0f} / {s['peak_prompt_tokens_p50']:,.0f}"),
            ("context growth per turn (mean / p50)",
             f"{_value(s['context_growth_tokens_per_turn_mean'], ',.0f')} / "
             f"{_value(s['context_growth_tokens_per_turn_p50'], ',.0f')}"),
            ("delay before a request, s (mean / p50 / p90)",
             " / ".join(_value(s[f"delay_s_{q}"], ".2f") for q in ("mean", "p50", "p90")))]
    rows += [(f"prefix reuse, LRU {k.removeprefix('reuse_lru_')} tokens", f"{v:.1%}")
             for k, v in s.items() if k.startswith("reuse_lru_")]
    rows += [("sessions with subagents", s["sessions_with_subagents"]),
             ("forks per session (mean), subagents per fork (mean)",
              f"{s['forks_per_session_mean']:.2f}, {s['subagents_per_fork_mean']:.2f}"),
             ("subagents per session (mean / max)",
              f"{s['subagents_per_session_mean']:.2f} / {s['subagents_per_session_max']}"),
             ("in-flight requests (mean / peak)",
              f"{s['inflight_mean']:.1f} / {s['inflight_peak']}"),
             ("span (nominal s)", f"{s['duration_s']:,.0f}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def _value(v: float, fmt: str) -> str:
    """`v` formatted, or 'n/a' where the workload has none (one-request sessions have no
    later turns, so no growth and no delay)."""
    return "n/a" if math.isnan(v) else format(v, fmt)


def _import_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="racksim-workload import",
                                description="agent session logs -> anonymised session-graph "
                                            "JSONL (docs/agent_logs.md)")
    p.add_argument("logs", type=Path, help="a log file or a directory of them")
    p.add_argument("--out", type=output_file, required=True, help="the pool to write (JSONL)")
    p.add_argument("--format", choices=("auto", "claude-code", "openai"), default="auto",
                   help="log layout (default: detected from the first entry)")
    p.add_argument("--strict", action="store_true",
                   help="refuse the whole pool on any bad session (default: skip and count)")
    return p


def import_main(argv: list[str]) -> int:
    """`racksim-workload import`: exit 0, or the agent-log input class's code (7) with the
    issues on stderr (nothing written)."""
    from rackSim.config.errors import AgentLogInputError
    from rackSim.workload.agent_logs import LogImportError, detect_format, import_sessions
    from rackSim.workload.claude_code_logs import read_claude_code
    from rackSim.workload.openai_logs import read_openai

    args = _import_parser().parse_args(argv)
    if not args.logs.exists():
        print(f"racksim-workload import: LOGS: no such file or directory {args.logs}",
              file=sys.stderr)
        return AgentLogInputError.exit_code
    readers = {"claude-code": (read_claude_code, "claude-code transcripts"),
               "openai": (read_openai, "openai request logs")}
    try:
        fmt = detect_format(args.logs) if args.format == "auto" else args.format
        reader, source = readers[fmt]
        graphs, report = import_sessions(reader(args.logs), source, strict=args.strict)
    except LogImportError as err:
        print(f"racksim-workload import: {err}", file=sys.stderr)
        return err.exit_code
    for issue in report.skipped:
        print(f"warning: skipped session: {issue}", file=sys.stderr)
    print("\n".join(report.lines()))
    partial = args.out.with_name(args.out.name + ".partial")
    save_jsonl(graphs, partial, meta=report.meta())
    os.replace(partial, args.out)
    print(f"wrote {args.out}: {len(graphs)} sessions, {report.calls} requests")
    return 0


def _fit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="racksim-workload fit",
                                description="maximum-likelihood AgentX parameters of a pool, "
                                            "a workload YAML and a goodness-of-fit report")
    p.add_argument("pool", type=Path, help="a racksim-workload JSONL pool")
    p.add_argument("--out", type=output_dir, help="report directory (default: POOL_fit/ beside it)")
    p.add_argument("--yaml", type=output_file,
                   help="the fitted workload YAML (default: OUT/fitted_<pool>.yaml)")
    p.add_argument("--base", default="agentx",
                   help="workload scenario (a scenarios/workload/ name or a WorkloadSpec YAML) "
                        "whose agentx values stand where the pool cannot fit them and whose "
                        "replay policy is kept (default: agentx)")
    p.add_argument("--confidence", type=float, default=0.95, help="CI level (default 0.95)")
    p.add_argument("--seed", type=count, default=0, help="seed of the comparison sessions")
    p.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    return p


def fit_main(argv: list[str]) -> int:
    """`racksim-workload fit`: exit 0, or the bad input class's code with the reason on
    stderr (flags 2, base workload YAML 4, pool 5)."""
    from rackSim.config.errors import ScenarioError
    from rackSim.workload import fit_report as rep
    from rackSim.workload.generator_fit import fit_generator
    from rackSim.workload.jsonl import load_jsonl

    args = _fit_parser().parse_args(argv)
    try:
        if not 0 < args.confidence < 1:
            raise ScenarioError(f"--confidence {args.confidence}: pick a level in (0, 1)")
        try:
            graphs = load_jsonl(args.pool)
        except OSError as err:
            raise PoolInputError(f"POOL: cannot read {args.pool} ({err.strerror})") from err
        base_path = workload_scenario_path(args.base, "--base")
        try:
            w = yaml.safe_load(base_path.read_text()) or {}
            base = AgentXSpec.model_validate(w.get("agentx") or {})
        except (yaml.YAMLError, ValueError, AttributeError) as err:
            raise WorkloadFileError(f"--base {base_path}: not a workload scenario with a "
                                    f"valid agentx section ({err})") from err
        try:
            fit = fit_generator(graphs, base, args.confidence)
        except ValueError as err:
            raise PoolInputError(f"{args.pool}: {err}") from err
    except InputError as err:
        print(f"racksim-workload fit: {err}", file=sys.stderr)
        return err.exit_code
    out = args.out or args.pool.with_name(args.pool.stem + "_fit")
    out.mkdir(parents=True, exist_ok=True)
    params = pd.DataFrame([vars(p) for p in fit.params])
    params.to_csv(out / "fit_params.csv", index=False)
    generated = rep.generated_pool(fit, args.seed)
    gof = rep.goodness_of_fit(fit, generated, base)
    gof.to_csv(out / "goodness_of_fit.csv", index=False)
    reuse, growth = rep.curves(graphs, generated)
    reuse.to_csv(out / "reuse_curve.csv", index=False)
    growth.to_csv(out / "context_growth.csv", index=False)
    if not args.no_plot:
        rep.plot_qq(fit, generated, base, gof, out / "qq.png")
        rep.plot_curves(reuse, growth, out / "curves.png")
    # the fitted workload last: a fit interrupted before it is complete leaves none
    path = args.yaml or out / f"fitted_{args.pool.stem}.yaml"
    rep.write_workload_yaml(fit, args.pool.name, w.get("replay") or {}, path, args.confidence)
    with pd.option_context("display.width", 120, "display.float_format", "{:.4g}".format):
        print(params.to_string(index=False))
        print(gof.to_string(index=False))
    for q, why in fit.held.items():
        print(f"not fitted, base value kept: {q} ({why})")
    print(f"wrote {path} and the report in {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["import"]:
        return import_main(argv[1:])
    if argv[:1] == ["fit"]:
        return fit_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        graphs, label = load_source(args)
    except InputError as err:  # a pool or trace that cannot be read: its class's exit code
        print(f"racksim-workload: {err}", file=sys.stderr)
        return err.exit_code
    except (OSError, ValueError) as err:  # a workload YAML or AgentX spec
        print(f"racksim-workload: {err}", file=sys.stderr)
        return WorkloadFileError.exit_code
    timing = NominalTiming(args.ttft_s, args.tpot_s, args.concurrency, args.speedup)
    stats = describe(graphs, timing, args.cache_tokens, source=label)
    print_table(stats)
    if args.save_jsonl:
        save_jsonl(graphs, args.save_jsonl, meta={"source": label}, with_hashes=args.with_hashes)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(json.dumps(stats.summary, indent=2) + "\n")
        stats.requests.to_csv(args.out / "requests.csv", index=False)
        if not args.no_plot:
            from rackSim.workload.plot import plot_workload
            plot_workload(stats, args.out / "workload.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
