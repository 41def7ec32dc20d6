"""Stage 1, the screen: every candidate fleet priced with `perf/` speeds and queueing bounds
(no event loop), thousands in seconds.

One rack of a candidate serves `agents / racks` agents (session affinity to a rack). Its
operating point is the decode occupancy `n` (requests per DP rank) at which the closed loop
balances, found by bisection (vectorised over all candidates):

* decode (Little): an instance with n requests per rank steps every T(n) ms and a request
  stays `steps` steps, so it completes ``lambda_d = n x ranks / (steps x T(n))`` requests/s;
  the rack completes ``lambda = decode_instances x lambda_d``;
* prefill: each request brings `u` uncached tokens (`DemandProfile.prefill_reuse`; a
  colocated instance keeps the outputs it decoded: `colocated_reuse`). A prefill instance
  (session affinity) batches: each step computes what arrived during the one before, a step
  of x tokens taking a + b x (`PrefillSpeed.affine`), so a request waits for the rest of the
  step in progress and then takes its own (`queueing.batched_prefill_s`, its quantiles a
  gamma's); it saturates at its full-budget rate mu, ``rho = lambda_p E[u] / mu``. A
  colocated instance's DP rank is an M/G/1 queue served at the budget its decode leaves per
  busy step: the Pollaczek-Khinchine wait ``W = lambda_p E[u^2] / mu^2 / (2 (1 - rho))``,
  with the usual exponential tail for its P50 / P90 (rackSim.plan.queueing);
* TTFT = the prefill time + KV push + half a decode step (the step in progress) + the first
  decode step (colocated: wait + the rest of the step in progress, taken length-biased, then
  the request's own chunks' steps); TPOT = T(n) / accepted tokens per step;
* closed loop (Little over the agents): ``agents = lambda_s x session duration(TTFT, TPOT)``
  with ``lambda_s = lambda / requests per session``; open loop (sessions per hour):
  ``lambda_s`` is given.

If decode saturates (n reaches max_num_seqs or the KV limit), or a prefill instance reaches its
full-budget rate, before the agents are absorbed, the excess agents wait (Little) and their
wait is added to TTFT. P90
interactivity is taken at the 90th percentile of the instance's occupancy (Poisson, the
M/G/infinity count) spread over its ranks: ``a / T(n90)``; a colocated instance's at the step
that 90 % of its tokens wait less for, idle or carrying a chunk by the share of the tokens its
steps with prefill emit (`Screen._colocated_p90_ms`; where that share is within
`KNIFE_EDGE_SHARE` of a tenth, `interactivity_edge_tok_s` gives the other kind's). The DES
confirmation measures how far off the screen is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ValidationError

from rackSim.config import with_changes
from rackSim.config.errors import ScenarioError
from rackSim.config.specs import HardwareSpec, RunConfig
from rackSim.plan.demand import DemandProfile
from rackSim.plan.inputs import PlanError
from rackSim.plan.layout import RackLayout, rack_layouts, smallest_layouts
from rackSim.plan.queueing import (
    batched_prefill_s,
    gamma_quantile,
    mg1_wait_s,
    occupancy_quantile,
    wait_quantile_s,
)
from rackSim.plan.spec import PlanSpec, Space
from rackSim.plan.speeds import (
    ColocatedSpeed,
    ColocatedTable,
    DecodeSpeed,
    PrefillSpeed,
    decode_speed,
)

BISECTION_STEPS = 48
#: Within this of a tenth, the tokens' share from a colocated instance's steps carrying
#: prefill does not tell on which kind of step its P90 falls: the screen's share was 0.002 to
#: 0.006 from the simulation's at four loads (docs/planner.md, stage 1), and the P90 jumps
#: between the longest idle step and the shortest busy one at a tenth.
KNIFE_EDGE_SHARE = 0.01
#: Equally likely uncached prompts that stand for their distribution (quantile levels: the
#: middles of twenty equal slices) where a colocated step's length depends on its chunk.
PROMPT_LEVELS = (np.arange(20) + 0.5) / 20


@dataclass(frozen=True)
class Rejected:
    """A rack layout the scenario's rules refuse, with the validator's message."""

    hardware: str  # the plan's hardware option
    family: str
    reason: str


def colocated_settings(cfg: RunConfig, space: Space) -> dict:
    """The colocated instances' settings a candidate takes: the scenario's
    `deployment.colocated`, or the decode instance's batch, all-to-all kernels, dual-batch
    overlap and speculative decoding with the space's token budget."""
    if cfg.deployment.colocated is not None:
        return cfg.deployment.colocated.model_dump()
    dec = cfg.deployment.decode
    return {"instances": 0, "gpus": dec.gpus, "parallelism": "DEP",
            "all2all_backend": dec.all2all_backend, "dbo": dec.dbo.model_dump(),
            "max_num_batched_tokens": space.colocated_budget_tokens,
            "max_num_seqs_per_rank": dec.max_num_seqs_per_rank,
            "speculative": dec.speculative.model_dump()}


