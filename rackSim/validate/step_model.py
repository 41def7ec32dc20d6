"""A StepModel for a measured server, priced by a fitted profile (see `fit`).

`build_step_model` dispatches `cfg.perf.model == "measured"` here:
`MeasuredStepModel(cfg, role=role, seed=seed)` reads `cfg.perf.profile`. The colocated model
(`colocated`) builds it straight from a `Profile` and prices vLLM's mixed steps with
`mixed_step`. The profile has no per-operator split, so the breakdown is coarse: the constant
and per-step overhead go to `cpu`, the per-token and per-request terms to `dense`, the context
term to `attention`.
"""

from __future__ import annotations

from pathlib import Path

from rackSim.perf.step import DecodeBatch, PrefillBatch, StepBreakdown
from rackSim.validate.fit import Profile


class MeasuredStepModel:
    """Step times of one instance from a measured profile (deterministic: `seed` unused)."""

    def __init__(self, cfg: object | None = None, role: str = "decode", seed: int = 0,
                 profile: Profile | None = None):
        if profile is None:
            path = getattr(getattr(cfg, "perf", None), "profile", None)
            if path is None:
                raise ValueError("perf.profile: model 'measured' needs a profile YAML "
                                 "(produce one with `racksim-validate fit`)")
            profile = Profile.from_yaml(Path(path))
        self.profile, self.role, self.seed = profile, role, seed

    @classmethod
    def from_profile(cls, profile: Profile, role: str = "colocated") -> MeasuredStepModel:
        return cls(profile=profile, role=role)

    def mixed_step(self, prefill_tokens: float, prefill_requests: int, decode_requests: int,
                   context_tokens: float = 0.0) -> StepBreakdown:
        """One engine step with prefill chunks and decode tokens together (ms)."""
        c = self.profile.coeffs
        return StepBreakdown(
            cpu=c["const_ms"] + self.profile.overhead_ms,
            dense=(c["per_prefill_token_ms"] * prefill_tokens
                   + c["per_prefill_request_ms"] * prefill_requests
                   + c["per_decode_request_ms"] * decode_requests),
            attention=c["per_context_token_ms"] * context_tokens)

    def prefill_step(self, batch: PrefillBatch) -> StepBreakdown:
        return self.mixed_step(batch.new_tokens, batch.num_requests, 0, batch.attended_tokens)

    def decode_step(self, batch: DecodeBatch) -> StepBreakdown:
        """Ranks run in lock-step: the busiest rank (requests, context) sets the time."""
        reqs = max(batch.requests_per_rank, default=0)
        ctx = max(batch.context_tokens_per_rank, default=0.0)
        return self.mixed_step(0, 0, reqs, ctx)
