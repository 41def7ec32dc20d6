"""`racksim-plan`: demand + SLOs + hardware options + prices in, the cheapest fleets out.

    racksim-plan plan=agentx_reference                       # the reference question
    racksim-plan plan=agentx_reference plan.demand.agents=8000 plan.confirm.top_k=2
    racksim-plan plan=agentx_reference hydra.run.dir=runs/plan_a   # re-run: resumes stage 2

Stage 1 screens every candidate (rackSim.plan.screen), stage 2 simulates the best through a
Hydra launcher (rackSim.plan.confirm), then the plan is written into the run directory:
`plan.html` (one self-contained page), `plan.parquet/csv` (the plan table),
`candidates.parquet/csv` (every screened candidate), `families.parquet/csv` (why each family
lost), `pareto.png`, `screen_vs_des.png`, `confirm/` (the confirmation sweep).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rackSim.metrics.summary import TTFT_STAGES
from rackSim.plan.choose import chosen, des_headroom, families, next_round, to_confirm
from rackSim.plan.confirm import (
    compare,
    held_by_candidates,
    run_confirmation,
    write_candidates,
)
from rackSim.plan.demand import profile_demand
from rackSim.plan.inputs import PlanInputs
from rackSim.plan.screen import Screen
from rackSim.report.plan_figures import pareto_png, screen_error_png
from rackSim.report.plan_page import PlanPage, write_plan_page
from rackSim.report.plan_table import plan_table, write_plan_tables
from rackSim.workload.sources import load_sessions

#: Overrides of the plan command that are not the scenario's (not passed to the simulations).
NOT_SCENARIO = ("plan", "+plan", "++plan", "hydra", "hardware", "+hardware")


@dataclass
class PlanResult:
    screened: pd.DataFrame
    confirmed: pd.DataFrame
    plans: pd.DataFrame
    families: pd.DataFrame
    screen_s: float
    met: bool


def scenario_overrides(overrides: Sequence[str]) -> list[str]:
    """The command-line overrides that shape the scenario (workload, deployment settings,
    experiment...), to compose the simulations the same way the screen saw it."""
    return [o for o in overrides if o.split("=", 1)[0].split(".", 1)[0].split("/", 1)[0]
            not in NOT_SCENARIO]


def des_verdict(row: pd.Series, inputs: PlanInputs) -> str:
    """What the simulation says of a confirmed candidate: empty when it meets every SLO."""
    slo = inputs.plan.slo
    if row["des_status"] != "ok":
        return f"simulation failed: {row['des_error']}"
    why = []
    if not row["des_interactivity_tok_s"] >= slo.interactivity_p90_tok_s_user_min:
        why.append(f"interactivity {row['des_interactivity_tok_s']:.0f} < "
                   f"{slo.interactivity_p90_tok_s_user_min:g} tok/s/user")
    if not row["des_ttft_p90_ms"] <= slo.ttft_p90_s_max * 1e3:
        why.append(f"TTFT P90 {row['des_ttft_p90_ms'] / 1e3:.3g} s > {slo.ttft_p90_s_max:g} s")
    if slo.ttft_p50_s_max is not None and not row["des_ttft_p50_ms"] <= slo.ttft_p50_s_max * 1e3:
        why.append(f"TTFT P50 {row['des_ttft_p50_ms'] / 1e3:.3g} s > {slo.ttft_p50_s_max:g} s")
    if why and why[-1].startswith("TTFT"):
        why[-1] += ttft_split(row)
    return "; ".join(why)


def ttft_split(row: pd.Series) -> str:
    """` (mean 1.6 s: prefill wait 0.92, prefill 0.41, decode wait 0.22 s)`: the
    simulated TTFT's mean and its stages of a tenth of it or more, largest first (empty when
    the simulation recorded no stages)."""
    parts = {label: row.get(f"des_ttft_{stage}_ms", math.nan)
             for stage, _, _, label in TTFT_STAGES}
    total = sum(parts.values())
    if not total > 0:  # NaN: no stage times
        return ""
    big = sorted(((v, k) for k, v in parts.items() if v >= 0.1 * total), reverse=True)
    return (f" (mean {total / 1e3:.2g} s: "
            + ", ".join(f"{k} {v / 1e3:.2g}" for v, k in big) + " s)")


def run_plan(inputs: PlanInputs, out_dir: Path, overrides: Sequence[str] = ()) -> PlanResult:
    """Screen, confirm, choose (no files written; see `write_plan`)."""
    plan, cfg = inputs.plan, inputs.scenario
    t0 = time.perf_counter()
    sessions = load_sessions(cfg.workload, cfg.seed)
    # Reuse is measured per live agent; sessions per hour replay the pool once, side by side.
    demand = profile_demand(sessions, cfg.deployment.decode.speculative.accepted_tokens_per_step,
                            lanes=plan.demand.agents or len(sessions))
    screen = Screen(cfg, plan, inputs.hardware, demand)
    screened = screen.run()
    screen_s = time.perf_counter() - t0
    print(f"racksim-plan: screened {len(screened)} candidates in {screen_s:.1f} s, "
          f"{int(screened['feasible'].sum())} meet the SLOs within the limits", file=sys.stderr)
    picks = to_confirm(screened, plan.confirm.top_k)
    confirmed = picks.iloc[0:0]
    sweep_overrides = scenario_overrides(overrides)
    for round_ in range(1, plan.confirm.rounds + 1):
        if not len(picks):
            break
        picks = picks.assign(candidate=write_candidates(picks, plan, out_dir, cfg,
                                                        sweep_overrides),
                             confirm_round=round_)
        held = held_by_candidates(picks["candidate"], out_dir, sweep_overrides)
        if held:
            print("racksim-plan: the candidates set these keys themselves (the command line's "
                  f"value only where one sets none): {' '.join(held)}", file=sys.stderr)
        sim = run_confirmation(picks["candidate"].tolist(), plan, out_dir, sweep_overrides)
        got = compare(picks, sim)
        got["des_verdict"] = [des_verdict(r, inputs) for _, r in got.iterrows()]
        got["des_meets_slo"] = got["des_verdict"] == ""
        got["des_headroom_min"] = des_headroom(got, plan)
        confirmed = pd.concat([confirmed, got])
        if got["des_meets_slo"].any():
            break
        picks = next_round(screened, confirmed, plan)
    pool = screened if not len(confirmed) else pd.concat(
        [confirmed, screened.drop(index=confirmed.index)])
    plans = chosen(pool, plan.plans)
    met = bool(plans["feasible"].any()) if len(plans) else False
    return PlanResult(screened, confirmed, plans, families(screened, screen.rejected, plans),
                      screen_s, met)


def _status(row: pd.Series, i: int) -> str:
    des = row.get("des_meets_slo")
    if not row["feasible"]:
        return "best found: misses"
    if des is True:
        return f"plan {i}: confirmed"
    if des is False:
        return f"plan {i}: DES misses"
    return f"plan {i}: screen only"


def shown_rows(result: PlanResult) -> pd.DataFrame:
    """The plans, then the confirmed candidates not chosen, each with its `status`."""
    plans = result.plans.copy()
    plans.insert(0, "status", [_status(r, i + 1) for i, (_, r) in enumerate(plans.iterrows())])
    if not len(result.confirmed):
        return plans
    extra = result.confirmed[~result.confirmed.index.isin(plans.index)].copy()
    extra.insert(0, "status", "confirmed, not chosen")
    return pd.concat([plans, extra])


def write_plan(result: PlanResult, inputs: PlanInputs, out_dir: Path) -> Path:
    """Write the tables, figures and page of `result` into `out_dir`; returns the page."""
    plan = inputs.plan
    shown = shown_rows(result)
    table = plan_table(shown)
    write_plan_tables(out_dir, {"plan": table, "candidates": result.screened,
                                "families": result.families})
    figures = {"Throughput per GPU against P90 interactivity: every screened candidate, the "
               "SLO line, the plans (stars) and their simulated points (circles)":
               pareto_png(result.screened, shown, plan.slo.interactivity_p90_tok_s_user_min)}
    if len(result.confirmed):
        figures["Screen against simulation, per confirmed candidate"] = \
            screen_error_png(result.confirmed)
    for name, png in zip(("pareto.png", "screen_vs_des.png"), figures.values(), strict=False):
        (out_dir / name).write_bytes(png)
    page = PlanPage(
        title=f"Capacity plan: {plan.name}", question=question(inputs),
        plans=table, families=result.families, figures=figures,
        notes=notes(inputs, result), method=method(inputs, result),
        missed="" if result.met else (
            "No fleet within the limits meets every SLO. The best found is shown; "
            f"it misses: {result.plans.iloc[0]['verdict']}." if len(result.plans) else
            "No candidate could be priced."))
    return write_plan_page(page, out_dir / "plan.html")


def question(inputs: PlanInputs) -> str:
    p, cfg = inputs.plan, inputs.scenario
    demand = (f"{p.demand.agents:,} concurrent agents" if p.demand.agents is not None
              else f"{p.demand.sessions_per_hour:,.0f} sessions per hour")
    hw = ", ".join(o.name for o in p.hardware)
    return (f"{demand} of workload '{cfg.workload.name}' on {cfg.model.name}; SLOs: P90 "
            f"interactivity >= {p.slo.interactivity_p90_tok_s_user_min:g} tok/s/user, TTFT "
            f"P90 <= {p.slo.ttft_p90_s_max:g} s; hardware options: {hw}; at most "
            f"{p.limits.max_racks} racks" + (f", ${p.limits.max_usd_per_hour:,.0f}/h"
                                              if p.limits.max_usd_per_hour else "") + ".")


def notes(inputs: PlanInputs, result: PlanResult) -> list[str]:
    out = []
    if len(result.confirmed):
        out.append("Confirmation simulated each candidate's whole fleet (its racks under the "
                   "global router's session affinity) at the full demand."
                   if inputs.plan.confirm.fleet else
                   "Confirmation simulated ONE rack of each candidate at agents / racks "
                   "clients (session affinity to a rack: identical racks split the demand "
                   "evenly and exchange no KV), not the whole fleet.")
    if inputs.plan.confirm.top_k == 0:
        out.append("Screen only: no candidate was simulated (confirm.top_k = 0).")
    return out


def method(inputs: PlanInputs, result: PlanResult) -> list[str]:
    c = inputs.plan.confirm
    return [
        f"Screen: {len(result.screened)} candidates in {result.screen_s:.1f} s, step times "
        f"from the {inputs.scenario.perf.model} step model, queueing bounds (Little, "
        "batching prefill instances, M/G/1 colocated ranks, Poisson decode occupancy) - "
        "rackSim/plan/screen.py.",
        f"Confirmation: {len(result.confirmed)} candidates simulated by the engine through "
        f"hydra/launcher={c.launcher}, {c.window_s:g} s windows after "
        f"{c.warmup_requests_per_lane} warm-up requests per lane; session affinity routing.",
        "Throughput counts cached + uncached input + output tokens per GPU in use; revenue "
        f"from the '{inputs.scenario.pricing.name}' price sheet.",
    ]
