"""Choosing plans: preference order, simulated verdicts first, and the next confirmation
round after the simulation rejected the first, by hand on small frames."""

from __future__ import annotations

import pandas as pd
import pytest

from rackSim.plan.choose import chosen, next_round, screen_optimism, to_confirm


def _frame(rows: list[dict]) -> pd.DataFrame:
    base = {"hardware": "gb300_nvl72", "within_budget": True, "feasible": True,
            "gpus": 40, "headroom_min": 0.1, "ttft_p50_ms": 100.0}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_cheapest_first_then_fewest_gpus_then_headroom():
    df = _frame([
        {"family_key": "a", "fleet_usd_h": 720, "gpus": 80, "headroom_min": 0.5},
        {"family_key": "a", "fleet_usd_h": 720, "gpus": 40, "headroom_min": 0.01},
        {"family_key": "b", "fleet_usd_h": 360, "gpus": 60, "headroom_min": 0.2},
        {"family_key": "c", "fleet_usd_h": 360, "gpus": 60, "headroom_min": 0.3,
         "feasible": False},
    ])
    assert to_confirm(df, 2).index.tolist() == [2, 1]
    # a layout kind the best families leave out is simulated too: its best candidate
    kinds = df.assign(family=["disaggregated", "disaggregated", "disaggregated",
                              "colocated"])
    assert to_confirm(kinds, 2).index.tolist() == [2, 1, 3]
    assert to_confirm(kinds, 0).empty
    # simulated within the SLOs beats the screen's order; simulated and missing goes last
    df["des_meets_slo"] = [True, None, False, None]
    assert chosen(df, 3).index.tolist() == [0, 1, 2]


def test_among_simulated_plans_the_simulations_headroom_breaks_ties(small_inputs):
    """Two candidates both simulated within the SLOs, at the same cost and GPUs: the one the
    simulation finds with more headroom first, whatever the screen said."""
    from rackSim.plan.choose import des_headroom

    df = _frame([
        {"family_key": "a", "fleet_usd_h": 648, "headroom_min": 0.12,
         "des_interactivity_tok_s": 150.6, "des_ttft_p90_ms": 1000.0},
        {"family_key": "b", "fleet_usd_h": 648, "headroom_min": 0.09,
         "des_interactivity_tok_s": 166.8, "des_ttft_p90_ms": 1100.0},
        {"family_key": "c", "fleet_usd_h": 360, "headroom_min": 0.01, "feasible": False},
    ])
    # SLOs: 150 tok/s/user, TTFT P90 2 s
    heads = des_headroom(df.iloc[:2], small_inputs.plan)
    assert heads.tolist() == pytest.approx([150.6 / 150 - 1, 166.8 / 150 - 1])
    df.loc[:1, "des_meets_slo"] = True
    df.loc[:1, "des_headroom_min"] = heads
    assert chosen(df, 2).index.tolist() == [1, 0]
    assert chosen(df.drop(columns="des_headroom_min"), 2).index.tolist() == [0, 1]


def test_next_round_discounts_the_screen_by_its_worst_error(small_inputs):
    confirmed = _frame([
        {"family_key": "a", "fleet_usd_h": 720, "interactivity_tok_s": 160.0,
         "ttft_p90_ms": 1900.0, "des_status": "ok", "des_interactivity_tok_s": 150.0,
         "des_ttft_p90_ms": 2280.0},  # screen 6.7 % high on interactivity, 20 % low on TTFT
    ])
    assert screen_optimism(confirmed) == pytest.approx((160 / 150, 1.2))
    screened = pd.concat([confirmed.drop(columns=[c for c in confirmed if c.startswith("des")]),
                          _frame([
        {"family_key": "a", "fleet_usd_h": 720, "interactivity_tok_s": 170.0,
         "ttft_p90_ms": 1700.0},   # 1700 x 1.2 = 2040 ms > 2 s: still too close
        {"family_key": "a", "fleet_usd_h": 1080, "interactivity_tok_s": 170.0,
         "ttft_p90_ms": 1600.0},   # 1920 ms, 159 tok/s/user: clears both
        {"family_key": "b", "fleet_usd_h": 1080, "interactivity_tok_s": 158.0,
         "ttft_p90_ms": 1000.0},   # 158 / 1.067 = 148 < 150
    ])], ignore_index=True)
    plan = small_inputs.plan  # SLOs: 150 tok/s/user, TTFT P90 2 s
    assert next_round(screened, confirmed, plan).index.tolist() == [2]


