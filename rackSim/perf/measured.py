"""A measured server's step time: the fitted profile and the StepModel it prices.

A profile (`racksim-validate fit` writes one, `rackSim.validate.fit` fits it) prices one vLLM
engine step, which mixes prefill chunks and decode tokens:

    step_ms = const_ms + per_prefill_token_ms * prefill_tokens
              + per_prefill_request_ms * prefill_requests
              + per_decode_request_ms * decode_requests + per_context_token_ms * context_tokens
              + overhead_ms

`api_overhead_ms` is a fixed per-request delay before a request reaches the scheduler, of
which `intake_ms` passes before the server stamps the request's arrival (HTTP, tokenising:
the part its own TTFT does not count); `output_ms` is the front-end's CPU time per output
token (the API server's and the measuring client's, both measured on the fitting run): a
step's n outputs are handled one after another, so they reach the client on average
(n + 1) / 2 x output_ms after the step ends, also outside the server's TTFT. The profile also
records the server's shape (scheduler limits, KV cache) it was measured on.

Steps with the same counts do not take the same time on a real server (on the 2-core CPU
machine the logged time of batch-1 decode steps spans 0.4x-1.7x its fitted value, P10-P90).
`step_jitter` holds `JITTER_LEVELS` equal-mass quantiles of logged / fitted step time on the
fitting run; each step draws one (seeded) and multiplies the step's model time by it, not
the between-steps overhead. An empty list (black-box profiles, older files) means none.

The same server does not compute at the same speed from one run to the next on a shared
machine (the 2-core CPU machine's median logged / fitted step time ranged 0.6x-1.6x over the
runs of one grid). `at_speed` prices the engine `factor` times slower (step coefficients and
the per-step overhead scaled; the front-end's `api_overhead_ms` as fitted), and
`fit_run_ratio` is the fitting run's own median logged / fitted step time, the reference a
run's speed is measured against (`rackSim.validate.runs.run_speed`).

`build_step_model` dispatches `cfg.perf.model == "measured"` here:
`MeasuredStepModel(cfg, role=role, seed=seed)` reads `cfg.perf.profile`; a colocated instance
(`rackSim.engine.colocated`) prices vLLM's mixed steps with `mixed_step`. The profile has no
per-operator split, so the breakdown is coarse: the constant and per-step overhead go to
`cpu`, the per-token and per-request terms to `dense`, the context term to `attention`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

from rackSim.config.errors import ProfileInputError
from rackSim.perf.step import DecodeBatch, PrefillBatch, StepBreakdown

PROFILE_FORMAT = "racksim-measured-profile/1"
COEFFS = ("const_ms", "per_prefill_token_ms", "per_prefill_request_ms",
          "per_decode_request_ms", "per_context_token_ms")
JITTER_LEVELS = 40  # step_jitter quantiles, at probabilities (i + 0.5) / JITTER_LEVELS


@dataclass
class ServerShape:
    """The scheduler limits of the measured server. max_num_batched_tokens: token budget per
    step; max_num_seqs: running requests cap; block_tokens: KV block size (tokens);
    kv_capacity_tokens: KV cache size (tokens)."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    block_tokens: int = 128
    kv_capacity_tokens: int = 1_048_576


