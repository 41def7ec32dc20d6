"""From priced candidates to plans: which to confirm, which to recommend, why families lose.

Order of preference among candidates that meet every SLO within the limits: cheapest fleet
per hour (racks are bought whole), then fewest GPUs in use (the rest of the rack is spare),
then the largest headroom to the tightest SLO (the simulation's, among candidates it
confirmed). When none does, the best found is the one
closest to meeting them (largest `headroom_min`, i.e. the smallest shortfall), and its
verdict says which SLO it misses.
"""

from __future__ import annotations

import pandas as pd

from rackSim.plan.screen import Rejected
from rackSim.plan.spec import PlanSpec

ORDER = ["fleet_usd_h", "gpus", "headroom_min"]
ASCENDING = [True, True, False]


def ranked(screened: pd.DataFrame) -> pd.DataFrame:
    """Feasible candidates in order of preference; if there are none, every candidate within
    the budget (else every candidate) closest to the SLOs first."""
    ok = screened[screened["feasible"]]
    if len(ok):
        return ok.sort_values(ORDER, ascending=ASCENDING, kind="stable")
    pool = screened[screened["within_budget"]]
    if not len(pool):
        pool = screened
    return pool.sort_values(["headroom_min", "fleet_usd_h"], ascending=[False, True],
                            kind="stable")


def to_confirm(screened: pd.DataFrame, k: int, every_kind: bool = True) -> pd.DataFrame:
    """The best candidate of each of the `k` best families (hardware x layout kind and
    widths), so the simulation sees different ways to serve the demand; and (k > 0,
    `every_kind`) the best candidate of each layout kind those leave out (in the order of
    `ranked` within the kind: the closest to the SLOs if none meets them), so "should we
    disaggregate at all?" is answered by simulation too."""
    best = ranked(screened).drop_duplicates(["hardware", "family_key"])
    picks = best.head(k)
    if k <= 0 or not every_kind or "family" not in screened:
        return picks
    kinds = [g for kind, g in screened.groupby("family", sort=False)
             if kind not in set(picks["family"])]
    return pd.concat([picks, *(ranked(g).head(1) for g in kinds)])


def screen_optimism(confirmed: pd.DataFrame) -> tuple[float, float]:
    """How optimistic the screen was on the simulated candidates, as factors >= 1:
    (screen / DES interactivity, DES / screen TTFT P90), the worst of each."""
    ok = confirmed[confirmed["des_status"] == "ok"]
    if not len(ok):
        return 1.0, 1.0
    f_int = (ok["interactivity_tok_s"] / ok["des_interactivity_tok_s"]).max()
    f_ttft = (ok["des_ttft_p90_ms"] / ok["ttft_p90_ms"]).max()
    return max(1.0, float(f_int)), max(1.0, float(f_ttft))


def next_round(screened: pd.DataFrame, confirmed: pd.DataFrame, plan: PlanSpec
               ) -> pd.DataFrame:
    """Candidates for another confirmation round, after none of `confirmed` met the SLOs in
    the simulation: those not yet simulated whose screen prediction still meets the SLOs when
    discounted by the screen's worst optimism so far (`screen_optimism`), best per family."""
    f_int, f_ttft = screen_optimism(confirmed)
    slo = plan.slo
    safe = screened[screened["within_budget"]
                    & (screened["interactivity_tok_s"] / f_int
                       >= slo.interactivity_p90_tok_s_user_min)
                    & (screened["ttft_p90_ms"] * f_ttft <= slo.ttft_p90_s_max * 1e3)
                    & ~screened.index.isin(confirmed.index)]
    if slo.ttft_p50_s_max is not None:
        safe = safe[safe["ttft_p50_ms"] * f_ttft <= slo.ttft_p50_s_max * 1e3]
    return to_confirm(safe[safe["feasible"]], plan.confirm.top_k, every_kind=False)


def des_headroom(confirmed: pd.DataFrame, plan: PlanSpec) -> pd.Series:
    """The headroom of each simulated candidate to its tightest SLO, as `headroom_min` is of
    the screen's (> 0: every SLO met with that fraction to spare)."""
    slo = plan.slo
    heads = [confirmed["des_interactivity_tok_s"] / slo.interactivity_p90_tok_s_user_min - 1,
             1 - confirmed["des_ttft_p90_ms"] / (slo.ttft_p90_s_max * 1e3)]
    if slo.ttft_p50_s_max is not None:
        heads.append(1 - confirmed["des_ttft_p50_ms"] / (slo.ttft_p50_s_max * 1e3))
    return pd.concat(heads, axis=1).min(axis=1)


def chosen(candidates: pd.DataFrame, n: int) -> pd.DataFrame:
    """The `n` plans recommended, in the order of `ranked`, except that candidates the
    simulation confirmed within the SLOs come first (among them, at the same cost and GPUs,
    the one the simulation finds with most headroom) and those it found missing them
    last."""
    order = ranked(candidates)
    des = order["des_meets_slo"] if "des_meets_slo" in order else pd.Series(
        None, index=order.index, dtype=object)
    tier = pd.Series([0 if v is True else 2 if v is False else 1 for v in des],
                     index=order.index)
    met = order[tier == 0]
    if "des_headroom_min" in met:
        met = met.sort_values(["fleet_usd_h", "gpus", "des_headroom_min"],
                              ascending=[True, True, False], kind="stable")
    return pd.concat([met, order[tier == 1], order[tier == 2]]).head(n)


def families(screened: pd.DataFrame, rejected: list[Rejected],
             plans: pd.DataFrame) -> pd.DataFrame:
    """One row per family (hardware x layout kind and widths): its best candidate and, for a
    family without a plan, why it lost (SLO missed, over budget, dearer, does not fit)."""
    rows = []
    chosen_keys = set(zip(plans["hardware"], plans["family_key"], strict=True))
    cheapest = plans["fleet_usd_h"].min() if len(plans) else float("nan")
    for (hw, fam), g in screened.groupby(["hardware", "family_key"], sort=False):
        best = ranked(g).iloc[0]
        if (hw, fam) in chosen_keys and best["feasible"]:
            why = "chosen"
        elif best["feasible"] and best["fleet_usd_h"] > cheapest:
            why = (f"meets the SLOs but costs more: ${best['fleet_usd_h']:,.0f}/h "
                   f"({best['racks']} racks of {best['layout']}) against ${cheapest:,.0f}/h")
        elif best["feasible"]:
            why = (f"meets the SLOs at the plans' cost with {best['gpus']} GPUs in use "
                   f"({best['racks']} racks of {best['layout']}), ranked below them "
                   "(more GPUs in use or less headroom)")
        else:
            why = f"best candidate {best['layout']} x{best['racks']}: {best['verdict']}"
        rows.append({"hardware": hw, "family": fam, "candidates": len(g),
                     "feasible": int(g["feasible"].sum()), "best_layout": best["layout"],
                     "best_racks": int(best["racks"]), "why": why})
    screened_keys = {(r["hardware"], r["family"]) for r in rows}
    for rej in rejected:
        if (rej.hardware, rej.family) in screened_keys:
            continue
        screened_keys.add((rej.hardware, rej.family))
        rows.append({"hardware": rej.hardware, "family": rej.family, "candidates": 0,
                     "feasible": 0, "best_layout": "", "best_racks": 0,
                     "why": f"does not fit: {rej.reason}"})
    return pd.DataFrame(rows)