def searched_space(cfg: RunConfig, space: Space) -> Space:
    """`space` with each unset overlap setting (`*_dbo`) the scenario's own, so that every
    layout says whether its instances overlap."""
    return space.model_copy(update={
        "prefill_dbo": space.prefill_dbo or [cfg.deployment.prefill.dbo.enabled],
        "decode_dbo": space.decode_dbo or [cfg.deployment.decode.dbo.enabled],
        "colocated_dbo": space.colocated_dbo or [
            colocated_settings(cfg, space)["dbo"]["enabled"]]})


def _overlap(enabled: bool | None) -> dict:
    """A prefill or decode section's change for a layout's overlap setting (None: none;
    the thresholds and SM split stay the scenario's)."""
    return {} if enabled is None else {"dbo": {"enabled": enabled}}


def layout_deployment(cfg: RunConfig, layout: RackLayout, space: Space) -> dict:
    """The deployment changes that make `cfg` one rack of `layout`."""
    if layout.family == "colocated":
        col = colocated_settings(cfg, space)
        dbo = col["dbo"] if layout.colocated_dbo is None else dict(
            col["dbo"], enabled=layout.colocated_dbo)
        col = dict(col, instances=layout.colocated_instances, gpus=layout.colocated_gpus,
                   parallelism="DEP", dbo=dbo)
        return {"racks": 1, "prefill": {"instances": 0}, "decode": {"instances": 0},
                "colocated": col}
    dep: dict = {"racks": 1,
                 "prefill": {"instances": layout.prefill_instances,
                             "gpus_per_instance": layout.prefill_gpus,
                             **_overlap(layout.prefill_dbo)},
                 "decode": {"instances": layout.decode_instances, "gpus": layout.decode_gpus,
                            **_overlap(layout.decode_dbo)}}
    if cfg.deployment.colocated is not None:  # a colocated base scenario: none here
        dep["colocated"] = {"instances": 0}
    return dep


def layout_config(cfg: RunConfig, hw: HardwareSpec, layout: RackLayout,
                  profile: Path | None = None, space: Space | None = None) -> RunConfig:
    """`cfg` as one rack of `layout` on hardware `hw` (priced by `profile` when given),
    validated by the scenario's rules (fits the rack and its NVLink domains, experts spread,
    KV room)."""
    perf = {"profile": str(profile)} if profile is not None else {}
    return with_changes(cfg, hardware=hw.model_dump(), perf=perf,
                        deployment=layout_deployment(cfg, layout, space or Space()))


