"""Fit a step-time profile of a measured server, from its iteration log or from driver records.

The profile prices one engine step (vLLM mixes prefill chunks and decode tokens in a step):

    step_ms = const_ms + per_prefill_token_ms * prefill_tokens
              + per_prefill_request_ms * prefill_requests
              + per_decode_request_ms * decode_requests + per_context_token_ms * context_tokens
              + overhead_ms + overhead_per_request_ms * (prefill_requests + decode_requests)

and `api_overhead_ms` is a fixed per-request delay before a request reaches the scheduler
(HTTP handling, request processing) that adds to its TTFT only.

- From the iteration log (`fit_iteration_log`): ordinary regression of each step's logged
  elapsed time on its counts (the log has no context column, so per_context_token_ms = 0),
  and `step_jitter`, the quantiles of logged / fitted time over the run's steps.
  The log times the model step only; the time between steps (scheduling, output processing)
  and `api_overhead_ms` come from the driver records of the same run when given. The
  clients' token gaps give the wall time of a decode step against the requests decoding
  (`_gap_line`: the median gap per count, a line). Those gaps over the median at their count
  give `decode_jitter`, the spread of a decode-only step as the clients see it (`step_jitter`,
  from the log, stays for steps with prefill); the line over that spread's median, less the
  logged model step, has `overhead_ms` for intercept and `overhead_per_request_ms` for slope.
  With fewer than two counts to read (one lane), `overhead_ms` is the busy wall time the
  logged steps leave uncovered, per step, and there is no `decode_jitter`. A gap during
  which a request was sent is longer than the median at its count by the host time the
  request's intake takes from the engine (`_intake_stall`: a line in its prompt tokens,
  `intake_stall_ms` and `intake_stall_per_token_ms`).
- Black box (`fit_driver_records`): no step log (so no step jitter). Each request gives two
  equations: its end-to-end latency = its TTFT + (output - 1) steps priced at the mean batch
  seen over its decode span plus the prefill work other requests did meanwhile; its TTFT = the
  steps needed to compute its own and the overlapping prompt tokens under the chunk budget,
  plus half a step of waiting, plus api_overhead_ms. Batch sizes come from the records' overlaps.

Both use `scipy.optimize.least_squares` (non-negative coefficients, soft-L1 loss so a few
stalls from a shared machine do not dominate) and report residuals.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import theilslopes

from rackSim.metrics.records import RequestRecord
from rackSim.perf.measured import COEFFS, JITTER_LEVELS, Profile, ServerShape


def _stats(pred: np.ndarray, obs: np.ndarray) -> dict[str, float]:
    err = pred - obs
    ss = float(((obs - obs.mean()) ** 2).sum())
    pct = np.abs(err) / np.maximum(np.abs(obs), 1e-9) * 100
    return {"n": int(obs.size), "rmse_ms": float(np.sqrt((err ** 2).mean())),
            "mae_ms": float(np.abs(err).mean()), "bias_ms": float(err.mean()),
            "r2": float(1 - (err ** 2).sum() / ss) if ss > 0 else math.nan,
            "abs_pct_p50": float(np.percentile(pct, 50)),
            "abs_pct_p90": float(np.percentile(pct, 90))}


def _provenance(source: str, inputs: list[str], extra: dict | None = None) -> dict:
    return {"created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "method": "scipy.optimize.least_squares, non-negative, loss=soft_l1",
            "source": source, "inputs": inputs, **(extra or {})}


def fit_iteration_log(steps: list[tuple], shape: ServerShape | None = None,
                      records: list[RequestRecord] | None = None,
                      inputs: list[str] | None = None) -> Profile:
    """Fit step time on the logged counts of every step (rows in STEP_COLUMNS order).
    With the driver `records` of the same run, also estimate overhead_ms (busy wall time not
    covered by logged step time, per step) and api_overhead_ms."""
    if len(steps) < 8:
        raise ValueError(f"iteration log: {len(steps)} steps, need at least 8 to fit")
    a = np.array([[s[5], s[4], s[6]] for s in steps], dtype=float)  # p_tok, p_req, d_req
    y = np.array([s[3] for s in steps], dtype=float)
    x = np.column_stack([np.ones(len(y)), a])

    def resid(c: np.ndarray) -> np.ndarray:
        return x @ c - y

    c0 = np.linalg.lstsq(x, y, rcond=None)[0].clip(min=1e-6)
    sol = least_squares(resid, c0, bounds=(0, np.inf), loss="soft_l1",
                        f_scale=max(float(np.median(y)) * 0.2, 0.1))
    c = sol.x
    coeffs = dict(zip(COEFFS, [c[0], c[1], c[2], c[3], 0.0], strict=True))
    pred = x @ c
    is_pf = a[:, 0] > 0
    residuals = {"all": _stats(pred, y)}
    if is_pf.any():
        residuals["with_prefill"] = _stats(pred[is_pf], y[is_pf])
    if (~is_pf).any():
        residuals["decode_only"] = _stats(pred[~is_pf], y[~is_pf])
    levels = (np.arange(JITTER_LEVELS) + 0.5) / JITTER_LEVELS
    jitter = np.quantile(y / np.maximum(pred, 1e-9), levels)
    prof = Profile(coeffs=coeffs, server=shape or ServerShape(), source="iteration_log",
                   residuals=residuals, step_jitter=[float(x) for x in jitter])
    prof.step_ratios = prof.ratios(steps)
    extra: dict = {"steps": len(steps), "logged_step_ms_total": float(y.sum())}
    if records:
        busy = _busy_s(records)
        between = max(0.0, (busy * 1e3 - float(y.sum())) / len(steps))
        token_gaps = _token_gaps(records)
        gaps = _gap_line(token_gaps)
        stall = _intake_stall(token_gaps, gaps)
        prof.intake_stall_ms = stall.get("stall_ms", 0.0)
        prof.intake_stall_per_token_ms = stall.get("stall_per_token_ms", 0.0)
        if "slope_ms_per_request" in gaps:
            # a decode-only step is (model + between) x a decode_jitter draw, whose median
            # step is the line's
            prof.decode_jitter = _decode_jitter(token_gaps, gaps, levels)
            j = float(np.median(prof.decode_jitter))
            prof.overhead_ms = max(0.0, gaps["intercept_ms"] / j - float(c[0]))
            prof.overhead_per_request_ms = max(0.0, gaps["slope_ms_per_request"] / j
                                               - float(c[3]))
        else:
            prof.overhead_ms = between
        prof.api_overhead_ms = _api_overhead(records, prof)
        extra.update({"busy_s": busy, "records": len(records), "between_steps_ms": between,
                      "token_gaps": gaps, "intake_stall": stall})
    prof.provenance = _provenance("iteration_log", inputs or [], extra)
    return prof


def _ok(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.error is None and r.output_tokens >= 1
            and not math.isnan(r.first_token_s) and not math.isnan(r.finish_s)]


def _busy_s(records: list[RequestRecord]) -> float:
    """Wall time (s) during which at least one request was at the server."""
    spans = sorted((r.send_s, r.finish_s) for r in records if not math.isnan(r.finish_s))
    total, cur_a, cur_b = 0.0, None, None
    for a, b in spans:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


GAP_MIN_SAMPLES = 30  # token gaps at one decoding count for its median to count


@dataclass
class _TokenGaps:
    """Every gap between two tokens of a request at the client, with what the server was
    doing at its start: gap_ms; decoding, the requests decoding (first token before, finish
    after); pending, requests sent before it whose first token came after its start (a prompt
    the step may compute); sent, requests sent during it; sent_prompt, the prompt tokens of
    the first of those (0 when none)."""

    gap_ms: np.ndarray
    decoding: np.ndarray
    pending: np.ndarray
    sent: np.ndarray
    sent_prompt: np.ndarray


def _token_gaps(records: list[RequestRecord]) -> _TokenGaps | None:
    ok = _ok(records)
    first = np.sort([r.first_token_s for r in ok])
    finish = np.sort([r.finish_s for r in ok])
    answered = sorted((r.send_s, r.prompt_tokens) for r in records
                      if not math.isnan(r.first_token_s))
    sends = np.array([t for t, _ in answered])
    prompt = np.array([p for _, p in answered] + [0])
    firsts_all = np.sort([r.first_token_s for r in records if not math.isnan(r.first_token_s)])
    times = [np.asarray(r.token_times_s) for r in ok if len(r.token_times_s) > 1]
    if not times:
        return None
    start = np.concatenate([t[:-1] for t in times])
    end = np.concatenate([t[1:] for t in times])
    decoding = (np.searchsorted(first, start, side="right")
                - np.searchsorted(finish, start, side="right"))
    sent_before = np.searchsorted(sends, start, side="right")
    sent = np.searchsorted(sends, end) - sent_before  # sent before its end (a send at the
    # very end, a client answering the step that ended it, belongs to the next gap)
    pending = sent_before - np.searchsorted(firsts_all, start, side="right")
    return _TokenGaps((end - start) * 1e3, decoding, pending, sent,
                      np.where(sent > 0, prompt[sent_before], 0))


def _gap_line(gaps: _TokenGaps | None) -> dict:
    """The wall time (ms) of a decode step against the requests decoding in it, from the
    clients' token gaps: each gap between two tokens of a request, taken when no request was
    between its send and its first token and none was sent during it (no prompt in the step,
    no intake stalling it), is one step with the requests decoding at its start; the medians
    per decoding count (those with at least GAP_MIN_SAMPLES gaps) are fitted by a line
    weighted by the square root of their counts. Returns the counts, medians and gaps, and
    the line (`intercept_ms`, `slope_ms_per_request`) when at least two counts have enough
    gaps."""
    if gaps is None:
        return {}
    keep = (gaps.pending == 0) & (gaps.sent == 0)
    counts, medians, sizes = [], [], []
    for n in np.unique(gaps.decoding[keep]):
        sel = keep & (gaps.decoding == n)
        if n >= 1 and sel.sum() >= GAP_MIN_SAMPLES:
            counts.append(int(n))
            medians.append(float(np.median(gaps.gap_ms[sel])))
            sizes.append(int(sel.sum()))
    out = {"decoding": counts, "median_gap_ms": medians, "gaps": sizes}
    if len(counts) >= 2:
        slope, intercept = np.polyfit(counts, medians, 1, w=np.sqrt(sizes))
        out.update(intercept_ms=float(intercept), slope_ms_per_request=float(slope))
    return out


def _with_median(gaps: _TokenGaps, line: dict, sent: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The gaps with no prompt in flight and `sent` requests sent during them, at a decoding
    count `line` has a median for: their gap_ms, the median gap at their count (ms), and the
    mask that picks them from `gaps`."""
    median_at = dict(zip(line["decoding"], line["median_gap_ms"], strict=True))
    sel = (gaps.pending == 0) & (gaps.sent == sent) & np.isin(gaps.decoding, line["decoding"])
    return gaps.gap_ms[sel], np.array([median_at[n] for n in gaps.decoding[sel]]), sel