def test_each_family_says_why_it_lost():
    from rackSim.plan.choose import families
    from rackSim.plan.screen import Rejected

    df = _frame([
        {"family_key": "a", "fleet_usd_h": 648, "gpus": 112, "racks": 2, "layout": "A"},
        {"family_key": "b", "fleet_usd_h": 720, "gpus": 80, "racks": 2, "layout": "B"},
        {"family_key": "c", "fleet_usd_h": 648, "gpus": 120, "racks": 2, "layout": "C"},
        {"family_key": "d", "fleet_usd_h": 324, "gpus": 20, "racks": 1, "layout": "D",
         "feasible": False, "headroom_min": -3.0, "verdict": "TTFT P90 9 s > 2 s"},
    ])
    got = families(df, [Rejected("gb300_nvl72", "e", "deployment.decode.gpus=48: ...")],
                   df.iloc[[0]]).set_index("family")["why"]
    assert got["a"] == "chosen"
    assert got["b"].startswith("meets the SLOs but costs more: $720/h")
    assert got["c"].startswith("meets the SLOs at the plans' cost with 120 GPUs")
    assert got["d"] == "best candidate D x1: TTFT P90 9 s > 2 s"
    assert got["e"] == "does not fit: deployment.decode.gpus=48: ..."


def test_the_terminal_table_keeps_its_columns_under_long_layout_names():
    """A layout name longer than the column (`P4xDEP8(dbo)+2xDEP16(dbo)`) widens it: every
    number stays under its heading."""
    from rackSim.report.plan_table import format_plan

    table = pd.DataFrame([
        {"status": "plan 1: screen only", "hardware": "gb200_nvl72", "racks": 2,
         "layout per rack": name, "tok/s/GPU (screen)": 38518.0,
         "P90 tok/s/user (screen)": 63.1, "TTFT P90 ms (screen)": 3980.0,
         "cost $/Mtok": 0.0365}
        for name in ("P4xDEP8+DEP32", "P4xDEP8(dbo)+2xDEP16(dbo)")])
    head, *rows = format_plan(table).splitlines()
    for label in ("tok/s/GPU", "$/Mtok"):
        end = head.index(label) + len(label)
        assert all(len(r) >= end and r[end - 1] != " " and r[end:end + 1] in ("", " ")
                   for r in rows), label


def test_the_terminal_table_says_where_a_p90_sits_on_the_knife_edge():
    """A colocated row whose tokens' share from busy steps is near a tenth carries the other
    kind of step's P90: the table prints both; a row off the edge (NaN) prints none."""
    from rackSim.report.plan_table import format_plan

    row = {"status": "plan 3: confirmed", "hardware": "gb200_nvl72", "racks": 14,
           "layout per rack": "C9xDEP8", "tok/s/GPU (screen)": 44735.0,
           "P90 tok/s/user (screen)": 414.8, "TTFT P90 ms (screen)": 65.0,
           "cost $/Mtok": 0.0279}
    table = pd.DataFrame([{**row, "P90 tok/s/user knife-edge (screen)": 231.4},
                          {**row, "P90 tok/s/user knife-edge (screen)": float("nan")}])
    lines = format_plan(table).splitlines()
    assert len(lines) == 4 and "knife-edge" in lines[2]
    assert "P90 414.8 tok/s/user, 231.4 on the other kind of step" in lines[2]
