"""A measured server's step time: the fitted profile and the StepModel it prices.

A profile (`racksim-validate fit` writes one, `rackSim.validate.fit` fits it) prices one vLLM
engine step, which mixes prefill chunks and decode tokens:

    step_ms = const_ms + per_prefill_token_ms * prefill_tokens
              + per_prefill_request_ms * prefill_requests
              + per_decode_request_ms * decode_requests + per_context_token_ms * context_tokens
              + overhead_ms + overhead_per_request_ms * (prefill_requests + decode_requests)

The last two terms are the engine's host-side time between steps (scheduling, handing the
outputs to the API server), which the iteration log does not time: a constant per step and a
part per request in the step.

`api_overhead_ms` is a fixed per-request delay before a request reaches the scheduler, of
which `intake_ms` passes before the server stamps the request's arrival (HTTP, tokenising:
the part its own TTFT does not count); `output_ms` is the front-end's CPU time per output
token (the API server's and the measuring client's, both measured on the fitting run): a
step's n outputs are handled one after another, so they reach the client on average
(n + 1) / 2 x output_ms after the step ends, also outside the server's TTFT. The profile also
records the server's shape (scheduler limits, KV cache) it was measured on.

A request's intake also takes host time from the engine: the API server parses it and hands
it over, and the engine core takes it in, on the CPU the engine core runs its steps from, so
a decode-only step in progress when a request is sent ends later by `intake_stall_ms` +
`intake_stall_per_token_ms` x its prompt tokens (engine/colocated.py adds it); a step that
computes a prompt is long enough to absorb it (measured: docs/validate.md). The request's
own wait before the scheduler is `api_overhead_ms`; the stall is what the
other requests' steps lose to it.

Steps with the same counts do not take the same time on a real server (on the 2-core CPU
machine the logged time of batch-1 decode steps spans 0.4x-1.7x its fitted value, P10-P90).
`step_jitter` holds `JITTER_LEVELS` equal-mass quantiles of logged / fitted step time on the
fitting run; each step draws one (seeded) and multiplies the step's model time by it, not
the between-steps overhead. An empty list (black-box profiles, older files) means none.
`decode_jitter` (as many levels) is the spread of a decode-only step as the clients see it:
quantiles of its whole wall time (model and time between steps) over the median at its
batch; when the profile has it, a step without prefill scales its whole time by a draw from
it instead (steps with prefill keep `step_jitter`).

The same server does not compute at the same speed from one run to the next on a shared
machine: on the 2-core CPU machine the median logged / fitted time of decode-only steps
ranged 0.6x-1.6x over the runs of one grid, while steps with prefill (GEMM-heavy) moved far
less and not with them. `step_ratios` keeps the fitting run's median logged / fitted step
time of each kind ("decode": decode-only steps, "prefill": steps with prefill tokens;
`ratios` computes them over any logged steps), the reference a run's speed is measured
against (`rackSim.validate.runs.run_speed`); `at_speed` prices the engine slower (> 1) or
faster by one factor per kind: the constant, the decode and context terms and the
between-steps overhead by the decode factor, the prefill terms by the prefill factor; the
front-end's delays as fitted.

`build_step_model` dispatches `cfg.perf.model == "measured"` here:
`MeasuredStepModel(cfg, role=role, seed=seed)` reads `cfg.perf.profile`; a colocated instance
(`rackSim.engine.colocated`) prices vLLM's mixed steps with `mixed_step`. The profile has no
per-operator split, so the breakdown is coarse: the constant and the between-steps time go to
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
    overhead_per_request_ms: float = 0.0
    api_overhead_ms: float = 0.0
    intake_ms: float = 0.0
    output_ms: float = 0.0
    intake_stall_ms: float = 0.0
    intake_stall_per_token_ms: float = 0.0
    server: ServerShape = field(default_factory=ServerShape)
    source: str = "iteration_log"
    provenance: dict = field(default_factory=dict)
    residuals: dict = field(default_factory=dict)
    step_jitter: list[float] = field(default_factory=list)
    decode_jitter: list[float] = field(default_factory=list)
    step_ratios: dict[str, float] = field(default_factory=dict)

    def step_ms(self, prefill_tokens: float, prefill_requests: float, decode_requests: float,
                context_tokens: float = 0.0) -> float:
        """Duration (ms) of one engine step with these counts, overhead included."""
        c = self.coeffs
        return (c["const_ms"] + c["per_prefill_token_ms"] * prefill_tokens
                + c["per_prefill_request_ms"] * prefill_requests
                + c["per_decode_request_ms"] * decode_requests
                + c["per_context_token_ms"] * context_tokens
                + self.between_steps_ms(prefill_requests + decode_requests))

    def between_steps_ms(self, requests: float) -> float:
        """The host-side time between two steps (ms) after a step with `requests` requests."""
        return self.overhead_ms + self.overhead_per_request_ms * requests

    def ratios(self, steps: list[tuple]) -> dict[str, float]:
        """How long logged `steps` (rows in STEP_COLUMNS order) took against this profile, per
        kind of work: 'decode', the median logged / fitted time of decode-only steps (overhead
        excluded); 'prefill', the median over steps with prefill tokens of what is left of the
        logged time after the decode-side terms at that ratio, over the prefill terms. A kind
        without steps is left out (and 'prefill' without 'decode' uses ratio 1 for the rest)."""
        c, out = self.coeffs, {}
        side = [(s[3], c["const_ms"] + c["per_decode_request_ms"] * s[6],
                 c["per_prefill_token_ms"] * s[5] + c["per_prefill_request_ms"] * s[4])
                for s in steps]
        dec = [y / d for y, d, p in side if p == 0 and d > 0]
        if dec:
            out["decode"] = float(np.median(dec))
        pf = [(y - out.get("decode", 1.0) * d) / p for y, d, p in side if p > 0]
        if pf:
            out["prefill"] = float(np.median(pf))
        return out

    def at_speed(self, decode: float, prefill: float) -> Profile:
        """This profile on an engine whose decode-side work (constant, decode and context
        terms, between-steps overhead) takes `decode` times as long and whose prefill terms
        take `prefill` times as long; the front-end and the jitter as fitted."""
        for name, f in (("decode", decode), ("prefill", prefill)):
            if not (f > 0 and np.isfinite(f)):
                raise ValueError(f"{name} speed factor {f}: must be a positive number")
        pf = ("per_prefill_token_ms", "per_prefill_request_ms")
        return replace(self, coeffs={k: v * (prefill if k in pf else decode)
                                     for k, v in self.coeffs.items()},
                       overhead_ms=self.overhead_ms * decode,
                       overhead_per_request_ms=self.overhead_per_request_ms * decode)

    def to_yaml(self, path: Path) -> Path:
        doc = {"format": PROFILE_FORMAT, "kind": "measured_step_time", "source": self.source,
               "step_ms": {k: float(self.coeffs[k]) for k in COEFFS},
               "overhead_ms": float(self.overhead_ms),
               "overhead_per_request_ms": float(self.overhead_per_request_ms),
               "api_overhead_ms": float(self.api_overhead_ms),
               "intake_ms": float(self.intake_ms),
               "output_ms": float(self.output_ms),
               "intake_stall_ms": float(self.intake_stall_ms),
               "intake_stall_per_token_ms": float(self.intake_stall_per_token_ms),
               "step_jitter": [float(x) for x in self.step_jitter],
               "decode_jitter": [float(x) for x in self.decode_jitter],
               "step_ratios": {k: float(v) for k, v in self.step_ratios.items()},
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
        decode_jitter = doc.get("decode_jitter") or []
        for name, q in (("step_jitter", jitter), ("decode_jitter", decode_jitter)):
            if not (isinstance(q, list) and all(isinstance(x, int | float) and x > 0
                                                for x in q)):
                raise ProfileInputError(f"profile '{path}': {name} must be a list of positive "
                                        "numbers (quantiles of a step's time over its "
                                        "median or fitted time); refit it with "
                                        "`racksim-validate fit`")
        if decode_jitter and len(decode_jitter) != len(jitter):
            raise ProfileInputError(f"profile '{path}': decode_jitter has {len(decode_jitter)} "
                                    f"levels, step_jitter {len(jitter)}: they must have as "
                                    "many; refit it with `racksim-validate fit`")
        ratios = doc.get("step_ratios") or {}
        if not (isinstance(ratios, dict) and set(ratios) <= {"decode", "prefill"}
                and all(isinstance(v, int | float) and v > 0 for v in ratios.values())):
            raise ProfileInputError(f"profile '{path}': step_ratios must map decode / prefill "
                                    "to positive numbers (median logged / fitted step time); "
                                    "refit it with `racksim-validate fit`")
        front = {k: doc.get(k, 0.0) for k in ("api_overhead_ms", "intake_ms", "output_ms",
                                              "overhead_per_request_ms", "intake_stall_ms",
                                              "intake_stall_per_token_ms")}
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
                   overhead_per_request_ms=float(front["overhead_per_request_ms"]),
                   intake_stall_ms=float(front["intake_stall_ms"]),
                   intake_stall_per_token_ms=float(front["intake_stall_per_token_ms"]),
                   server=ServerShape(**(doc.get("server") or {})),
                   source=str(doc.get("source", "")), provenance=doc.get("provenance") or {},
                   residuals=doc.get("residuals") or {},
                   step_jitter=[float(x) for x in jitter],
                   decode_jitter=[float(x) for x in decode_jitter],
                   step_ratios={k: float(v) for k, v in ratios.items()})


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
        self._decode_jitter = profile.decode_jitter
        self._rng = np.random.default_rng(seed)
        self._draws: list[int] = []

    @classmethod
    def from_profile(cls, profile: Profile, role: str = "colocated", seed: int = 0
                     ) -> MeasuredStepModel:
        return cls(profile=profile, role=role, seed=seed)

    def _level(self) -> int:
        """The next step's jitter level (an index into the jitter lists); drawn 4,096 at a
        time."""
        if not self._draws:
            self._draws = self._rng.integers(0, self._jitter.size, 4096).tolist()
        return self._draws.pop()

    def _step(self, prefill_tokens: float, prefill_requests: float, decode_requests: float,
              context_tokens: float) -> StepBreakdown:
        p = self.profile
        c, between = p.coeffs, p.between_steps_ms(prefill_requests + decode_requests)
        f = 1.0
        if self._jitter.size:
            level = self._level()
            if self._decode_jitter and not prefill_requests:  # the whole step, as seen
                f = self._decode_jitter[level]
                between *= f
            else:
                f = float(self._jitter[level])
        return StepBreakdown(
            cpu=c["const_ms"] * f + between,
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

    decode_repeat = decode_step  # nothing carries over from one step to the next