def _decode_jitter(gaps: _TokenGaps, line: dict, levels: np.ndarray) -> list[float]:
    """Quantiles (at `levels`) of a decode step's wall time over the median at its decoding
    count, from the gaps `_gap_line` reads (no prompt in the step, no intake stalling it)."""
    gap, median, _ = _with_median(gaps, line, sent=0)
    return [float(x) for x in np.quantile(gap / median, levels)]


def _intake_stall(gaps: _TokenGaps | None, line: dict) -> dict:
    """The host time (ms) a request's intake takes from the engine's step in progress, from
    the clients' token gaps: a gap during which one request was sent (none pending at its
    start) is longer than the median gap at its decoding count (`_gap_line`'s medians) by
    the stall; the excess against the sent request's prompt tokens is read by a Theil-Sen
    line (medians of pairwise slopes: a few gaps that also met a stall of the machine do not
    tilt it). Returns the samples and, with at least GAP_MIN_SAMPLES of them, `stall_ms` and
    `stall_per_token_ms` (a constant, the median excess, when the line's intercept or slope
    is negative)."""
    if gaps is None or not line.get("decoding"):
        return {"samples": 0}
    gap, median, sel = _with_median(gaps, line, sent=1)
    out: dict = {"samples": int(gap.size)}
    if gap.size < GAP_MIN_SAMPLES:
        return out
    excess = gap - median
    tokens = gaps.sent_prompt[sel].astype(float)
    slope, intercept = theilslopes(excess, tokens)[:2] if np.ptp(tokens) > 0 else (0.0, 0.0)
    if not (slope >= 0 and intercept >= 0):
        slope, intercept = 0.0, max(0.0, float(np.median(excess)))
    out.update(stall_ms=float(intercept), stall_per_token_ms=float(slope),
               median_excess_ms=float(np.median(excess)),
               prompt_tokens_p10_p90=[float(x) for x in np.percentile(tokens, [10, 90])])
    return out


