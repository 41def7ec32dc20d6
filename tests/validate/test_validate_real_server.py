"""Against a real vLLM server: records, scrapes and iteration log agree with each other, and a
profile fitted at one concurrency predicts another.

Stated tolerances (errors are (predicted - measured) / measured):
- counters: the server's own /metrics counters and iteration log equal the driver's records
  exactly (tokens are integers; nothing is lost or double counted);
- a profile fitted at concurrency 6 predicts concurrency 2: throughput within 50 % from the
  iteration-log profile and from the black-box profile (records only, overheads refined by
  simulating the fitting run); the iteration-log ITL P50, the iteration-log TTFT P50 and the
  black-box ITL P50 within a factor of 2.5: they move with the server's speed, which changes
  from run to run on this machine (docs/validate.md: a profile fitted on one run prices a
  decode request at 0.35 ms, on the next at 0.57 ms; sixteen replays of one server spread
  1.53x in speed, 1.7x on a slow morning, against a model error of up to 45 % at a run's own
  speed, test_validate_grid_real: 1.7 x 1.45 = 2.5). On the CI machine the iteration-log ITL
  P50 once came out at +51 % (measured 6.7 ms at concurrency 2 against a predicted 10.2 ms),
  outside the 50 % this test first asserted, and once at -54 % (a clean-clone run, passing on
  a rerun), outside the factor of 2 it asserted next. The black-box TTFT P50 is reported, not
  asserted: from records at one concurrency a fit cannot tell prefill time
  from queueing.
  Measured in five runs: iteration log ITL P50 -3..+15 %, throughput -8..+5 %, TTFT P50
  -28..+45 %; black box throughput -18..-1 %, ITL P50 -12..+62 %, TTFT P50 -11..+172 %.
  Three repeats of one measurement here differed by up to 35 % in TTFT P50 and 25 % in ITL
  P50, so tighter bounds would test the machine, not the model.
  P90s are reported, not asserted: before the server ran at `--server-nice` they were
  dominated by the driver waiting for a CPU (stalls of up to 0.6 s); with it the TTFT P90
  errors measured -28/-29 % (6 -> 2), and other work on a shared CI machine can bring such
  stalls back. Neither is the driver's own wait (other load on the machine moved it from 1 %
  to 23 % of a run): the server the tests start is asserted to run niced, and a run whose
  driver waited beyond three times `run`'s warning is measured once more and, if it waits
  again, warned about. The measured errors are printed (run with -s).
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pandas as pd
import pytest
from validate_support import HIGH, LOW

from rackSim.config.specs import ReplaySpec
from rackSim.validate.colocated import simulate_colocated
from rackSim.validate.compare import (
    compare_summaries,
    format_table,
    summarize_run,
    write_comparison,
)
from rackSim.validate.driver import DRIVER_WAIT_LIMIT, driver_wait_share
from rackSim.validate.fit import fit_driver_records, fit_iteration_log
from rackSim.validate.ingest import load_driver_run, read_iteration_log
from rackSim.validate.refine import refine_overheads
from rackSim.validate.scrape import metric_total, read_scrapes
from rackSim.validate.server import SERVER_NICE, autogroup_nice
from rackSim.workload.graph import SessionInstance
from rackSim.workload.tokens import prompt_token_ids

pytestmark = pytest.mark.slow


def _delta(run_dir, name: str) -> float:
    scrapes = read_scrapes(run_dir / "scrapes.jsonl")
    before = next(s for s in scrapes if s["label"] == "before")
    after = [s for s in scrapes if s["label"] == "after"][-1]
    return (metric_total([tuple(x) for x in after["samples"]], name)
            - metric_total([tuple(x) for x in before["samples"]], name))


def test_records_match_server_counters(measured_runs, vllm_server):
    for conc, run in measured_runs.items():
        out = run.outcome
        recs, t0, t1 = load_driver_run(out.out_dir)
        assert out.failed == 0 and out.stop_reason == "window", (conc, out)
        assert t1 - t0 == pytest.approx(20.0, abs=0.5)
        assert len(recs) >= 10 * conc
        for r in recs:
            assert r.error is None
            assert len(r.token_times_s) == r.output_tokens
            assert r.send_s < r.first_token_s <= r.finish_s
            assert r.cached_tokens % 128 == 0 and 0 <= r.cached_tokens < r.prompt_tokens
        # the server counted exactly what the driver recorded
        assert _delta(out.out_dir, "vllm:generation_tokens_total") == \
            sum(r.output_tokens for r in recs)
        assert _delta(out.out_dir, "vllm:prompt_tokens_total") == \
            sum(r.prompt_tokens for r in recs)
        assert _delta(out.out_dir, "vllm:prompt_tokens_cached_total") == \
            sum(r.cached_tokens for r in recs)
        # the server's shape was read (/metrics, log) and the drift probe ran around the run
        meta = out.meta
        assert meta["endpoints"][0]["shape"]["block_tokens"] == 128
        assert meta["endpoints"][0]["shape"]["kv_capacity_tokens"] > 0
        assert meta["scheduler"]["max_num_seqs"] == 64 and meta["server_changed"] is None
        probe = meta["probe"][meta["endpoints"][0]["url"]]
        assert probe["before"]["ok"] == probe["after"]["ok"] == 5
        assert set(probe["change"]) == {"ttft_ms", "tpot_ms"}
        # the driver's CPU was measured, and the server the tests started runs at
        # --server-nice: that, not the driver's wait, is asserted. Behind a niced server the
        # driver hardly waits for a CPU (1% of a 12-lane run; 43% with the server at nice 0),
        # but the machine's other load alone made it wait 9% of one CI run (2026-12-03) and
        # 23% of both attempts of another (2026-12-07), so the wait measures the machine
        seg = meta["segments"][-1]
        assert seg["driver_cpu_s"] > 0 and 0 <= driver_wait_share(seg) <= 1
        if run.local_server:
            pid = vllm_server.proc.pid
            assert os.getpriority(os.PRIO_PROCESS, pid) == SERVER_NICE
            assert autogroup_nice(pid) in (SERVER_NICE, None)
            if driver_wait_share(seg) > 3 * DRIVER_WAIT_LIMIT:
                warnings.warn(f"concurrency {conc}: the driver waited for a CPU "
                              f"{driver_wait_share(seg):.0%} of the run (the machine is "
                              "loaded); its latencies are the machine's", stacklevel=1)
        scrapes = read_scrapes(out.out_dir / "scrapes.jsonl")
        labels = {s["label"] for s in scrapes}
        assert labels == {"before", "during", "after"}
        # prefix sharing: later turns of a session hit the cache
        assert sum(r.cached_tokens for r in recs) > 0.3 * sum(r.prompt_tokens for r in recs)


def test_prompt_lengths_are_the_workloads(measured_runs):
    run = measured_runs[LOW]
    recs, _, _ = load_driver_run(run.outcome.out_dir)
    by_id = {g.session_id: g for g in run.sessions}
    for r in recs:
        spec = by_id[r.session_id].requests[r.rid]
        assert r.prompt_tokens == spec.prompt_tokens
        want = 1 if r.phase == "primer" else spec.output_tokens
        assert r.output_tokens == want
    # token ids are deterministic and shared along the prefix tree
    g = next(g for g in run.sessions if len(g.requests) > 1 and g.requests[1].parent == 0)
    inst = SessionInstance(g, key_base=0)
    a, b = prompt_token_ids(inst, 0), prompt_token_ids(inst, 1)
    assert np.array_equal(a, b[: len(a)])


def test_turns_hit_the_outputs_they_re_send(measured_runs):
    """The driver re-sends a turn's predecessor's output as the ids the server generated (the
    default), so a turn that re-sends its predecessor's whole context hits the blocks that
    output filled: past the predecessor's prompt whenever its context (less the last token)
    has more whole 128-token blocks than its prompt (re-sent as the workload's own ids, it
    never got past the prompt: measured on a six-lane run, docs/validate.md). Every such turn
    of the run is checked; the server's cache holds them all (1 GiB of KV for tens of
    sessions)."""
    for run in measured_runs.values():
        assert run.outcome.meta["prompt_outputs"] == "server"
        recs, _, _ = load_driver_run(run.outcome.out_dir)
        done = {(r.session_key, r.rid): r for r in recs if r.phase != "primer"}
        by_id = {g.session_id: g for g in run.sessions}
        checked = 0
        for r in recs:
            spec = by_id[r.session_id].requests[r.rid]
            parent = done.get((r.session_key, spec.parent))
            if parent is None or r.phase == "primer":
                continue
            p = by_id[r.session_id].requests[spec.parent]
            # vLLM never computes the last sampled token's KV: the blocks before it count
            if spec.prefix_tokens == p.context_tokens and \
                    (p.context_tokens - 1) // 128 > p.prompt_tokens // 128:
                assert r.cached_tokens > p.prompt_tokens // 128 * 128, (r, p)
                checked += 1
        assert checked >= 5, checked


def test_iteration_log_matches_records(measured_runs):
    for run in measured_runs.values():
        steps = read_iteration_log(run.log_path, run.log_start, run.log_end)
        recs, _, _ = load_driver_run(run.outcome.out_dir)
        prefill = sum(s[5] for s in steps)
        decode = sum(s[7] for s in steps)
        # each request's first token comes from its last prefill step
        assert decode == sum(r.output_tokens - 1 for r in recs)
        assert prefill == sum(r.prompt_tokens - r.cached_tokens for r in recs)
        assert all(s[3] > 0 for s in steps)


def _predict(run, profile):
    replay = ReplaySpec(**run.outcome.meta["replay"])
    sim = simulate_colocated(run.sessions, replay, profile, seed=run.seed,
                             reuse_outputs=run.outcome.meta["prompt_outputs"] == "server")
    return summarize_run(sim.records, sim.window_start_s, sim.window_end_s, "simulated",
                         sessions=run.sessions).summary


def _errors(fit_run, pred_run, tmp_path) -> dict[str, dict[str, float]]:
    recs_fit, f0, f1 = load_driver_run(fit_run.outcome.out_dir)
    steps_fit = read_iteration_log(fit_run.log_path, fit_run.log_start, fit_run.log_end)
    recs, t0, t1 = load_driver_run(pred_run.outcome.out_dir)
    measured = summarize_run(recs, t0, t1, "measured", sessions=pred_run.sessions).summary
    # black box: records only, then the overheads refined on the fitting run itself
    blackbox = refine_overheads(fit_driver_records(recs_fit), fit_run.sessions,
                                ReplaySpec(**fit_run.outcome.meta["replay"]), fit_run.seed,
                                summarize_run(recs_fit, f0, f1, "fit").summary,
                                reuse_outputs=fit_run.outcome.meta["prompt_outputs"] == "server")
    out = {}
    for name, prof in (("iteration_log", fit_iteration_log(steps_fit, records=recs_fit)),
                       ("driver_records", blackbox)):
        tag = f"{name}-fit{fit_run.concurrency}-predict{pred_run.concurrency}"
        prof.to_yaml(tmp_path / f"profile-{tag}.yaml")
        df = compare_summaries(measured, _predict(pred_run, prof))
        csv, png = write_comparison(df, tmp_path / tag, tag)
        assert len(pd.read_csv(csv)) == len(df) and png.stat().st_size > 10_000
        print(format_table(df, f"\n[{name}] fit at concurrency {fit_run.concurrency}, "
                               f"predict {pred_run.concurrency}"))
        out[name] = df.set_index("key")["error_pct"].to_dict()
    return out


def test_fit_on_one_concurrency_predicts_the_other(measured_runs, tmp_path):
    """Fit at the higher concurrency (its steps span decode batches of 1-7 requests, so the
    per-request slope is identified) and predict the lower one; the reverse direction is
    printed too, for the record, but extrapolates the slope from batches of 1-3."""
    low, high = measured_runs[LOW], measured_runs[HIGH]
    errs = _errors(high, low, tmp_path)
    _errors(low, high, tmp_path)
    within_50_pct = {"iteration_log": ("throughput_tok_s_gpu",),
                     "driver_records": ("throughput_tok_s_gpu",)}
    within_factor = [("iteration_log", "itl_p50_ms"), ("iteration_log", "ttft_p50_ms"),
                     ("driver_records", "itl_p50_ms")]
    for profile, keys in within_50_pct.items():
        for key in keys:
            err = errs[profile][key]
            assert not math.isnan(err) and abs(err) < 50, (profile, key, err)
    for profile, key in within_factor:
        ratio = 1 + errs[profile][key] / 100  # predicted / measured
        assert 1 / 2.5 < ratio < 2.5, (profile, key, errs[profile][key])
