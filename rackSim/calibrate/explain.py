"""Explain a decode step: its breakdown at DEP4..DEP64, with and without EPLB, with each DP-sync
all-reduce algorithm (`racksim-calibrate --explain`).

Every rank holds `requests_per_rank` requests of `context` tokens; the straggler column is the
expected delay (not a random draw); EPLB states are advanced to half-way between two
rearrangements, so balancedness is in steady state and no weight copies are in flight.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from rackSim.calibrate.scenario import REFERENCE_MODEL, instance_point, profile_options
from rackSim.config.scenarios import load_hardware, with_changes
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.profile import Profile
from rackSim.perf.step import COMPONENTS, DecodeBatch

ALGORITHMS = ("ring", "recursive_doubling")
#: the DEP widths explained by default, as far as one NVLink domain holds them
WIDTHS = (4, 8, 16, 32, 64)


def breakdown_table(profile: Profile, widths: list[int], requests_per_rank: int, context: int,
                    hardware: str = "gb300_nvl72", seed: int = 0,
                    model: str = REFERENCE_MODEL, dbo: bool = False) -> pd.DataFrame:
    """One row per (width, EPLB on/off, all-reduce): ms per component, step, balancedness,
    tokens/s per user (accepted tokens per step / step) and output tokens/s per GPU; `dbo`:
    the steps with dual-batch overlap."""
    rows = []
    for w in widths:
        for eplb in (False, True):
            for alg in ALGORITHMS:
                cfg = instance_point("decode", w, hardware=hardware, eplb=eplb,
                                     allreduce=alg, model=model)
                if dbo:
                    cfg = with_changes(cfg, deployment={"decode": {"dbo": {"enabled": True}}})
                step_model = CalibratedStepModel(cfg, "decode", seed=seed, profile=profile)
                spec = cfg.deployment.decode.speculative
                interval = cfg.deployment.eplb.interval_steps
                step = 2 * interval + interval // 2  # between rearrangements (no copy traffic)
                b_t, b_d = step_model.balancedness(step)
                batch = DecodeBatch(requests_per_rank=[requests_per_rank] * w,
                                    context_tokens_per_rank=[requests_per_rank * context] * w,
                                    tokens_per_request=spec.accepted_tokens_per_step,
                                    draft_tokens=spec.num_draft_tokens, new_loads=0,
                                    admitted_prompt_tokens=0, step_index=step)
                br = step_model.decode_step(batch)
                br = replace(br, straggler=step_model.last_straggler_expected_ms)
                tok = spec.accepted_tokens_per_step
                rows.append({"DEP": w, "eplb": "on" if eplb else "off", "allreduce": alg,
                             **{c: br.as_dict()[c] for c in COMPONENTS if c != "kv_stall"},
                             "step_ms": br.total_ms, "bal_target": b_t, "bal_draft": b_d,
                             "tok_s_user": tok / br.total_ms * 1e3,
                             "out_tok_s_gpu": requests_per_rank * tok / br.total_ms * 1e3})
    return pd.DataFrame(rows)


def explain(profile_path: Path, widths: list[int] | None, requests_per_rank: int = 64,
            context: int = 131072, hardware: str | None = None, dbo: bool = False) -> str:
    """The decode step breakdown table at each DEP width of `widths` (None: those of
    `WIDTHS` one NVLink domain of the hardware holds), priced by the profile at
    `profile_path` (given as `--profile`: a ProfileInputError names that flag) for the model
    it was fitted for, on `hardware` (None: the GPU it was fitted for); `dbo`: with
    dual-batch overlap."""
    profile = Profile.load(profile_path, "--profile")
    model, fitted_on = profile_options(profile)
    hardware = hardware or fitted_on or "gb300_nvl72"
    if widths is None:
        domain = load_hardware(hardware).domain_gpus
        widths = [w for w in WIDTHS if w <= domain]
    df = breakdown_table(profile, widths, requests_per_rank, context, hardware, model=model,
                         dbo=dbo)
    head = (f"decode step breakdown (ms) of {model} on {hardware}, {requests_per_rank} "
            f"requests/rank, {context} context tokens/request, profile {profile_path}"
            + (", dual-batch overlap" if dbo else ""))
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        body = df.to_string(index=False, float_format=lambda v: f"{v:.3f}")
    return head + "\n" + body