@dataclass
class Profile:
    """A fitted step-time profile (see the module docstring); times in ms."""

    coeffs: dict[str, float]
    overhead_ms: float = 0.0
    api_overhead_ms: float = 0.0
    intake_ms: float = 0.0
    output_ms: float = 0.0
    server: ServerShape = field(default_factory=ServerShape)
    source: str = "iteration_log"
    provenance: dict = field(default_factory=dict)
    residuals: dict = field(default_factory=dict)
    step_jitter: list[float] = field(default_factory=list)

    def step_ms(self, prefill_tokens: float, prefill_requests: float, decode_requests: float,
                context_tokens: float = 0.0) -> float:
        """Duration (ms) of one engine step with these counts, overhead included."""
        c = self.coeffs
        return (c["const_ms"] + c["per_prefill_token_ms"] * prefill_tokens
                + c["per_prefill_request_ms"] * prefill_requests
                + c["per_decode_request_ms"] * decode_requests
                + c["per_context_token_ms"] * context_tokens + self.overhead_ms)

    @property
    def fit_run_ratio(self) -> float | None:
        """The fitting run's median logged / fitted step time (the median of `step_jitter`);
        None for a profile without step jitter (not fitted on an iteration log)."""
        return float(np.median(self.step_jitter)) if self.step_jitter else None

    def at_speed(self, factor: float) -> Profile:
        """This profile on an engine `factor` times slower (> 1) or faster: step coefficients
        and overhead_ms scaled, api_overhead_ms (the front-end) and the jitter as fitted."""
        if not (factor > 0 and np.isfinite(factor)):
            raise ValueError(f"speed factor {factor}: must be a positive number")
        return replace(self, coeffs={k: v * factor for k, v in self.coeffs.items()},
                       overhead_ms=self.overhead_ms * factor)

    def to_yaml(self, path: Path) -> Path:
        doc = {"format": PROFILE_FORMAT, "kind": "measured_step_time", "source": self.source,
               "step_ms": {k: float(self.coeffs[k]) for k in COEFFS},
               "overhead_ms": float(self.overhead_ms),
               "api_overhead_ms": float(self.api_overhead_ms),
               "intake_ms": float(self.intake_ms),
               "output_ms": float(self.output_ms),
               "step_jitter": [float(x) for x in self.step_jitter],
               "server": vars(self.server), "provenance": self.provenance,
               "residuals": self.residuals}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    @classmethod
    def from_yaml(cls, path: Path) -> Profile:
        """Read a profile; ProfileInputError naming the file, line or field and the fix."""
        from rackSim.perf.profile import read_profile_yaml

        doc = read_profile_yaml(path)
        if doc.get("format") != PROFILE_FORMAT:
            raise ProfileInputError(f"profile '{path}': not a {PROFILE_FORMAT} file; produce "
                                    "one with `racksim-validate fit`")
        step = doc.get("step_ms") or {}
        missing = [k for k in COEFFS if k not in step]
        if missing:
            raise ProfileInputError(f"profile '{path}': step_ms lacks {missing}; refit it "
                                    "with `racksim-validate fit`")
        jitter = doc.get("step_jitter") or []
        if not (isinstance(jitter, list) and all(isinstance(x, int | float) and x > 0
                                                 for x in jitter)):
            raise ProfileInputError(f"profile '{path}': step_jitter must be a list of positive "
                                    "numbers (quantiles of logged / fitted step time); refit "
                                    "it with `racksim-validate fit`")
        front = {k: doc.get(k, 0.0) for k in ("api_overhead_ms", "intake_ms", "output_ms")}
        bad = [k for k, v in front.items() if not (isinstance(v, int | float) and v >= 0)]
        if bad or front["intake_ms"] > front["api_overhead_ms"]:
            raise ProfileInputError(
                f"profile '{path}': {', '.join(bad) or 'intake_ms'} must be "
                + ("a number >= 0 (ms)" if bad else "at most api_overhead_ms (the intake is "
                   "part of the delay before the scheduler)")
                + "; refit it with `racksim-validate fit`")
        return cls(coeffs={k: float(step[k]) for k in COEFFS},
                   overhead_ms=float(doc.get("overhead_ms", 0.0)),
                   api_overhead_ms=float(front["api_overhead_ms"]),
                   intake_ms=float(front["intake_ms"]), output_ms=float(front["output_ms"]),
                   server=ServerShape(**(doc.get("server") or {})),
                   source=str(doc.get("source", "")), provenance=doc.get("provenance") or {},
                   residuals=doc.get("residuals") or {},
                   step_jitter=[float(x) for x in jitter])


class MeasuredStepModel:
    """Step times of one instance from a measured profile; `seed` draws the step jitter."""

    def __init__(self, cfg: object | None = None, role: str = "decode", seed: int = 0,
                 profile: Profile | None = None):
        if profile is None:
            path = getattr(getattr(cfg, "perf", None), "profile", None)
            if path is None:
                raise ValueError("perf.profile: model 'measured' needs a profile YAML "
                                 "(produce one with `racksim-validate fit`)")
            profile = Profile.from_yaml(Path(path))
        self.profile, self.role, self.seed = profile, role, seed
        self._jitter = np.asarray(profile.step_jitter, dtype=float)
        self._rng = np.random.default_rng(seed)
        self._draws: list[float] = []

    @classmethod
    def from_profile(cls, profile: Profile, role: str = "colocated", seed: int = 0
                     ) -> MeasuredStepModel:
        return cls(profile=profile, role=role, seed=seed)

    def _factor(self) -> float:
        """The next step's jitter factor (1 without jitter); drawn 4,096 at a time."""
        if not self._jitter.size:
            return 1.0
        if not self._draws:
            self._draws = self._jitter[self._rng.integers(0, self._jitter.size, 4096)].tolist()
        return self._draws.pop()

    def _step(self, prefill_tokens: float, prefill_requests: float, decode_requests: float,
              context_tokens: float) -> StepBreakdown:
        c, f = self.profile.coeffs, self._factor()
        return StepBreakdown(
            cpu=c["const_ms"] * f + self.profile.overhead_ms,
            dense=(c["per_prefill_token_ms"] * prefill_tokens
                   + c["per_prefill_request_ms"] * prefill_requests
                   + c["per_decode_request_ms"] * decode_requests) * f,
            attention=c["per_context_token_ms"] * context_tokens * f)

    def mixed_step(self, prefill: PrefillBatch, decode: DecodeBatch) -> StepBreakdown:
        """One engine step with prefill chunks and decode tokens together (ms); DP ranks run
        in lock-step, so the busiest rank's decode (requests, context) counts."""
        return self._step(prefill.new_tokens, prefill.num_requests,
                          max(decode.requests_per_rank, default=0),
                          prefill.attended_tokens + max(decode.context_tokens_per_rank,
                                                        default=0.0))

    def prefill_step(self, batch: PrefillBatch) -> StepBreakdown:
        return self._step(batch.new_tokens, batch.num_requests, 0, batch.attended_tokens)

    def decode_step(self, batch: DecodeBatch) -> StepBreakdown:
        """Ranks run in lock-step: the busiest rank (requests, context) sets the time."""
        return self._step(0, 0, max(batch.requests_per_rank, default=0),
                          max(batch.context_tokens_per_rank, default=0.0))