def _api_overhead(records: list[RequestRecord], prof: Profile) -> float:
    """Median TTFT left over (ms) after one prefill step, over requests that prefilled alone."""
    ok = _ok(records)
    left = []
    for r in ok:
        alone = not any(o is not r and o.send_s < r.first_token_s and o.first_token_s > r.send_s
                        for o in ok)
        if alone:
            step = prof.step_ms(r.uncached_tokens, 1, 0)
            left.append(r.ttft_ms - step)
    return max(0.0, float(np.median(left))) if left else 0.0


def _overlap(a0: np.ndarray, a1: np.ndarray, b0: float, b1: float) -> np.ndarray:
    return np.clip(np.minimum(a1, b1) - np.maximum(a0, b0), 0, None)


def blackbox_features(records: list[RequestRecord], budget: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Design rows (const, prefill tokens, prefill requests, decode requests, context tokens,
    api), observations (ms) and a 0/1 kind (0 = end-to-end latency, 1 = TTFT) per equation.

    End-to-end latency (send to last token) is used rather than the decode span alone: on a
    busy client machine tokens may reach the client in bursts, which distorts the span but
    hardly the time of the last token."""
    ok = _ok(records)
    if len(ok) < 8:
        raise ValueError(f"driver records: {len(ok)} successful requests, need at least 8")
    s = np.array([r.send_s for r in ok])
    f = np.array([r.first_token_s for r in ok])
    e = np.array([r.finish_s for r in ok])
    u = np.array([max(r.uncached_tokens, 1) for r in ok], dtype=float)
    chunks = np.ceil(u / budget)
    ctx = np.array([r.prompt_tokens + r.output_tokens / 2 for r in ok], dtype=float)
    pf_len = np.maximum(f - s, 1e-6)
    rows, obs, kind = [], [], []
    for i in range(len(ok)):
        win = max(f[i] - s[i], 1e-6)
        frac = _overlap(s, f, s[i], f[i]) / pf_len
        frac[i] = 1.0
        p_tok = (frac * u).sum()
        k = max(1.0, math.ceil(p_tok / budget)) + 0.5
        dec = _overlap(f, e, s[i], f[i]) / win
        ttft = np.array([k, p_tok, (frac * chunks).sum(), k * dec.sum(), k * (dec * ctx).sum(),
                         1.0])
        rows.append(ttft)
        obs.append(win * 1e3)
        kind.append(1)
        steps = ok[i].output_tokens - 1
        if steps >= 2 and e[i] > f[i]:
            span = e[i] - f[i]
            dec = _overlap(f, e, f[i], e[i])
            frac = _overlap(s, f, f[i], e[i]) / pf_len
            frac[i] = 0.0
            rows.append(ttft + np.array([steps, (frac * u).sum(), (frac * chunks).sum(),
                                         steps * dec.sum() / span,
                                         steps * (dec * ctx).sum() / span, 0.0]))
            obs.append((e[i] - s[i]) * 1e3)
            kind.append(0)
    return np.array(rows), np.array(obs), np.array(kind)


def fit_driver_records(records: list[RequestRecord], shape: ServerShape | None = None,
                       inputs: list[str] | None = None) -> Profile:
    """Black-box fit from driver records alone (see the module docstring)."""
    shape = shape or ServerShape()
    x, y, kind = blackbox_features(records, shape.max_num_batched_tokens)
    scale = np.maximum(y, 1.0)

    def resid(c: np.ndarray) -> np.ndarray:
        return (x @ c - y) / scale

    c_init = np.array([2.0, 0.005, 0.5, 0.2, 0.0, 1.0])
    sol = least_squares(resid, c_init, bounds=(0, np.inf), loss="soft_l1", f_scale=0.2)
    c = sol.x
    pred = x @ c
    residuals = {"all": _stats(pred, y)}
    for k, name in ((0, "e2e"), (1, "ttft")):
        if (kind == k).any():
            residuals[name] = _stats(pred[kind == k], y[kind == k])
    return Profile(coeffs=dict(zip(COEFFS, c[:5], strict=True)), api_overhead_ms=float(c[5]),
                   server=shape, source="driver_records", residuals=residuals,
                   provenance=_provenance("driver_records", inputs or [],
                                          {"requests": int((kind == 1).sum()),
                                           "equations": int(len(y))}))