class Screen:
    """Prices candidate fleets of `plan` for the workload `demand` of scenario `cfg`."""

    def __init__(self, cfg: RunConfig, plan: PlanSpec, hardware: Mapping[str, HardwareSpec],
                 demand: DemandProfile):
        self.cfg, self.plan, self.hardware, self.demand = cfg, plan, hardware, demand
        self.space = searched_space(cfg, plan.space)
        self.rejected: list[Rejected] = []
        # speeds by (hardware option, instance width, dual-batch overlap)
        self._decode: dict[tuple[str, int, bool], DecodeSpeed] = {}
        self._prefill: dict[tuple[str, int, bool], PrefillSpeed] = {}
        self._colocated: dict[tuple[str, int, bool], ColocatedSpeed] = {}

    def _reject(self, option: str, layout: RackLayout, reason: str) -> None:
        self.rejected.append(Rejected(option, layout.family_key, reason))

    def _config(self, option: str, layout: RackLayout) -> RunConfig | None:
        """One rack of `layout` on `option`, or None (recorded as rejected) if it breaks the
        scenario's rules."""
        try:
            return layout_config(self.cfg, self.hardware[option], layout,
                                 self.plan.option(option).profile, self.space)
        except ValidationError as err:
            self._reject(option, layout, "; ".join(
                e["msg"].removeprefix("Value error, ") for e in err.errors()))
            return None

    def _speeds(self, option: str, layout: RackLayout
                ) -> tuple[DecodeSpeed, PrefillSpeed] | None:
        dk = (option, layout.decode_gpus, bool(layout.decode_dbo))
        pk = (option, layout.prefill_gpus, bool(layout.prefill_dbo))
        cfg = self._config(option, layout)
        if cfg is None:
            return None
        try:  # a step model refuses what the profile cannot price (an overlap of MegaMoE)
            if dk not in self._decode:
                self._decode[dk] = decode_speed(cfg, self.demand.decode_context_mean)
            if pk not in self._prefill:
                self._prefill[pk] = PrefillSpeed(cfg)
        except ScenarioError as err:
            self._reject(option, layout, str(err))
            return None
        return self._decode[dk], self._prefill[pk]

    def _colocated_speed(self, option: str, layout: RackLayout) -> ColocatedSpeed | None:
        key = (option, layout.colocated_gpus, bool(layout.colocated_dbo))
        if key not in self._colocated:
            cfg = self._config(option, layout)
            if cfg is None:
                return None
            try:
                self._colocated[key] = ColocatedSpeed(cfg, self.demand.decode_context_mean,
                                                      self.demand.decode_steps_mean)
            except ScenarioError as err:
                self._reject(option, layout, str(err))
                return None
        return self._colocated[key]

    def serving_speed(self, hardware: str, family: str, width: int, dbo: bool
                      ) -> DecodeSpeed | ColocatedSpeed:
        """The speed of a candidate's instances that decode (its `serving_*` columns)."""
        return (self._colocated if family == "colocated" else self._decode)[
            (hardware, width, dbo)]

    def candidates(self) -> pd.DataFrame:
        """One row per candidate (hardware x racks x layout) with its per-rack inputs."""
        rows = []
        d, pl = self.demand, self.plan
        for opt in pl.hardware:
            hw = self.hardware[opt.name]
            price = opt.usd_per_gpu_hour(hw)
            for first in smallest_layouts(self.space):
                if first.gpus > hw.gpus_per_rack:
                    self.rejected.append(Rejected(opt.name, first.family_key, (
                        f"{first.name} takes {first.gpus} GPUs; a rack holds "
                        f"{hw.gpus_per_rack}")))
            for lay in rack_layouts(self.space, hw.gpus_per_rack):
                if lay.family == "colocated":
                    col = self._colocated_speed(opt.name, lay)
                    if col is not None:
                        rows.extend(self._colocated_rows(opt.name, hw, price, lay, col))
                    continue
                speeds = self._speeds(opt.name, lay)
                if speeds is None:
                    continue
                dec, pre = speeds
                for racks in range(1, pl.limits.max_racks + 1):
                    agents, sessions_s = self._agents(racks)
                    cache = lay.prefill_instances * pre.cache_tokens / max(agents, 1e-9)
                    u_mean, u_sq, u90 = d.prefill_reuse.uncached(cache)
                    mu, _ = pre.rate(d.prompt_mean, u_mean)
                    fixed_ms, per_token_ms = pre.affine(d.prompt_mean, u_mean)
                    rows.append({
                        **self._common(opt.name, hw, price, lay, racks, agents, sessions_s),
                        "serving_instances": lay.decode_instances, "serving_gpus": lay.decode_gpus,
                        "serving_dbo": bool(lay.decode_dbo),
                        "cache_per_agent_tokens": cache, "uncached_mean": u_mean,
                        "uncached_sq_mean": u_sq, "uncached_p90": u90, "prefill_mu_tok_s": mu,
                        "prefill_fixed_ms": fixed_ms, "prefill_ms_per_token": per_token_ms,
                        "prefill_budget_tokens": pre.budget,
                        "push_mean_s": pre.push_ms(d.prompt_mean) / 1e3,
                        "push_p90_s": pre.push_ms(d.prompt_p90) / 1e3,
                        "decode_max_per_rank": dec.max_per_rank,
                    })
        return pd.DataFrame(rows)

    def _agents(self, racks: int) -> tuple[float, float]:
        """(agents, sessions/s) one of `racks` racks serves; open loop: agents at nominal
        latencies, only to size the cache per agent."""
        pl, d = self.plan, self.demand
        if pl.demand.agents is not None:
            return pl.demand.agents / racks, math.nan
        sessions_s = pl.demand.sessions_per_hour / 3600.0 / racks
        return sessions_s * d.session_s(1.0, 0.005), sessions_s

    @staticmethod
    def _common(option: str, hw: HardwareSpec, price: float, lay: RackLayout, racks: int,
                agents: float, sessions_s: float) -> dict:
        return {"hardware": option, "family": lay.family, "family_key": lay.family_key,
                "layout": lay.name, "racks": racks, "prefill_instances": lay.prefill_instances,
                "prefill_gpus": lay.prefill_gpus, "decode_instances": lay.decode_instances,
                "decode_gpus": lay.decode_gpus, "colocated_instances": lay.colocated_instances,
                "colocated_gpus": lay.colocated_gpus, "prefill_dbo": bool(lay.prefill_dbo),
                "decode_dbo": bool(lay.decode_dbo), "colocated_dbo": bool(lay.colocated_dbo),
                "gpus_per_rack_used": lay.gpus,
                "gpus": racks * lay.gpus, "gpus_bought": racks * hw.gpus_per_rack,
                "price_usd_gpu_h": price, "agents_per_rack_in": agents,
                "sessions_s_per_rack_in": sessions_s}

    def _colocated_rows(self, option: str, hw: HardwareSpec, price: float, lay: RackLayout,
                        col: ColocatedSpeed) -> list[dict]:
        """Candidate rows of a colocated layout: its instances are both the prefill and the
        decode side (own prompt, wait and push are priced at the operating point)."""
        d, rows = self.demand, []
        for racks in range(1, self.plan.limits.max_racks + 1):
            agents, sessions_s = self._agents(racks)
            cache = lay.colocated_instances * col.cache_tokens / max(agents, 1e-9)
            u_mean, u_sq, u90 = d.colocated_reuse.uncached(cache)
            col.table(d.prompt_mean, u_mean)
            rows.append({
                **self._common(option, hw, price, lay, racks, agents, sessions_s),
                "serving_instances": lay.colocated_instances,
                "serving_gpus": lay.colocated_gpus,
                "serving_dbo": bool(lay.colocated_dbo), "cache_per_agent_tokens": cache,
                "uncached_mean": u_mean,
                "uncached_sq_mean": u_sq, "uncached_p90": u90, "prefill_mu_tok_s": math.nan,
                "prefill_fixed_ms": math.nan, "prefill_ms_per_token": math.nan,
                "prefill_budget_tokens": math.nan, "push_mean_s": 0.0,
                "push_p90_s": 0.0, "decode_max_per_rank": col.max_per_rank})
        return rows

    def _colocated_groups(self, df: pd.DataFrame):
        """(row indices, speed, table) of the colocated candidates, by speed and load."""
        col = df[df["family"] == "colocated"]
        for (hw, w, o, u), idx in col.groupby(["hardware", "serving_gpus", "serving_dbo",
                                               "uncached_mean"]).indices.items():
            speed = self._colocated[(hw, w, o)]
            yield col.index[idx], speed, speed.table(self.demand.prompt_mean, u)

    def _step_ms(self, df: pd.DataFrame, per_rank: np.ndarray, busy: bool = False
                 ) -> np.ndarray:
        """Step time (ms) of every candidate's decoding instances at `per_rank` requests per
        rank; colocated: the mean step, or with `busy` a step carrying a full prefill chunk."""
        out = np.full(len(df), np.nan)
        dis = df[df["family"] != "colocated"]
        for key, idx in dis.groupby(["hardware", "decode_gpus", "decode_dbo"]).indices.items():
            rows = df.index.get_indexer(dis.index[idx])
            out[rows] = self._decode[key].step_at(per_rank[rows])
        for index, _, table in self._colocated_groups(df):
            rows = df.index.get_indexer(index)
            out[rows] = (table.busy_at if busy else table.step_at)(per_rank[rows])
        return out

    def _prompt_levels(self, df: pd.DataFrame) -> np.ndarray:
        """(candidates, `PROMPT_LEVELS`): each candidate's equally likely uncached prompts
        (tokens) in the colocated view of reuse, at its cache per agent."""
        return self.demand.colocated_reuse.uncached_quantile(
            df["cache_per_agent_tokens"].to_numpy()[:, None], PROMPT_LEVELS)

    def _first_token_ms(self, df: pd.DataFrame, n: np.ndarray, free: np.ndarray,
                        prompts: np.ndarray, quantiles: tuple[float, ...] = ()
                        ) -> list[np.ndarray]:
        """A colocated prompt's time from reaching its rank to its first token (ms): mean,
        then `quantiles`, by `ColocatedTable.first_token_ms` over the candidates' `prompts`
        (`_prompt_levels`); NaN on disaggregated rows."""
        out = [np.full(len(df), np.nan) for _ in range(1 + len(quantiles))]
        for index, _, table in self._colocated_groups(df):
            rows = df.index.get_indexer(index)
            got = table.first_token_ms(n[rows], prompts[rows], free[rows], quantiles)
            for o, g in zip(out, got, strict=True):
                o[rows] = g
        return out

    def _point(self, df: pd.DataFrame, n: np.ndarray, prompts: np.ndarray
               ) -> dict[str, np.ndarray]:
        """Rates and mean latencies of every candidate at decode occupancy `n` per rank.

        Disaggregated: a request's time at its batching prefill instance
        (`queueing.batched_prefill_s`: mean `prefill_mean`, variance `prefill_var`), then the
        KV push and 1.5 decode steps (the one in progress and the first). Colocated: an
        M/G/1 queue per DP rank served at `free(n)` tokens per busy step (`wait`), then the
        rest of the step in progress and the request's own busy steps (`_first_token_ms` over
        `prompts`). `lead`: the decode steps a disaggregated TTFT adds (s)."""
        d = self.demand
        colocated = (df["family"] == "colocated").to_numpy()
        ranks = df["decode_ranks"].to_numpy()
        t_ms = self._step_ms(df, n)
        lam = df["serving_instances"].to_numpy() * n * ranks / (d.decode_steps_mean * t_ms
                                                                 / 1e3)
        u, u2 = df["uncached_mean"].to_numpy(), df["uncached_sq_mean"].to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            lam_p = np.where(colocated, lam / (df["serving_instances"].to_numpy() * ranks),
                             lam / df["prefill_instances"].to_numpy())
            busy_ms = self._step_ms(df, n, busy=True)
            free = df["free_budget"].to_numpy() - n * df["tokens_per_request"].to_numpy()
            mu = np.where(colocated, np.maximum(free, 0.0) / busy_ms * 1e3,
                          df["prefill_mu_tok_s"].to_numpy())
            rho, wait = mg1_wait_s(lam_p, u / mu, u2 / mu ** 2)
            pre_mean, pre_var = batched_prefill_s(
                lam_p, df["prefill_fixed_ms"].to_numpy() / 1e3,
                df["prefill_ms_per_token"].to_numpy() / 1e3, u, u2,
                df["prefill_budget_tokens"].to_numpy())
        lead = 1.5 * t_ms / 1e3
        ttft = np.where(colocated, wait + self._first_token_ms(df, n, free, prompts)[0] / 1e3,
                        pre_mean + df["push_mean_s"].to_numpy() + lead)
        tpot = t_ms / df["accepted"].to_numpy() / 1e3
        lam_s = lam / d.requests_per_session
        return {"t_ms": t_ms, "lam": lam, "rho": rho, "wait": wait, "ttft": ttft,
                "tpot": tpot, "lam_s": lam_s, "prefill_mean": pre_mean,
                "prefill_var": pre_var, "lead": lead, "free": free,
                "session_s": d.session_d0_s + d.session_n_ttft * ttft + d.session_n_tpot * tpot}

    def _excess(self, df: pd.DataFrame, p: dict[str, np.ndarray]) -> np.ndarray:
        """How far the load at a point falls short of the demand (< 0: more load needed)."""
        if self.plan.demand.agents is not None:
            return p["lam_s"] * p["session_s"] - df["agents_per_rack_in"].to_numpy()
        return p["lam_s"] - df["sessions_s_per_rack_in"].to_numpy()

    def evaluate(self, df: pd.DataFrame) -> pd.DataFrame:
        """Solve every candidate's operating point; add predictions, costs and SLO checks."""
        df = df.copy()
        speeds = [self.serving_speed(*key) for key in zip(
            df["hardware"], df["family"], df["serving_gpus"], df["serving_dbo"], strict=True)]
        df["decode_ranks"] = [s.ranks for s in speeds]
        df["accepted"] = [s.accepted for s in speeds]
        df["free_budget"] = [getattr(s, "budget", math.nan) for s in speeds]
        df["tokens_per_request"] = [1 + s.draft_tokens for s in speeds]
        prompts = self._prompt_levels(df)
        lo, hi = np.zeros(len(df)), df["decode_max_per_rank"].to_numpy().astype(float)
        top = self._point(df, hi, prompts)
        saturated = np.nan_to_num(self._excess(df, top), nan=np.inf, posinf=np.inf) < 0
        for _ in range(BISECTION_STEPS):
            mid = (lo + hi) / 2
            short = self._excess(df, self._point(df, mid, prompts)) < 0
            lo, hi = np.where(short, mid, lo), np.where(short, hi, mid)
        n = np.where(saturated, df["decode_max_per_rank"].to_numpy(), lo)
        p = self._point(df, n, prompts)
        return self._predict(df, n, p, saturated, prompts)

    def _colocated_p90_ms(self, df: pd.DataFrame, n: np.ndarray, n90: np.ndarray,
                          speed: ColocatedSpeed, table: ColocatedTable
                          ) -> tuple[np.ndarray, np.ndarray]:
        """The step at the 90th percentile of the tokens a colocated instance emits (ms), and
        the step it would be on the other side of the knife-edge (NaN off it).

        Its steps are of two kinds: without prefill, and carrying a chunk (longer by the
        chunk, and by a floor for the request's cached context), every idle step shorter
        than every busy one at the occupancies that matter. A step carries prefill whatever
        its decoding requests (the simulation's busy and idle steps hold the same mean), so
        the busy steps emit the tokens' share w = their share of the steps. Tokens sort idle
        first: above a tenth, the P90 is the (w - 0.1) / w quantile of the busy steps' tokens,
        a chunk of that quantile of the requests' uncached tokens (the colocated view of
        reuse, at most the free budget) at the P90 occupancy; below, the 0.9 / (1 - w)
        quantile of the idle steps' tokens: a step at that quantile of the token-weighted
        occupancy (1 + Poisson(m), m the instance's mean). Within `KNIFE_EDGE_SHARE` of the
        tenth the other side's step is the shortest busy step (a chunk of the fewest
        uncached tokens) or the longest idle one (the 0.999 quantile)."""
        m = np.maximum(n * speed.ranks, 1e-9)
        w = table.share_at(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            q_busy = np.clip((w - 0.1) / w, 0.0, 1.0)
            q_idle = np.clip(0.9 / (1 - w), 0.0, 0.999)
        cache = df["cache_per_agent_tokens"].to_numpy()
        free = speed.free(n90)
        uncached = self.demand.colocated_reuse.uncached_quantile

        def busy(q: np.ndarray) -> np.ndarray:
            return table.busy_at(n90, np.minimum(uncached(cache, q), free))

        def idle(q: np.ndarray) -> np.ndarray:
            return table.idle_at(np.clip((1 + occupancy_quantile(m, q)) / speed.ranks, n,
                                         speed.max_per_rank))

        above = w > 0.1
        p90 = np.where(above, busy(q_busy), idle(q_idle))
        other = np.where(above, idle(np.full(len(w), 0.999)), busy(np.zeros(len(w))))
        return p90, np.where(np.abs(w - 0.1) < KNIFE_EDGE_SHARE, other, np.nan)

    def _predict(self, df: pd.DataFrame, n: np.ndarray, p: dict[str, np.ndarray],
                 saturated: np.ndarray, prompts: np.ndarray) -> pd.DataFrame:
        d, slo, pr = self.demand, self.plan.slo, self.cfg.pricing
        open_loop = self.plan.demand.agents is None
        agents = np.where(open_loop, p["lam_s"] * p["session_s"], df["agents_per_rack_in"])
        # The agents the loop cannot absorb (decode full, or a prefill at its full-budget
        # rate) wait for it (Little); open loop, a saturated decode never catches up.
        with np.errstate(divide="ignore", invalid="ignore"):
            extra = (np.where(saturated, np.inf, 0.0) if open_loop else np.maximum(
                (agents / p["lam_s"] - p["session_s"]) / d.session_n_ttft, 0.0))
        rho, wait = p["rho"], p["wait"]
        w90, w50 = wait_quantile_s(wait, rho, 0.9), wait_quantile_s(wait, rho, 0.5)
        occupancy = n * df["decode_ranks"].to_numpy()
        n90 = np.maximum(np.minimum(occupancy_quantile(occupancy, 0.9)
                                    / df["decode_ranks"].to_numpy(),
                                    df["decode_max_per_rank"].to_numpy()), n)
        t90 = self._step_ms(df, n90)
        edge = np.full(len(df), np.nan)
        for index, speed, table in self._colocated_groups(df):
            rows = df.index.get_indexer(index)
            t90[rows], edge[rows] = self._colocated_p90_ms(df.loc[index], n[rows], n90[rows],
                                                           speed, table)
        out = df.copy()
        lam = p["lam"]
        gpus_rack = df["gpus_per_rack_used"].to_numpy()
        cached = lam * (d.prompt_mean - df["uncached_mean"].to_numpy()) / gpus_rack
        uncached = lam * df["uncached_mean"].to_numpy() / gpus_rack
        output = lam * d.output_mean / gpus_rack
        out["agents_per_rack"] = agents
        out["decode_per_rank"] = n
        out["decode_step_ms"] = p["t_ms"]
        out["prefill_utilisation"] = rho
        out["decode_saturated"] = saturated
        out["throughput_tok_s_gpu"] = cached + uncached + output
        out["cached_input_tok_s_gpu"] = cached
        out["uncached_input_tok_s_gpu"] = uncached
        out["output_tok_s_gpu"] = output
        out["interactivity_tok_s"] = df["accepted"].to_numpy() / t90 * 1e3
        # colocated, on the knife-edge: the P90 had it fallen on the other kind of step
        out["interactivity_edge_tok_s"] = df["accepted"].to_numpy() / edge * 1e3
        # colocated: the rank's queue, then the first token's own quantiles; disaggregated:
        # the prefill instance's quantile (a gamma of its mean and variance), the push's and
        # the decode steps
        _, first50, first90 = self._first_token_ms(df, n, p["free"], prompts, (0.5, 0.9))
        colocated = (df["family"] == "colocated").to_numpy()
        pre50, pre90 = (gamma_quantile(p["prefill_mean"], p["prefill_var"], q) for q in (0.5, 0.9))
        ttft50 = np.where(colocated, w50 + first50 / 1e3,
                          pre50 + df["push_mean_s"].to_numpy() + p["lead"])
        ttft90 = np.where(colocated, w90 + first90 / 1e3,
                          pre90 + df["push_p90_s"].to_numpy() + p["lead"])
        out["ttft_p50_ms"] = (ttft50 + extra) * 1e3
        out["ttft_p90_ms"] = (ttft90 + extra) * 1e3
        out["revenue_usd_gpu_h"] = (cached * pr.cached_input_usd_per_mtok
                                    + uncached * pr.uncached_input_usd_per_mtok
                                    + output * pr.output_usd_per_mtok) * 3600 / 1e6
        out["fleet_usd_h"] = out["gpus_bought"] * out["price_usd_gpu_h"]
        out["cost_usd_gpu_h"] = out["fleet_usd_h"] / out["gpus"]
        out["cost_usd_per_mtok"] = out["cost_usd_gpu_h"] / (
            out["throughput_tok_s_gpu"] * 3600 / 1e6)
        out["headroom_interactivity"] = (out["interactivity_tok_s"]
                                         / slo.interactivity_p90_tok_s_user_min - 1)
        out["headroom_ttft_p90"] = 1 - out["ttft_p90_ms"] / (slo.ttft_p90_s_max * 1e3)
        heads = ["headroom_interactivity", "headroom_ttft_p90"]
        if slo.ttft_p50_s_max is not None:
            out["headroom_ttft_p50"] = 1 - out["ttft_p50_ms"] / (slo.ttft_p50_s_max * 1e3)
            heads.append("headroom_ttft_p50")
        out["headroom_min"] = out[heads].min(axis=1)
        budget = self.plan.limits.max_usd_per_hour
        out["within_budget"] = True if budget is None else out["fleet_usd_h"] <= budget
        out["meets_slo"] = out["headroom_min"] >= 0
        out["feasible"] = out["meets_slo"] & out["within_budget"]
        out["verdict"] = [verdict(r, self.plan) for r in out.itertuples()]
        return out.drop(columns=["decode_ranks", "accepted", "free_budget",
                                 "tokens_per_request"])

    def run(self) -> pd.DataFrame:
        """Enumerate and price every candidate; `PlanError` when the scenario's rules refuse
        every layout of the space, with their reasons."""
        candidates = self.candidates()
        if not len(candidates):
            by_reason: dict[str, list[Rejected]] = {}
            for r in self.rejected:
                by_reason.setdefault(r.reason, []).append(r)
            lines = [f"  {reason} ({len({(r.hardware, r.family) for r in rs})} families, e.g. "
                     f"{rs[0].hardware}, {rs[0].family})" for reason, rs in by_reason.items()]
            raise PlanError("no layout of plan.space can run on any hardware option of the "
                            "plan; change plan.space or the scenario:\n" + "\n".join(lines))
        return self.evaluate(candidates)


def verdict(r, plan: PlanSpec) -> str:
    """Why a candidate fails (empty when it meets every SLO within the limits)."""
    slo, why = plan.slo, []
    if r.headroom_interactivity < 0:
        why.append(f"interactivity {r.interactivity_tok_s:.0f} < "
                   f"{slo.interactivity_p90_tok_s_user_min:g} tok/s/user")
    if r.headroom_ttft_p90 < 0:
        cause = ("decode saturated" if r.decode_saturated
                 else f"prefill at {min(r.prefill_utilisation, 1):.0%}")
        why.append(f"TTFT P90 {r.ttft_p90_ms / 1e3:.3g} s > {slo.ttft_p90_s_max:g} s ({cause})")
    if slo.ttft_p50_s_max is not None and r.headroom_ttft_p50 < 0:
        why.append(f"TTFT P50 {r.ttft_p50_ms / 1e3:.3g} s > {slo.ttft_p50_s_max:g} s")
    if not r.within_budget:
        why.append(f"${r.fleet_usd_h:,.0f}/h over the ${plan.limits.max_usd_per_hour:,.0f}/h "
                   "budget")
    return "; ".join(why)
