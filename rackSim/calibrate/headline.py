"""What the published AgentX headline implies, by arithmetic (`racksim-calibrate headline`).

H1 (tokens/s/GPU), H3 (revenue $/GPU-hour) and the off-peak price sheet ($1-$3) put the token
mix on one line: with shares c (cached input), u (uncached input), o (output), c + u + o = 1,

    p_c c + p_u u + p_o o = H3 / (H1 x 3600 / 1e6)        ($ per million tokens)

so the mix lies on a segment of the simplex. H2 (P90 tokens/s per user) with M7 accepted tokens
per step puts the P90 decode step at M7 / H2 (16.6 ms). A layout allowed by H4 (2-GPU prefill
instances, P7, feeding one 16- or 32-GPU decode instance, 34-64 GPUs) then turns a decode depth
(requests per decode rank) into an output rate, the output rate into a point on the segment,
and that point into the uncached tokens each prefill GPU must compute:

    output tok/s  = decode GPUs x requests per rank x H2
    o             = output tok/s / (H1 x GPUs)
    u             = (price - p_c - (p_o - p_c) o) / (p_u - p_c)
    uncached tok/s per prefill GPU = u x H1 x GPUs / prefill GPUs

The decode depth comes from the calibrated decode step: the requests per rank at which a
steady DEPn step (EPLB on, the scenario's all-reduce, every request at `context` tokens) takes
M7 / H2. The mean step stands in for the P90 one here; the simulator adds the step-to-step
spread.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from rackSim.calibrate.figures import FIGURES_CSV
from rackSim.config.flags import output_file, positive_int

if TYPE_CHECKING:
    from rackSim.perf.profile import Profile


class HeadlineError(ValueError):
    """A figure table that the arithmetic cannot use; the message names the figure."""


@dataclass(frozen=True)
class Headline:
    """The published headline and price sheet (units as in published_figures.csv)."""

    throughput_tok_s_gpu: float          # H1
    interactivity_tok_s_user: float      # H2 (P90)
    revenue_usd_gpu_h: float             # H3
    gpus_min: int                        # H4
    gpus_max: int                        # H4
    decode_widths: tuple[int, ...]       # H4: one 16- or 32-GPU decode instance
    prefill_gpus_per_instance: int       # H4 / P7: DEP2
    price_cached: float                  # $1, USD per 1M tokens
    price_uncached: float                # $2
    price_output: float                  # $3
    accepted_tokens_per_step: float      # M7

    @property
    def usd_per_mtok(self) -> float:
        """Mean price of one million tokens of the headline mix (USD)."""
        return self.revenue_usd_gpu_h / (self.throughput_tok_s_gpu * 3600 / 1e6)

    @property
    def p90_step_ms(self) -> float:
        """Decode step (ms) at which each request gets H2 tokens/s: M7 / H2."""
        return self.accepted_tokens_per_step / self.interactivity_tok_s_user * 1e3

    @property
    def prices(self) -> tuple[float, float, float]:
        return self.price_cached, self.price_uncached, self.price_output


def _number(rows: dict[str, dict[str, str]], fid: str, positive: bool = True) -> float:
    if fid not in rows:
        raise HeadlineError(f"{fid}: missing from the figure table; add the row")
    text = rows[fid]["value"]
    try:
        value = float(text)
    except ValueError:
        raise HeadlineError(f"{fid}: value '{text}' is not a number") from None
    if positive and not value > 0:
        raise HeadlineError(f"{fid}: value {value} must be positive")
    if value < 0:
        raise HeadlineError(f"{fid}: value {value} must not be negative")
    return value


def read_headline(path: Path = FIGURES_CSV) -> Headline:
    """Read the headline figures from a published-figures CSV (id, value, conditions columns)."""
    if not Path(path).is_file():
        raise HeadlineError(f"figure table {path}: no such file")
    with open(path, newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    h4 = rows.get("H4")
    if h4 is None:
        raise HeadlineError("H4: missing from the figure table; add the row")
    span = re.fullmatch(r"\s*(\d+)\s+to\s+(\d+)\s*", h4["value"])
    widths = re.search(r"(\d+)- or (\d+)-GPU decode", h4["conditions"])
    pgpus = re.search(r"(\d+)-GPU prefill", h4["conditions"])
    if span is None or widths is None or pgpus is None:
        raise HeadlineError("H4: expected value 'A to B' GPUs and conditions naming 'N-GPU "
                            "prefill' instances and an 'X- or Y-GPU decode' instance, got "
                            f"'{h4['value']}' / '{h4['conditions']}'")
    lo, hi = int(span.group(1)), int(span.group(2))
    if lo > hi:
        raise HeadlineError(f"H4: {lo} to {hi} GPUs is an empty range")
    h = Headline(
        throughput_tok_s_gpu=_number(rows, "H1"), interactivity_tok_s_user=_number(rows, "H2"),
        revenue_usd_gpu_h=_number(rows, "H3"), gpus_min=lo, gpus_max=hi,
        decode_widths=tuple(sorted({int(widths.group(1)), int(widths.group(2))})),
        prefill_gpus_per_instance=int(pgpus.group(1)),
        price_cached=_number(rows, "$1", positive=False),
        price_uncached=_number(rows, "$2", positive=False),
        price_output=_number(rows, "$3", positive=False),
        accepted_tokens_per_step=_number(rows, "M7"))
    mix_segment(h)  # refuse an infeasible table at once
    return h


@dataclass(frozen=True)
class Mix:
    """Token shares: cached input, uncached input, output (sum 1)."""

    cached: float
    uncached: float
    output: float


def mix_segment(h: Headline) -> tuple[Mix, Mix]:
    """The two ends of the feasible token-mix segment (the iso-price line cut by the simplex),
    ordered by output share."""
    price, p = h.usd_per_mtok, h.prices
    if price > max(p) * (1 + 1e-12):
        raise HeadlineError(
            f"H3: ${h.revenue_usd_gpu_h}/GPU-h at H1={h.throughput_tok_s_gpu:g} tok/s/GPU is "
            f"${price:.4g} per 1M tokens, above what all-output tokens could earn "
            f"(${max(p):g} per 1M, $3); check H1, H3 and the price sheet")
    if price < min(p) * (1 - 1e-12):
        raise HeadlineError(
            f"H3: ${h.revenue_usd_gpu_h}/GPU-h at H1={h.throughput_tok_s_gpu:g} tok/s/GPU is "
            f"${price:.4g} per 1M tokens, below what all-cached tokens earn "
            f"(${min(p):g} per 1M, $1); check H1, H3 and the price sheet")
    ends: list[Mix] = []
    for i, j in ((0, 1), (0, 2), (1, 2)):  # the simplex edge where the third share is 0
        if p[i] == p[j]:
            continue
        xi = (price - p[j]) / (p[i] - p[j])
        if -1e-12 <= xi <= 1 + 1e-12:
            x = [0.0, 0.0, 0.0]
            x[i], x[j] = min(max(xi, 0.0), 1.0), min(max(1 - xi, 0.0), 1.0)
            m = Mix(*x)
            if all(abs(m.output - e.output) + abs(m.uncached - e.uncached) > 1e-12
                   for e in ends):
                ends.append(m)
    if not ends:
        raise HeadlineError("$1-$3: all three prices are equal and differ from the headline "
                            "price; no mix can earn H3")
    ends.sort(key=lambda m: m.output)
    return ends[0], ends[-1]


def mix_at_output(h: Headline, output: float) -> Mix | None:
    """The point of the segment with output share `output`, or None if it is off the segment."""
    pc, pu, po = h.prices
    if pu == pc:
        return None
    u = (h.usd_per_mtok - pc - (po - pc) * output) / (pu - pc)
    c = 1.0 - u - output
    if output < 0 or u < -1e-12 or c < -1e-12:
        return None
    return Mix(max(c, 0.0), max(u, 0.0), output)


@dataclass(frozen=True)
class Layout:
    """Prefill instances of `Headline.prefill_gpus_per_instance` GPUs + one decode instance."""

    prefill_instances: int
    prefill_gpus_per_instance: int
    decode_gpus: int

    @property
    def prefill_gpus(self) -> int:
        return self.prefill_instances * self.prefill_gpus_per_instance

    @property
    def gpus(self) -> int:
        return self.prefill_gpus + self.decode_gpus


def layouts(h: Headline) -> list[Layout]:
    """Every layout H4 allows: each decode width with 1.. prefill instances, 34-64 GPUs."""
    out = []
    g = h.prefill_gpus_per_instance
    for n in h.decode_widths:
        for k in range(1, (h.gpus_max - n) // g + 1):
            if h.gpus_min <= n + k * g <= h.gpus_max:
                out.append(Layout(k, g, n))
    return out


@dataclass(frozen=True)
class Implication:
    """What the headline asks of one layout at a given decode depth."""

    layout: Layout
    requests_per_rank: float
    output_tok_s: float                   # whole deployment
    mix: Mix | None                       # None: off the feasible segment
    uncached_tok_s_per_prefill_gpu: float  # nan when off the segment

    def row(self) -> dict[str, object]:
        m = self.mix
        return {"decode_gpus": self.layout.decode_gpus,
                "prefill_instances": self.layout.prefill_instances,
                "gpus": self.layout.gpus, "requests_per_rank": self.requests_per_rank,
                "output_share": m.output if m else float("nan"),
                "uncached_share": m.uncached if m else float("nan"),
                "cached_share": m.cached if m else float("nan"),
                "output_tok_s_gpu": self.output_tok_s / self.layout.gpus,
                "uncached_tok_s_per_prefill_gpu": self.uncached_tok_s_per_prefill_gpu,
                "feasible": m is not None}


def implied(h: Headline, layout: Layout, requests_per_rank: float) -> Implication:
    """Output rate, mix and prefill demand of `layout` when each decode rank holds
    `requests_per_rank` requests that each receive H2 tokens/s."""
    out = layout.decode_gpus * requests_per_rank * h.interactivity_tok_s_user
    total = h.throughput_tok_s_gpu * layout.gpus
    mix = mix_at_output(h, out / total)
    per_gpu = mix.uncached * total / layout.prefill_gpus if mix else float("nan")
    return Implication(layout, requests_per_rank, out, mix, per_gpu)


def depth_at_step(step_ms: Callable[[float], float], target_ms: float,
                  hi: float = 1024.0) -> float:
    """Requests per rank at which the increasing `step_ms(requests per rank)` reaches
    `target_ms` (bisection to 0.01 requests); `hi` if it never does."""
    lo = 0.0
    if step_ms(hi) < target_ms:
        return hi
    while hi - lo > 0.01:
        mid = (lo + hi) / 2
        if step_ms(mid) < target_ms:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def calibrated_decode_step(profile: Profile, decode_gpus: int, context: int
                           ) -> Callable[[float], float]:
    """Mean decode step (ms) of a steady DEP`decode_gpus` instance of the reference deployment
    as a function of requests per rank, each request at `context` tokens; EPLB in steady state
    between rearrangements and the straggler term at its expectation."""
    from rackSim.calibrate.scenario import operating_point
    from rackSim.perf.calibrated import CalibratedStepModel
    from rackSim.perf.step import DecodeBatch

    cfg = operating_point(decode_gpus=decode_gpus)
    model = CalibratedStepModel(cfg, "decode", profile=profile)
    spec = cfg.deployment.decode.speculative
    interval = cfg.deployment.eplb.interval_steps
    step_index = 2 * interval + interval // 2
    balancedness = model.balancedness(step_index)
    fixed = CalibratedStepModel(cfg, "decode", profile=model.profile, balancedness=balancedness)

    def step_ms(requests_per_rank: float) -> float:
        batch = DecodeBatch([requests_per_rank] * decode_gpus,
                            [requests_per_rank * context] * decode_gpus,
                            spec.accepted_tokens_per_step, spec.num_draft_tokens, 0, 0,
                            step_index)
        br = fixed.decode_step(batch)
        return br.total_ms - br.straggler + fixed.last_straggler_expected_ms

    return step_ms


def headline_table(h: Headline, depth: Callable[[int], float]) -> pd.DataFrame:
    """One row per H4 layout: its decode depth (`depth(decode_gpus)`) and what it implies."""
    return pd.DataFrame([implied(h, lay, depth(lay.decode_gpus)).row() for lay in layouts(h)])


def format_report(h: Headline, table: pd.DataFrame, context: int) -> str:
    lo, hi = mix_segment(h)
    lines = [
        f"headline: H1 {h.throughput_tok_s_gpu:,.0f} tok/s/GPU, H2 {h.interactivity_tok_s_user:g}"
        f" tok/s/user (P90), H3 ${h.revenue_usd_gpu_h:g}/GPU-h at ${h.price_cached:g} / "
        f"${h.price_uncached:g} / ${h.price_output:g} per 1M cached / uncached / output",
        f"mean price of the mix: ${h.usd_per_mtok:.6f} per 1M tokens",
        "feasible token mix (cached, uncached, output), from one end to the other:",
        f"  ({lo.cached:.4%}, {lo.uncached:.4%}, {lo.output:.4%})  ->  "
        f"({hi.cached:.4%}, {hi.uncached:.4%}, {hi.output:.4%})",
        f"  uncached input at most {max(lo.uncached, hi.uncached):.2%}, output at most "
        f"{max(lo.output, hi.output):.2%} of the tokens",
        f"P90 decode step: M7 / H2 = {h.accepted_tokens_per_step:g} / "
        f"{h.interactivity_tok_s_user:g} = {h.p90_step_ms:.2f} ms",
        f"layouts allowed by H4 ({h.gpus_min}-{h.gpus_max} GPUs), decode depth from the "
        f"calibrated step at {context} context tokens per request:",
    ]
    fmt = {"requests_per_rank": "{:.1f}".format, "output_share": "{:.3%}".format,
           "uncached_share": "{:.3%}".format, "cached_share": "{:.3%}".format,
           "output_tok_s_gpu": "{:,.0f}".format,
           "uncached_tok_s_per_prefill_gpu": "{:,.0f}".format}
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        lines.append(table.to_string(index=False, formatters=fmt, na_rep="-"))
    if not table["feasible"].all():
        lines.append(f"-: infeasible: the layout's output rate is above the largest output "
                     f"share H1 and H3 allow ({max(lo.output, hi.output):.2%} of the tokens)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from rackSim.calibrate.scenario import DEFAULT_PROFILE

    ap = argparse.ArgumentParser(
        prog="racksim-calibrate headline", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--figures", type=Path, default=FIGURES_CSV,
                    help="published figures CSV (default: %(default)s)")
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE,
                    help="calibration profile for the decode step (default: %(default)s)")
    ap.add_argument("--context", type=positive_int, default=32768,
                    help="context tokens per decode request (default: %(default)s)")
    ap.add_argument("--csv", type=output_file, default=None,
                    help="also write the layout table here")
    args = ap.parse_args(argv)
    try:
        h = read_headline(args.figures)
    except HeadlineError as err:
        print(f"racksim-calibrate headline: {err}", file=sys.stderr)
        return 2
    if not args.profile.is_file():
        print(f"racksim-calibrate headline: --profile {args.profile}: no such file",
              file=sys.stderr)
        return 2
    from rackSim.perf.profile import Profile

    profile = Profile.load(args.profile, "--profile")  # not a profile: exit 3, named
    steps = {n: calibrated_decode_step(profile, n, args.context) for n in h.decode_widths}
    depths = {n: depth_at_step(steps[n], h.p90_step_ms) for n in h.decode_widths}
    table = headline_table(h, depths.__getitem__)
    print(format_report(h, table, args.context))
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    return 0
