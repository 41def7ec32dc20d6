"""The planning question, validated: demand, SLOs, hardware options with prices, limits, the
layout space to search and how the best candidates are confirmed.

Every model is strict and every cross-field rule is checked before anything runs, with a
message naming the field (`plan.hardware[1].name`, `plan.slo.ttft_p50_s_max`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from rackSim.config.specs import HardwareSpec

HOURS_PER_YEAR = 8760.0

#: Layout kinds the planner searches. `disaggregated`: prefill instances + decode instances in
#: one NVLink domain. `colocated`: instances that prefill and decode alike (chunked prefill in
#: decode steps, vLLM's default), so a plan answers "should we disaggregate at all?".
Family = Literal["disaggregated", "colocated"]


class PlanModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Demand(PlanModel):
    """How much traffic of the scenario's workload: concurrent agents (closed loop, as the
    simulator replays it) or sessions started per hour (converted to agents by Little's law at
    each candidate's predicted session duration). Give exactly one."""

    agents: PositiveInt | None = Field(default=None, description="concurrent agent clients")
    sessions_per_hour: PositiveFloat | None = Field(default=None,
                                                    description="sessions started per hour")

    @model_validator(mode="after")
    def _one(self) -> Demand:
        if (self.agents is None) == (self.sessions_per_hour is None):
            raise ValueError("give exactly one of agents or sessions_per_hour")
        return self


class Slo(PlanModel):
    """Service-level objectives every plan must meet (the simulator's definitions: README,
    "Metrics"). interactivity = 1 / P90 inter-token latency."""

    interactivity_p90_tok_s_user_min: PositiveFloat = Field(
        description="P90 interactivity at least this (tokens/s per user)")
    ttft_p90_s_max: PositiveFloat = Field(description="TTFT P90 at most this (s)")
    ttft_p50_s_max: PositiveFloat | None = Field(default=None,
                                                 description="TTFT P50 at most this (s)")
    itl_p90_ms_max: PositiveFloat | None = Field(default=None, description=(
        "P90 inter-token latency at most this (ms); the same quantity as interactivity, so it "
        "must agree with interactivity_p90_tok_s_user_min"))

    @model_validator(mode="after")
    def _consistent(self) -> Slo:
        if self.ttft_p50_s_max is not None and self.ttft_p50_s_max > self.ttft_p90_s_max:
            raise ValueError(
                f"ttft_p50_s_max={self.ttft_p50_s_max} exceeds ttft_p90_s_max="
                f"{self.ttft_p90_s_max}: a median bound above the P90 bound contradicts "
                "P50 <= P90; lower ttft_p50_s_max or drop it")
        if self.itl_p90_ms_max is not None:
            implied = 1000.0 / self.itl_p90_ms_max
            if abs(implied / self.interactivity_p90_tok_s_user_min - 1.0) > 1e-6:
                raise ValueError(
                    f"itl_p90_ms_max={self.itl_p90_ms_max} means interactivity >= "
                    f"{implied:.4g} tok/s/user but interactivity_p90_tok_s_user_min="
                    f"{self.interactivity_p90_tok_s_user_min}: both bound the P90 inter-token "
                    "latency; give one of them")
        return self


class HardwareOption(PlanModel):
    """One GPU system the plan may buy or rent (`name`: a file of scenarios/hardware/), its
    price per GPU-hour (a rental price, or capex amortised over `years` plus power), and the
    calibration profile that prices the model on it (`profile`; None: the scenario's
    `perf.profile`). A generated model on a GPU has its own profile
    (`calibration/<hardware>__<model>.yaml`, `racksim-calibrate profile`)."""

    name: str
    profile: Path | None = Field(default=None, description=(
        "calibration profile for the model on this GPU (None: the scenario's perf.profile)"))
    rental_usd_per_gpu_hour: NonNegativeFloat | None = None
    capex_usd_per_gpu: NonNegativeFloat | None = None
    years: PositiveFloat | None = Field(default=None, description="amortisation period")
    power_usd_per_kwh: NonNegativeFloat | None = None
    pue: float = Field(default=1.2, ge=1.0, description="facility power / IT power")

    @model_validator(mode="after")
    def _price(self) -> HardwareOption:
        capex = (self.capex_usd_per_gpu, self.years, self.power_usd_per_kwh)
        if self.rental_usd_per_gpu_hour is not None:
            if any(v is not None for v in capex):
                raise ValueError("give rental_usd_per_gpu_hour or capex_usd_per_gpu + years + "
                                 "power_usd_per_kwh, not both")
        elif any(v is None for v in capex):
            raise ValueError("needs a price: rental_usd_per_gpu_hour, or capex_usd_per_gpu with "
                             "years and power_usd_per_kwh")
        return self

    def usd_per_gpu_hour(self, hw: HardwareSpec) -> float:
        """Rental price, or capex / (years x 8760 h) + power_w x PUE x $/kWh."""
        if self.rental_usd_per_gpu_hour is not None:
            return self.rental_usd_per_gpu_hour
        assert self.capex_usd_per_gpu is not None and self.years is not None
        assert self.power_usd_per_kwh is not None
        return (self.capex_usd_per_gpu / (self.years * HOURS_PER_YEAR)
                + hw.power_w / 1000.0 * self.pue * self.power_usd_per_kwh)


class Limits(PlanModel):
    max_racks: PositiveInt = Field(description="racks (NVLink domains) per fleet, at most")
    max_usd_per_hour: PositiveFloat | None = Field(
        default=None, description="fleet cost per hour, at most (None: no budget)")


class Space(PlanModel):
    """The layouts searched, per rack. disaggregated: `prefill_instances` x
    DEP`prefill_gpus_per_instance` prefill + `decode_instances` x DEP`decode_gpus` decode;
    colocated: n x DEP`colocated_gpus` instances; every combination that fits the rack's
    NVLink domain. The colocated instances take the scenario's `deployment.colocated` settings
    (token budget, max_num_seqs_per_rank, speculative decoding) or, without one, the decode
    instance's batch and speculative settings with `colocated_budget_tokens`.
    `prefill_dbo`, `decode_dbo`, `colocated_dbo` search dual-batch overlap per instance kind
    (vLLM's `--enable-dbo`, with the scenario's thresholds and SM split): every candidate
    with each value listed; unset, the scenario's own setting."""

    families: list[Family] = ["disaggregated", "colocated"]
    prefill_gpus_per_instance: list[PositiveInt] = [2]
    prefill_instances_max: PositiveInt = Field(default=32, description=(
        "every prefill instance count from 1 to this (as far as the rack allows)"))
    decode_gpus: list[PositiveInt] = [8, 16, 32]
    decode_instances: list[PositiveInt] = [1]
    colocated_gpus: list[PositiveInt] = [8, 16, 32]
    colocated_instances_max: PositiveInt = Field(default=9, description=(
        "every colocated instance count from 1 to this (as far as the rack allows)"))
    colocated_budget_tokens: PositiveInt = Field(default=8192, description=(
        "token budget per rank per step of a colocated instance, when the scenario has no "
        "deployment.colocated"))
    prefill_dbo: list[bool] | None = Field(default=None, min_length=1, description=(
        "dual-batch overlap of the prefill instances, each value searched (None: the "
        "scenario's deployment.prefill.dbo.enabled)"))
    decode_dbo: list[bool] | None = Field(default=None, min_length=1, description=(
        "dual-batch overlap of the decode instances, each value searched (None: the "
        "scenario's deployment.decode.dbo.enabled)"))
    colocated_dbo: list[bool] | None = Field(default=None, min_length=1, description=(
        "dual-batch overlap of the colocated instances, each value searched (None: the "
        "colocated instances' own setting, the decode instance's without "
        "deployment.colocated)"))

    @model_validator(mode="after")
    def _once_each(self) -> Space:
        for key in ("prefill_dbo", "decode_dbo", "colocated_dbo"):
            values = getattr(self, key)
            if values is not None and len(set(values)) < len(values):
                raise ValueError(f"{key}={values} lists a value twice; give [false], [true] "
                                 "or [false, true]")
        return self


class Confirm(PlanModel):
    """Stage 2: the best `top_k` candidates simulated through a Hydra launcher
    (`launcher`: a hydra/launcher option, e.g. joblib or racksim_ray, with
    `launcher_overrides` such as hydra.launcher.n_jobs=2). `fleet`: simulate the whole fleet
    at the full demand; false: one rack at agents / racks (rackSim.plan.confirm)."""

    top_k: int = Field(default=4, ge=0, description="candidates simulated (0: screen only)")
    launcher: str = "joblib"
    launcher_overrides: list[str] = ["hydra.launcher.n_jobs=2"]
    window_s: PositiveFloat = 60.0
    warmup_requests_per_lane: int = Field(default=2, ge=0, description=(
        "requests each lane finishes before the window opens: every lane sends its first at "
        "t = 0, and that burst's queues last past the first (docs/planner.md, stage 2)"))
    fleet: bool = True
    rounds: PositiveInt = Field(default=2, description=(
        "confirmation rounds: while no simulated candidate meets the SLOs, simulate the next "
        "best whose screen prediction clears them by the screen's worst error so far"))


class PlanSpec(PlanModel):
    name: str
    demand: Demand
    slo: Slo
    hardware: list[HardwareOption] = Field(min_length=1)
    limits: Limits
    space: Space = Space()
    confirm: Confirm = Confirm()
    plans: PositiveInt = Field(default=3, description="cheapest plans reported")

    def option(self, name: str) -> HardwareOption:
        """The hardware option called `name`."""
        return next(o for o in self.hardware if o.name == name)
