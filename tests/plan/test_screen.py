"""The screen against hand calculations: prices, queueing bounds, demand statistics, and every
screened candidate's operating point against the formulas it claims to solve."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_support import SMALL, compose_plan
from scipy.stats import poisson

from rackSim.perf import PrefillBatch
from rackSim.plan.demand import profile_demand
from rackSim.plan.inputs import load_hardware
from rackSim.plan.layout import rack_layouts
from rackSim.plan.queueing import (
    batched_prefill_s,
    gamma_quantile,
    mg1_wait_s,
    occupancy_quantile,
    wait_quantile_s,
)
from rackSim.plan.screen import KNIFE_EDGE_SHARE, Screen
from rackSim.plan.spec import HardwareOption, Space
from rackSim.plan.speeds import (
    ColocatedTable,
    PrefillSpeed,
    RankLoads,
    busy_share,
    decode_speed,
    fill_least_loaded,
)
from rackSim.workload.graph import RequestSpec, SessionGraph
from rackSim.workload.sources import load_sessions


def screen_for(inputs, accepted: float) -> Screen:
    """A screen of `inputs`' plan over its scenario's workload, `accepted` tokens a step."""
    cfg = inputs.scenario
    demand = profile_demand(load_sessions(cfg.workload, cfg.seed), accepted,
                            lanes=inputs.plan.demand.agents)
    return Screen(cfg, inputs.plan, inputs.hardware, demand)


def test_prices_rental_and_capex_by_hand():
    gb300 = load_hardware("gb300_nvl72")
    assert HardwareOption(name="gb300_nvl72", rental_usd_per_gpu_hour=5.0
                          ).usd_per_gpu_hour(gb300) == 5.0
    capex = HardwareOption(name="gb300_nvl72", capex_usd_per_gpu=52_000, years=4,
                           power_usd_per_kwh=0.09, pue=1.2)
    # 52,000 / (4 x 8,760 h) = 1.4840 $/h; 1.4 kW x 1.2 x $0.09 = 0.1512 $/h
    assert capex.usd_per_gpu_hour(gb300) == pytest.approx(1.48402 + 0.1512, abs=1e-4)


def test_queueing_by_hand():
    # lambda 2/s, E[S] 0.25 s, E[S^2] 0.125 s^2: rho 0.5, W = 2 x 0.125 / (2 x 0.5) = 0.25 s
    rho, wait = mg1_wait_s(np.array([2.0]), np.array([0.25]), np.array([0.125]))
    assert rho[0] == pytest.approx(0.5) and wait[0] == pytest.approx(0.25)
    # P90 = W / rho x ln(rho / 0.1) = 0.5 x ln 5; the median waits not at all (rho <= 0.5)
    assert wait_quantile_s(wait, rho, 0.9)[0] == pytest.approx(0.5 * math.log(5.0))
    assert wait_quantile_s(wait, rho, 0.5)[0] == 0.0
    _, over = mg1_wait_s(np.array([4.0]), np.array([0.25]), np.array([0.125]))
    assert np.isinf(over[0])
    # Poisson(10): P(N <= 13) = 0.864, P(N <= 14) = 0.917
    assert occupancy_quantile(np.array([10.0]), 0.9)[0] == 14


def test_batched_prefill_by_hand():
    """a 30 ms, b 10 us a token, 20 requests/s of E[u] 2,000 tokens, E[u^2] 2e7: Lambda
    40,000 tokens/s, b Lambda 0.4, back-to-back steps of T = 0.03 / 0.6 = 50 ms with variance
    1e-10 x 20 x 0.05 x 2e7 = 0.002 s^2, a gamma of shape 1.25 and scale 0.04; length-biased
    L: mean 0.05 + 0.002 / 0.05 = 0.09, variance 2.25 x 0.04^2 = 0.0036. Every arrival finds
    a step (20 x (0.03 + 0.02) = 1): the rest R = U L (mean 0.045, variance 0.0117 / 3 -
    0.045^2), its own step 0.05 + 0.4 x 0.09 (variance b^2 Var u + b^2 lam E[u^2] E[L] +
    0.4^2 Var L), and 2 Cov(R, own) = 0.4 Var L."""
    args = [np.array([x]) for x in (20.0, 0.03, 1e-5, 2000.0, 2e7, 32768.0)]
    mean, var = batched_prefill_s(*args)
    assert mean[0] == pytest.approx(0.045 + 0.05 + 0.4 * 0.09, rel=1e-12)
    rest_var = (0.0036 + 0.09 ** 2) / 3 - 0.045 ** 2
    own_var = 1e-10 * (2e7 - 2000.0 ** 2) + 1e-10 * 20 * 2e7 * 0.09 + 0.16 * 0.0036
    assert var[0] == pytest.approx(rest_var + own_var + 0.4 * 0.0036, rel=1e-9)
    # light load: a request finds no step in progress and takes its own, a + b u
    light, light_var = batched_prefill_s(np.array([1e-9]), *args[1:])
    assert light[0] == pytest.approx(0.05, rel=1e-6)
    assert light_var[0] == pytest.approx(1e-10 * (2e7 - 2000.0 ** 2), rel=1e-6)
    # the full-budget rate is 32,768 / (0.03 + 0.32768) = 91,608 tokens/s: at 45.5 requests/s
    # a mean step carries 30.3K tokens, at 46 it would carry 34.5K, beyond the budget
    near, _ = batched_prefill_s(np.array([45.5]), *args[1:])
    over, over_var = batched_prefill_s(np.array([46.0]), *args[1:])
    assert np.isfinite(near[0]) and np.isinf(over[0]) and np.isinf(over_var[0])


@pytest.mark.parametrize("uncached", [500.0, 2288.0, 8000.0])
def test_a_prefill_step_is_a_line_in_its_tokens(small_inputs, uncached):
    """`PrefillSpeed.affine` passes through the full-budget step and one request's chunk, and
    prices batches of a quarter, half and three quarters of the budget within 1 % of the step
    model (measured: within 0.5 % for DEP2 and DEP4 on GB200 and GB300)."""
    pre = PrefillSpeed(small_inputs.scenario)
    prompt = 30_000.0
    fixed, per_token = pre.affine(prompt, uncached)
    per_s, full_ms = pre.rate(prompt, uncached)
    assert fixed + per_token * per_s * full_ms / 1e3 == pytest.approx(full_ms, rel=1e-9)
    for share in (0.25, 0.5, 0.75):
        k = max(1, round(share * pre.budget / uncached))
        ms = pre.model.prefill_step(PrefillBatch(
            new_tokens=int(k * uncached), attended_tokens=int(k * prompt), num_requests=k,
            admitted_prompt_tokens=int(k * prompt), ranks=pre.gpus)).total_ms
        assert fixed + per_token * k * uncached == pytest.approx(ms, rel=0.01)


def test_gamma_quantile():
    # variance mean^2: an exponential, P90 = -mean ln 0.1
    assert gamma_quantile(np.array([2.0]), np.array([4.0]), 0.9)[0] == pytest.approx(
        -2.0 * math.log(0.1), rel=1e-9)
    # no spread: the mean; infinite: infinite
    got = gamma_quantile(np.array([0.3, np.inf]), np.array([0.0, np.inf]), 0.9)
    assert got[0] == 0.3 and np.isinf(got[1])


@settings(max_examples=60, deadline=None)
@given(rho=st.floats(0.02, 0.99), wait=st.floats(1e-3, 100.0), q=st.floats(0.05, 0.99))
def test_wait_quantile_has_the_stated_tail(rho, wait, q):
    t = wait_quantile_s(np.array([wait]), np.array([rho]), q)[0]
    if rho > 1 - q:  # P(wait > t_q) = rho exp(-rho t_q / W) = 1 - q
        assert rho * math.exp(-rho * t / wait) == pytest.approx(1 - q, rel=1e-9)
    else:
        assert t == 0.0
    assert wait_quantile_s(np.array([wait]), np.array([rho]), min(q + 0.005, 0.999))[0] >= t


def _session() -> SessionGraph:
    """Main chain r0 -> r1 -> r3 with a subagent r2 forked after r0 and joined by r3."""
    return SessionGraph("s", (
        RequestSpec(0, None, 0, 1000, 100),
        RequestSpec(1, 0, 1100, 200, 50, after=(0,), delay_s=2.0),
        RequestSpec(2, 0, 500, 300, 20, after=(0,), delay_s=1.0, agent=1),
        RequestSpec(3, 1, 1350, 100, 10, after=(1, 2), delay_s=0.5),
    ))


def test_demand_profile_by_hand():
    d = profile_demand([_session()], accepted_tokens_per_step=3.25, lanes=1)
    assert d.requests_per_session == 4
    assert d.prompt_mean == pytest.approx((1000 + 1300 + 800 + 1450) / 4)
    # critical path r0 -> r1 -> r3: delays 2.0 + 0.5; 3 requests; outputs 100 + 50 + 10
    # of which 3 are first tokens (TTFT), 157 come at TPOT
    assert d.session_d0_s == pytest.approx(2.5)
    assert d.session_n_ttft == pytest.approx(3.0)
    assert d.session_n_tpot == pytest.approx(157.0)
    assert d.session_s(0.2, 0.004) == pytest.approx(2.5 + 3 * 0.2 + 157 * 0.004)
    # steps: 1 + ceil((out - 1) / 3.25) = 32, 17, 7, 4
    assert d.decode_steps_mean == pytest.approx(15.0)
    assert d.decode_context_mean == pytest.approx(
        (32 * 1050 + 17 * 1325 + 7 * 810 + 4 * 1455) / 60)
    no_cache, _, _ = d.prefill_reuse.uncached(0.0)
    assert no_cache == pytest.approx(d.prompt_mean)
    big, _, _ = d.prefill_reuse.uncached(1e9)
    assert big < no_cache


def test_demand_keeps_the_uncached_tokens_distribution():
    d = profile_demand([_session()], accepted_tokens_per_step=3.25, lanes=1)
    for reuse in (d.prefill_reuse, d.colocated_reuse):
        # no cache: every prompt is computed whole (1000, 1300, 800, 1450 tokens)
        assert reuse.uncached_quantile(0.0, [0.0, 0.5, 1.0]) == pytest.approx([800, 1150,
                                                                                1450])
        assert reuse.uncached_quantile(0.0, 0.9) == pytest.approx(
            np.quantile([1000, 1300, 800, 1450], 0.9))
        for cache in (0.0, 5e3, 1e9):
            q = reuse.uncached_quantile(cache, np.linspace(0, 1, 41))
            assert np.all(np.diff(q) >= 0)
            assert reuse.uncached(cache)[2] == pytest.approx(
                float(reuse.uncached_quantile(cache, 0.9)))
        # per row: capacities and levels broadcast together
        assert reuse.uncached_quantile([0.0, 1e9], 1.0) == pytest.approx(
            [1450, float(reuse.uncached_quantile(1e9, 1.0))])


def test_a_colocated_instance_reuses_the_outputs_it_decoded():
    """An infinite cache, whole 64-token blocks. A prefill instance holds prompts only: r1
    (r0's 1,000-token prompt and 100-token output, then 200 new) hits r0's 15 full prompt
    blocks (960), r2 (the first 500 of r0's prompt, then 300 new) 7 blocks (448), r3 (r1's
    1,350-token context, then 100 new) r1's 20 prompt blocks (1,280). A colocated instance
    also holds what it decoded, all but the last token: r1 hits r0's 1,099 computed tokens'
    17 blocks (1,088), r3 r1's 1,349 computed tokens' 21 (1,344)."""
    d = profile_demand([_session()], accepted_tokens_per_step=3.25, lanes=1)
    prompts = np.array([1000, 1300, 800, 1450])
    for reuse, hits in ((d.prefill_reuse, [0, 960, 448, 1280]),
                        (d.colocated_reuse, [0, 1088, 448, 1344])):
        unc = prompts - np.array(hits)
        assert reuse.uncached(1e9)[0] == pytest.approx(unc.mean())
        assert reuse.uncached(1e9)[1] == pytest.approx((unc ** 2).mean())
        assert reuse.uncached_quantile(1e9, [0.0, 1.0]) == pytest.approx([unc.min(),
                                                                           unc.max()])


def test_rack_layouts_by_hand():
    space = Space(families=["disaggregated"], prefill_gpus_per_instance=[2],
                  prefill_instances_max=4, decode_gpus=[4, 8])
    # an 8-GPU node: DEP4 decode leaves 4 GPUs = 1 or 2 DEP2 prefills; DEP8 leaves none
    assert [lay.name for lay in rack_layouts(space, 8)] == ["P1xDEP2+DEP4", "P2xDEP2+DEP4"]
    assert len(list(rack_layouts(space, 72))) == 4 + 4  # capped at 4 instances each
    colocated = Space(families=["colocated"], colocated_gpus=[4, 8], colocated_instances_max=4)
    # an 8-GPU node holds one or two DEP4 instances, or one DEP8
    assert [lay.name for lay in rack_layouts(colocated, 8)] == ["C1xDEP4", "C2xDEP4",
                                                               "C1xDEP8"]
    assert all(lay.gpus == lay.colocated_instances * lay.colocated_gpus
               for lay in rack_layouts(colocated, 72))



def test_a_family_too_big_for_the_rack_is_a_reason_not_a_gap():
    """2 x DEP64 decode and a DEP2 prefill take 130 GPUs: the families table says so, while
    one DEP64 (with up to 3 prefill instances in 72 GPUs) is screened."""
    from plan_support import SMALL, compose_plan

    from rackSim.plan.choose import families

    inputs = compose_plan(SMALL + ["plan.space.decode_gpus=[64]",
                                   "plan.space.decode_instances=[1,2]",
                                   "plan.space.families=[disaggregated]"])
    screen = screen_for(inputs, 3.25)
    rows = screen.run()
    assert set(rows["layout"]) == {"P1xDEP2+DEP64", "P2xDEP2+DEP64", "P3xDEP2+DEP64"}
    table = families(rows, screen.rejected, rows.iloc[0:0])
    why = table.set_index("family")["why"]
    assert why["disaggregated: DEP2 prefill + 2xDEP64 decode"] == (
        "does not fit: P1xDEP2+2xDEP64 takes 130 GPUs; a rack holds 72")


@pytest.fixture(scope="module")
def screened(small_inputs) -> tuple[pd.DataFrame, Screen]:
    cfg = small_inputs.scenario
    sessions = load_sessions(cfg.workload, cfg.seed)
    demand = profile_demand(sessions, 3.25, lanes=small_inputs.plan.demand.agents)
    screen = Screen(cfg, small_inputs.plan, small_inputs.hardware, demand)
    return screen.run(), screen


def hand_point(r: pd.Series, screen: Screen) -> tuple[float, float, float]:
    """(requests/s, mean TTFT s, TPOT s) of a screened row, recomputed by hand from its
    columns. Disaggregated: time at the batching prefill instance + KV push + 1.5 decode
    steps. Colocated: M/G/1 wait per DP rank served at the budget its decode leaves
    per busy step + the rest of the step in progress + the request's own chunks' steps
    (`first_token_mean_ms`)."""
    d = screen.demand
    lam = r["output_tok_s_gpu"] * r["gpus_per_rack_used"] / d.output_mean
    n = r["decode_per_rank"]
    if r["family"] == "colocated":
        speed = screen.serving_speed(r["hardware"], "colocated", r["colocated_gpus"],
                                     r["colocated_dbo"])
        table = speed.table(d.prompt_mean, r["uncached_mean"])
        t_ms, busy = table.step_at(n), table.busy_at(n)
        free = speed.budget - n * (1 + speed.draft_tokens)
        lam_p, mu = lam / (r["colocated_instances"] * speed.ranks), free / busy * 1e3
        own = first_token_mean_ms(r, screen, table, n, free) / 1e3
        rho = lam_p * r["uncached_mean"] / mu
        wait = lam_p * r["uncached_sq_mean"] / mu ** 2 / (2 * (1 - rho))
        return lam, wait + own, t_ms / speed.accepted / 1e3
    speed = screen.serving_speed(r["hardware"], r["family"], r["decode_gpus"], r["decode_dbo"])
    t_ms = speed.step_at(n)
    prefill = batched_prefill_mean_s(lam / r["prefill_instances"], r)
    return lam, prefill + r["push_mean_s"] + 1.5 * t_ms / 1e3, t_ms / speed.accepted / 1e3


def batched_prefill_mean_s(lam: float, r: pd.Series) -> float:
    """A request's mean time at a batching prefill instance (s) by hand: steps of a + b x;
    back to back they last T = a / (1 - b lam E[u]) with variance b^2 lam T E[u^2]; a
    request arriving in one (share min(1, lam (a + b E[u]))) waits half the length-biased
    step L = T + var / T, then takes a + b (E[u] + lam E[u] L); else a + b E[u]."""
    a, b = r["prefill_fixed_ms"] / 1e3, r["prefill_ms_per_token"] / 1e3
    u, u2 = r["uncached_mean"], r["uncached_sq_mean"]
    step = a / (1 - b * lam * u)
    length = step + b * b * lam * step * u2 / step
    alone = a + b * u
    busy = min(1.0, lam * alone)
    return busy * (length / 2 + alone + b * lam * u * length) + (1 - busy) * alone


def first_token_mean_ms(r: pd.Series, screen: Screen, table, n: float, free: float) -> float:
    """A colocated prompt's mean time to its first token (ms) by hand: twenty equally likely
    prompts (the middles of twenty slices of the uncached tokens), each in full-budget
    chunks then the rest, one step each; the step in progress at its arrival is a busy one
    of those chunks (each chunk step equally likely) with the table's busy share, else idle,
    length-biased, so it waits E[T^2] / 2 E[T] for its end."""
    prompts = [float(screen.demand.colocated_reuse.uncached_quantile(
        r["cache_per_agent_tokens"], (i + 0.5) / 20)) for i in range(20)]
    own, chunk_steps = [], []
    for u in prompts:
        k = math.ceil(max(u, 1.0) / free)
        lengths = [float(table.busy_at(n, np.array(free)))] * (k - 1) + [
            float(table.busy_at(n, np.array(u - (k - 1) * free)))]
        own.append(sum(lengths))
        chunk_steps.extend(lengths)
    s, idle = float(table.share_at(n)), float(table.idle_at(n))
    mean_t = s * np.mean(chunk_steps) + (1 - s) * idle
    mean_t2 = s * np.mean(np.square(chunk_steps)) + (1 - s) * idle ** 2
    return mean_t2 / (2 * mean_t) + float(np.mean(own))


def colocated_p90_step(r: pd.Series, screen: Screen, n: float | None = None) -> float:
    """The P90 step (ms) of a colocated row by hand, at its occupancy or at `n` requests a
    rank: w = the share of steps carrying prefill, of the tokens too; above a tenth, the busy
    step whose chunk is the (w - 0.1) / w quantile of uncached tokens (colocated view), at
    the P90 occupancy; else the idle step at the 0.9 / (1 - w) quantile of the
    token-weighted occupancy 1 + Poisson(m)."""
    d = screen.demand
    speed = screen.serving_speed(r["hardware"], "colocated", r["colocated_gpus"],
                                 r["colocated_dbo"])
    table = speed.table(d.prompt_mean, r["uncached_mean"])
    n = r["decode_per_rank"] if n is None else n
    m = n * speed.ranks
    top = r["decode_max_per_rank"]
    n90 = max(min(poisson.ppf(0.9, m) / speed.ranks, top), n)
    w = float(table.share_at(n))
    if w > 0.1:
        u = float(d.colocated_reuse.uncached_quantile(r["cache_per_agent_tokens"],
                                                      (w - 0.1) / w))
        chunk = min(u, speed.budget - n90 * (1 + speed.draft_tokens))
        return float(table.busy_at(n90, np.array(chunk)))
    q = min(0.9 / (1 - w), 0.999)
    n_idle = max(min((1 + poisson.ppf(q, m)) / speed.ranks, top), n)
    return float(table.idle_at(n_idle))


def test_every_candidate_sits_where_its_formulas_balance(screened):
    df, screen = screened
    d = screen.demand
    # 2 rack counts x DEP4 / DEP8 decode x 1 / 2 decode instances x 1-3 DEP2 prefills, and
    # 2 rack counts x DEP4 / DEP8 colocated x 1 / 2 instances
    assert len(df) == 2 * 2 * 2 * 3 + 2 * 2 * 2
    assert (df["family"] == "colocated").sum() == 8
    for _, r in df[df["family"] == "disaggregated"].iterrows():
        lam = r["output_tok_s_gpu"] * r["gpus_per_rack_used"] / d.output_mean  # requests/s
        speed = screen.serving_speed(r["hardware"], r["family"], r["decode_gpus"],
                                     r["decode_dbo"])
        t_ms = speed.step_at(r["decode_per_rank"])
        assert t_ms == pytest.approx(r["decode_step_ms"], rel=1e-12)
        # Little at each decode instance: requests in it = its rate x steps x step time
        assert r["decode_per_rank"] * speed.ranks == pytest.approx(
            lam / r["decode_instances"] * d.decode_steps_mean * t_ms / 1e3, rel=1e-9)
        # M/G/1 per prefill instance
        lam_p, mu = lam / r["prefill_instances"], r["prefill_mu_tok_s"]
        rho = lam_p * r["uncached_mean"] / mu
        assert r["prefill_utilisation"] == pytest.approx(rho, rel=1e-9)
        # closed loop: agents = session rate x session duration at these latencies
        _, ttft, tpot = hand_point(r, screen)
        assert lam / d.requests_per_session * d.session_s(ttft, tpot) == pytest.approx(
            40 / r["racks"], rel=1e-6)
        # P90 interactivity at the P90 Poisson occupancy
        n90 = occupancy_quantile(np.array([r["decode_per_rank"] * speed.ranks]), 0.9)[0]
        assert r["interactivity_tok_s"] == pytest.approx(
            3.25 / speed.step_at(max(n90 / speed.ranks, r["decode_per_rank"])) * 1e3, rel=1e-9)
        assert r["fleet_usd_h"] == pytest.approx(r["racks"] * 72 * 5.0)


def test_colocated_candidates_sit_where_their_formulas_balance(screened):
    """Little at the colocated instance, its prefill load against the room its decode leaves,
    the closed loop over the agents, and P90 interactivity at the tokens' P90 step."""
    df, screen = screened
    d = screen.demand
    col = df[df["family"] == "colocated"]
    assert set(col["layout"]) == {"C1xDEP4", "C2xDEP4", "C1xDEP8", "C2xDEP8"}
    for _, r in col.iterrows():
        speed = screen.serving_speed(r["hardware"], "colocated", r["colocated_gpus"],
                                     r["colocated_dbo"])
        table = speed.table(d.prompt_mean, r["uncached_mean"])
        n = r["decode_per_rank"]
        lam = r["output_tok_s_gpu"] * r["gpus_per_rack_used"] / d.output_mean
        t_ms = table.step_at(n)
        assert r["decode_step_ms"] == pytest.approx(t_ms, rel=1e-12)
        assert n * speed.ranks == pytest.approx(
            lam / r["colocated_instances"] * d.decode_steps_mean * t_ms / 1e3, rel=1e-9)
        free = speed.budget - n * (1 + speed.draft_tokens)
        rho = lam / (r["colocated_instances"] * speed.ranks) * r["uncached_mean"] \
            / (free / table.busy_at(n) * 1e3)
        assert r["prefill_utilisation"] == pytest.approx(rho, rel=1e-9)
        _, ttft, tpot = hand_point(r, screen)
        assert lam / d.requests_per_session * d.session_s(ttft, tpot) == pytest.approx(
            40 / r["racks"], rel=1e-6)
        assert r["interactivity_tok_s"] == pytest.approx(
            3.25 / colocated_p90_step(r, screen) * 1e3, rel=1e-9)
        # the mixed steps are longer than the same decode without prefill
        dec = screen.serving_speed(r["hardware"], "disaggregated", r["colocated_gpus"], False)
        assert table.busy_at(n) > dec.step_at(n)


@settings(max_examples=60, deadline=None)
@given(x=st.floats(1e-4, 5.0), idle=st.floats(1.0, 50.0), ratio=st.floats(1.0, 40.0))
def test_busy_share_is_the_chains_stationary_share(x, idle, ratio):
    """Steps of one length: 1 - exp(-x) (arrivals per step Poisson); a longer busy step: its
    share solves p = B / (1 - A + B) at x / (mean step) arrivals per ms, and is no larger."""
    busy = idle * ratio
    p = busy_share(x, idle, busy)
    rate = x / (p * busy + (1 - p) * idle)
    a, b = -math.expm1(-rate * busy), -math.expm1(-rate * idle)
    assert p == pytest.approx(b / (1 - a + b), rel=1e-9, abs=1e-12)
    assert p <= -math.expm1(-x) * (1 + 1e-9)
    assert busy_share(x, idle, idle) == pytest.approx(-math.expm1(-x), rel=1e-9)


def test_a_colocated_first_token_waits_the_step_in_progress_then_its_own_chunks():
    """`ColocatedTable.first_token_ms` against a simulated instant: steps drawn busy (a
    share of 0.3, each chunk step of the prompts equally likely) or idle, one picked by its
    length (a random instant falls in it), the prompt arriving uniformly within it, then a
    random prompt's own chunks (full-budget ones, then the rest). Means agree within 1 %,
    the median and P90 within 2 %."""
    per_rank = np.array([1.0, 4.0])
    table = ColocatedTable(per_rank=per_rank, idle_ms=np.array([5.0, 8.0]),
                           busy_ms=np.array([45.0, 50.0]), small_ms=np.array([15.0, 18.0]),
                           chunk=np.array([2000.0, 2000.0]), busy_share=np.array([0.3, 0.3]))
    prompts = np.array([[100.0, 1500.0, 5000.0, 9000.0]] * 2)
    free = np.array([4000.0, 3000.0])
    got = table.first_token_ms(per_rank, prompts, free, (0.5, 0.9))
    rng = np.random.default_rng(7)
    for i, n in enumerate(per_rank):
        def step(c: float, n: float = n) -> float:
            return float(table.busy_at(n, np.array(c)))
        own, chunks = [], []
        for u in prompts[i]:
            k = math.ceil(u / free[i])
            lengths = [step(free[i])] * (k - 1) + [step(u - (k - 1) * free[i])]
            own.append(sum(lengths))
            chunks.extend(lengths)
        size = 400_000
        busy = rng.random(size) < 0.3
        t = np.where(busy, rng.choice(chunks, size), float(table.idle_at(n)))
        picked = rng.choice(t, size, p=t / t.sum())
        first = picked * rng.random(size) + rng.choice(own, size)
        assert got[0][i] == pytest.approx(first.mean(), rel=0.01)
        assert got[1][i] == pytest.approx(np.quantile(first, 0.5), rel=0.02)
        assert got[2][i] == pytest.approx(np.quantile(first, 0.9), rel=0.02)


def test_colocated_p90_step_follows_the_tokens_share_of_busy_steps(screened):
    """Over the occupancy, a colocated instance's P90 step never shortens: idle steps (longer
    with more requests) while steps carrying prefill emit under a tenth of the tokens, then
    busy steps with larger chunks as they emit more; the jump between them is the floor a
    prompt's chunk adds to a step. Each point as the hand formula has it."""
    df, screen = screened
    d = screen.demand
    r = df[(df["family"] == "colocated") & (df["layout"] == "C1xDEP8")].iloc[0]
    speed = screen.serving_speed(r["hardware"], "colocated", 8, False)
    table = speed.table(d.prompt_mean, r["uncached_mean"])
    # a chunk's step is affine between a one-token request's and the mean request's
    at = table.per_rank
    assert table.busy_at(at, table.chunk) == pytest.approx(table.busy_ms, rel=1e-12)
    assert table.busy_at(at, np.ones(len(at))) == pytest.approx(table.small_ms, rel=1e-12)
    assert np.all(table.small_ms > table.idle_ms)
    n = np.linspace(0.05, r["decode_max_per_rank"], 4000)
    rows = pd.DataFrame([r] * len(n))
    n90 = np.clip(occupancy_quantile(n * speed.ranks, 0.9) / speed.ranks, n,
                  r["decode_max_per_rank"])
    got, edge = screen._colocated_p90_ms(rows, n, n90, speed, table)
    assert np.all(np.diff(got) >= -1e-9)
    w = table.share_at(n)
    idle, busy = w <= 0.1, w > 0.1
    assert idle.any() and busy.any()
    assert got[idle].max() < table.busy_at(n[busy][0], np.array(1.0))
    for i in np.linspace(0, len(n) - 1, 12).astype(int):
        assert got[i] == pytest.approx(colocated_p90_step(r, screen, n[i]), rel=1e-9)
    # the knife-edge: within 0.01 of a tenth, the other kind's step beside the rule's
    near = np.abs(w - 0.1) < KNIFE_EDGE_SHARE
    assert (near & idle).any() and (near & busy).any()
    assert np.all(np.isnan(edge) == ~near)
    smallest = float(d.colocated_reuse.uncached_quantile(r["cache_per_agent_tokens"], 0.0))
    for i in np.flatnonzero(near & idle):  # the shortest busy step: the fewest uncached tokens
        chunk = min(smallest, speed.budget - n90[i] * (1 + speed.draft_tokens))
        assert edge[i] == pytest.approx(float(table.busy_at(n90[i], np.array(chunk))),
                                        rel=1e-9)
        assert edge[i] > got[i]
    for i in np.flatnonzero(near & busy):  # the longest idle step: the 0.999 occupancy
        n_idle = max(min((1 + poisson.ppf(0.999, n[i] * speed.ranks)) / speed.ranks,
                         r["decode_max_per_rank"]), n[i])
        assert edge[i] == pytest.approx(float(table.idle_at(n_idle)), rel=1e-9)
        assert edge[i] < got[i]


def test_more_racks_never_serve_a_rack_worse(screened):
    df, _ = screened
    for _, g in df.sort_values("racks").groupby(["hardware", "layout"]):
        assert (np.diff(g["ttft_p90_ms"].to_numpy()) <= 1e-9).all()
        assert (np.diff(g["interactivity_tok_s"].to_numpy()) >= -1e-9).all()
        assert (np.diff(g["fleet_usd_h"].to_numpy()) > 0).all()


def test_sessions_per_hour_demand_runs_at_that_rate(small_inputs):
    plan = small_inputs.plan.model_copy(update={"demand": small_inputs.plan.demand.model_copy(
        update={"agents": None, "sessions_per_hour": 360.0})})
    cfg = small_inputs.scenario
    demand = profile_demand(load_sessions(cfg.workload, cfg.seed), 3.25, lanes=24)
    screen = Screen(cfg, plan, small_inputs.hardware, demand)
    for _, r in screen.run().iterrows():
        lam, ttft, tpot = hand_point(r, screen)
        # 360 sessions/h = 0.1 sessions/s over the fleet, split over its racks
        assert lam / demand.requests_per_session == pytest.approx(0.1 / r["racks"], rel=1e-6)
        # Little: the agents that rate keeps busy for a session each
        assert r["agents_per_rack"] == pytest.approx(
            0.1 / r["racks"] * demand.session_s(ttft, tpot), rel=1e-6)


def test_a_generated_model_on_another_gpu_screens_with_its_own_profile(tmp_path):
    """Any model x GPU pair with a calibration profile plans without code changes: the
    screen prices each hardware option with that option's profile."""
    from plan_support import SMALL, compose_plan

    from rackSim.calibrate.scenario import model_overrides
    from rackSim.plan.screen import layout_config

    profile = "calibration/h200_hgx__qwen3_235b_a22b.yaml"
    inputs = compose_plan([
        *[o for o in SMALL if not o.startswith("plan.hardware")],
        *model_overrides("qwen3_235b_a22b"),  # with perf.weight_dtype=fp8: H200 has no fp4
        f"plan.hardware=[{{name: h200_hgx, rental_usd_per_gpu_hour: 3.0, profile: {profile}}}]",
        "plan.space.decode_gpus=[4,8]", "plan.space.prefill_gpus_per_instance=[2,4]"])
    screen = screen_for(inputs, 1.0)
    rows = screen.run()
    assert len(rows) > 0 and set(rows["hardware"]) == {"h200_hgx"}
    lay = next(lay for lay in rack_layouts(inputs.plan.space, 8)
               if (lay.prefill_gpus, lay.decode_gpus) == (4, 4))
    priced = layout_config(inputs.scenario, inputs.hardware["h200_hgx"], lay,
                           inputs.plan.option("h200_hgx").profile)
    assert priced.perf.profile.name == "h200_hgx__qwen3_235b_a22b.yaml"
    assert priced.model.num_routed_experts == 128 and priced.hardware.name.startswith("H200")


def test_colocated_candidates_take_the_decode_instances_overlap_and_kernels():
    """A disaggregated scenario's colocated candidates serve as its decode instances do: the
    same all-to-all kernels and dual-batch overlap settings (here on, for a model served with
    DeepEP kernels), so `racksim-plan ... deployment.decode.dbo.enabled=true` prices both
    families with it."""
    from rackSim.config import compose_scenario
    from rackSim.plan.layout import RackLayout
    from rackSim.plan.screen import layout_config

    cfg = compose_scenario([
        "model=deepseek_v3", "perf.profile=calibration/gb300_nvl72__deepseek_v3.yaml",
        "perf.weight_dtype=fp8", "deployment.prefill.gpus_per_instance=4",
        "deployment.decode.dbo.enabled=true", "deployment.decode.dbo.decode_token_threshold=64"])
    col = layout_config(cfg, load_hardware("gb300_nvl72"),
                        RackLayout("colocated", 0, 0, 0, 0, 2, 16), space=Space()
                        ).deployment.colocated
    assert col.dbo == cfg.deployment.decode.dbo and col.dbo.decode_token_threshold == 64
    assert col.all2all_backend == cfg.deployment.decode.all2all_backend


def test_rack_layouts_search_the_overlap_per_instance_kind():
    """Each overlap setting listed is a layout of its own, marked in its name and family."""
    space = Space(prefill_gpus_per_instance=[2], prefill_instances_max=1, decode_gpus=[4],
                  colocated_gpus=[8], colocated_instances_max=1, prefill_dbo=[False, True],
                  decode_dbo=[True], colocated_dbo=[False, True])
    lays = list(rack_layouts(space, 8))
    assert [lay.name for lay in lays] == ["P1xDEP2+DEP4(dbo)", "P1xDEP2(dbo)+DEP4(dbo)",
                                          "C1xDEP8", "C1xDEP8(dbo)"]
    assert [lay.family_key for lay in lays] == [
        "disaggregated: DEP2 prefill + DEP4(dbo) decode",
        "disaggregated: DEP2(dbo) prefill + DEP4(dbo) decode",
        "colocated: DEP8 instances", "colocated: DEP8(dbo) instances"]
    # unset: one layout per width, its overlap left to the scenario
    unset = Space(families=["disaggregated"], decode_gpus=[4])
    assert [lay.prefill_dbo for lay in rack_layouts(unset, 8)] == [None, None]


DEEPSEEK_V3_ON_GB300 = [
    *[o for o in SMALL if not o.startswith("plan.space.prefill_gpus")],
    "model=deepseek_v3", "perf.profile=calibration/gb300_nvl72__deepseek_v3.yaml",
    "perf.weight_dtype=fp8", "deployment.prefill.gpus_per_instance=4",
    "deployment.prefill.dbo.prefill_token_threshold=256",
    "plan.space.prefill_gpus_per_instance=[4]", "plan.space.prefill_instances_max=2",
    "+plan.space.prefill_dbo=[false,true]", "+plan.space.decode_dbo=[false,true]",
    "+plan.space.colocated_dbo=[false,true]"]


def test_the_screen_searches_dual_batch_overlap_on_deepep_kernels(tmp_path):
    """DeepSeek-V3 on its generated GB300 profile (DeepEP kernels): every layout with and
    without the overlap per instance kind. The overlapped prefill instance computes faster
    (its all-to-all hidden); the overlapped decode instance prices steps under the token
    threshold exactly as without it and larger ones differently; a confirmed candidate runs
    with the overlap on and the scenario's own thresholds."""
    from rackSim.plan.confirm import candidate_config, write_candidates
    from rackSim.plan.screen import layout_config

    inputs = compose_plan(DEEPSEEK_V3_ON_GB300)
    screen = screen_for(inputs, 1.0)
    rows = screen.run()
    assert not screen.rejected
    assert {"P2xDEP4+DEP8", "P2xDEP4(dbo)+DEP8", "P2xDEP4+DEP8(dbo)",
            "P2xDEP4(dbo)+DEP8(dbo)", "C1xDEP8", "C1xDEP8(dbo)"} <= set(rows["layout"])
    dis = rows[(rows["family"] == "disaggregated") & ~rows["decode_dbo"]]
    mu = dis.groupby("prefill_dbo")["prefill_mu_tok_s"].max()
    assert mu[True] > 1.05 * mu[False]
    hw = "gb300_nvl72"
    off, on = (screen.serving_speed(hw, "disaggregated", 8, o) for o in (False, True))
    q = 1 + on.draft_tokens  # tokens a decoding request puts in a step
    under, over = np.array([31 // q]), np.array([64.0])
    assert on.step_at(under)[0] == off.step_at(under)[0]
    assert on.step_at(over)[0] != off.step_at(over)[0]
    col = rows[(rows["family"] == "colocated") & (rows["racks"] == 1)].set_index("layout")
    assert col.loc["C1xDEP8(dbo)", "decode_step_ms"] != col.loc["C1xDEP8", "decode_step_ms"]

    row = rows[(rows["layout"] == "P2xDEP4(dbo)+DEP8") & (rows["racks"] == 1)].iloc[0]
    cfg = inputs.scenario
    dep = candidate_config(row, inputs.plan, cfg)["deployment"]
    assert dep["prefill"]["dbo"] == {"enabled": True}
    assert dep["decode"]["dbo"] == {"enabled": False}
    lay = next(lay for lay in rack_layouts(screen.space, 72) if lay.name == row["layout"])
    priced = layout_config(cfg, inputs.hardware[hw], lay, space=screen.space).deployment
    assert priced.prefill.dbo.enabled and priced.prefill.dbo.prefill_token_threshold == 256
    assert not priced.decode.dbo.enabled
    (name,) = write_candidates(rows.loc[[row.name]], inputs.plan, tmp_path, cfg)
    assert name.startswith("gb300_nvl72_p2x4dbo_d1x8_r1_")


def test_a_profile_that_cannot_overlap_refuses_those_families_only():
    """The reference profile's MegaMoE kernel has no all-to-all of its own to hide: searched
    with and without the overlap, the overlapped families are refused with the step model's
    reason and the rest are screened; searched with it only, the plan stops naming it."""
    from rackSim.plan.choose import families
    from rackSim.plan.inputs import PlanError

    both = compose_plan([*SMALL, "plan.space.families=[disaggregated]",
                         "+plan.space.prefill_dbo=[false,true]"])
    screen = screen_for(both, 3.25)
    rows = screen.run()
    assert len(rows) and not rows["prefill_dbo"].any()
    why = families(rows, screen.rejected, rows.iloc[0:0]).set_index("family")["why"]
    refused = why["disaggregated: DEP2(dbo) prefill + DEP4 decode"]
    assert "deployment.prefill.dbo.enabled" in refused and "MegaMoE" in refused
    only = compose_plan([*SMALL, "+plan.space.prefill_dbo=[true]",
                         "+plan.space.colocated_dbo=[true]"])
    with pytest.raises(PlanError, match="no layout of plan.space can run") as err:
        screen_for(only, 3.25).run()
    assert "MegaMoE" in str(err.value)


def test_rank_loads_spread_as_poisson_and_grow_with_the_mean():
    """Per pass, each rank's count is its Poisson quantile at one fixed uniform: a larger
    mean never gives a rank fewer requests (the table stays monotone), the counts average the
    mean, the cap holds, the seed decides, and a TP instance holds the mean."""
    from rackSim.plan.speeds import DECODE_TABLE_PASSES

    loads = RankLoads(32, 24, seed=0)
    means = [0.0, 2.0, 8.0, 10.0, 20.0]
    draws = {n: np.array([loads.draw(n, k) for k in range(DECODE_TABLE_PASSES)])
             for n in means}
    for lo, hi in zip(means, means[1:], strict=False):
        assert (draws[lo] <= draws[hi]).all()
    assert (draws[0.0] == 0).all() and draws[20.0].max() <= 24
    for n in (8.0, 10.0):  # 256 counts: the mean within 3 standard errors
        assert abs(draws[n].mean() - n) < 3 * math.sqrt(n / draws[n].size)
        assert draws[n].min() < n < draws[n].max()
    assert loads.draw(10.0, 3) == RankLoads(32, 24, seed=0).draw(10.0, 3)
    assert loads.draw(10.0, 3) != RankLoads(32, 24, seed=1).draw(10.0, 3)
    assert RankLoads(1, 24, seed=0).draw(10.4, 0) == [10]


def test_a_full_rank_spills_to_the_least_loaded():
    """Requests beyond a rank's cap go one at a time to the first least-loaded rank with
    room, as the engine places them: by hand, and against that placement request by request
    on random loads; beyond every rank's room they are dropped."""
    assert fill_least_loaded(np.array([3, 1, 1, 5]), 3, 6).tolist() == [3, 3, 2, 5]
    assert fill_least_loaded(np.array([6, 5, 6]), 4, 6).tolist() == [6, 6, 6]
    rng = np.random.default_rng(0)
    for _ in range(200):
        loads = rng.integers(0, 9, size=int(rng.integers(2, 12)))
        extra = int(rng.integers(0, 40))
        one_by_one = loads.tolist()
        for _ in range(extra):
            low = min(one_by_one)
            if low >= 8:
                break
            one_by_one[one_by_one.index(low)] += 1
        assert fill_least_loaded(loads, extra, 8).tolist() == one_by_one


def test_rank_loads_keep_their_mean_up_to_a_full_instance():
    """At a DEP16 instance's cap of 96 a rank, Poisson counts clipped alone averaged 92 (the
    table priced a full instance's steps with 4 % fewer requests); spilled to the
    least-loaded ranks they keep the mean: over the 8 passes, within 3 standard errors of
    the mean below the cap, and a full instance stays full but where a pass's total falls
    short of it."""
    from rackSim.plan.speeds import DECODE_TABLE_PASSES

    loads = RankLoads(16, 96, seed=0)
    for mean in (90.0, 94.0, 95.1):
        got = np.array([loads.draw(mean, k) for k in range(DECODE_TABLE_PASSES)])
        assert abs(got.mean() - mean) < 3 * math.sqrt(mean / got.size)
        assert got.max() <= 96
    full = np.array([loads.draw(96.0, k) for k in range(DECODE_TABLE_PASSES)])
    uncapped = np.array([RankLoads(16, 10**6, seed=0).draw(96.0, k)
                         for k in range(DECODE_TABLE_PASSES)])  # the same uniforms
    assert np.minimum(uncapped, 96).mean() < 93  # clipped alone
    assert (full.sum(axis=1) == np.minimum(uncapped.sum(axis=1), 96 * 16)).all()


def test_the_busiest_rank_sets_the_decode_table():
    """DeepSeek-V3's DEP16 on GB200 at 10 requests a rank of 36K tokens: the table's step lies
    above every rank at the mean (the busiest rank's attention) and below every rank at the
    most any pass drew. Overlapped (8 requests a rank reach its threshold with 3 drafts),
    steps a rank under the threshold vetoes are priced whole: at a mean of 8, the threshold
    itself, no pass splits (every rank at the mean would split every step), at 64 every one
    does."""
    from rackSim.config import compose_scenario, with_changes
    from rackSim.perf import DecodeBatch, build_step_model

    cfg = compose_scenario(["model=deepseek_v3", "perf.weight_dtype=fp8",
                            "hardware=gb200_nvl72",
                            "perf.profile=calibration/gb200_nvl72__deepseek_v3.yaml",
                            "deployment.prefill.gpus_per_instance=8",
                            "deployment.prefill.instances=4", "deployment.decode.gpus=16"])
    ctx = 36_000.0
    speed = decode_speed(cfg, ctx)
    model = build_step_model(cfg, "decode", seed=cfg.seed)

    def uniform(n: int) -> float:
        return model.decode_step(DecodeBatch([n] * 16, [n * ctx] * 16, 3.25, 3, 0, 0,
                                             97)).total_ms

    most = max(max(RankLoads(16, 128, cfg.seed).draw(10.0, k)) for k in range(8))
    assert uniform(10) * 1.05 < speed.step_at(10.0) < uniform(most)
    on = decode_speed(with_changes(cfg, deployment={"decode": {"dbo": {"enabled": True}}}),
                      ctx)
    assert on.step_at(8.0) == speed.step_at(8.0)
    assert on.step_at(64.0) != speed.step_at(64.0)
