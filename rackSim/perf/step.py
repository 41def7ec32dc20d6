"""What the engine asks `perf/`: the cost of one step of one instance, with a named breakdown.

The engine keeps batch aggregates up to date on admit / retire and hands them over as a
`PrefillBatch` or `DecodeBatch`; a `StepModel` answers with a `StepBreakdown` in milliseconds.
Step models may hold state that evolves with the steps they price (EPLB load history, a
seeded straggler generator) but never touch SimPy or globals.

The three records are values: nobody changes one after building it (`with_kv_stall` returns a
new breakdown). They are not `frozen` dataclasses only because one is built per simulated step
and a frozen dataclass takes three times as long to build.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Protocol


@dataclass(slots=True)
class StepBreakdown:
    """Milliseconds spent in each part of a step; `total_ms` is their sum."""

    moe: float = 0.0
    attention: float = 0.0
    indexer: float = 0.0
    dense: float = 0.0
    comm: float = 0.0
    draft: float = 0.0
    cpu: float = 0.0
    sync: float = 0.0
    straggler: float = 0.0
    kv_stall: float = 0.0

    @property
    def total_ms(self) -> float:
        return (self.moe + self.attention + self.indexer + self.dense + self.comm + self.draft
                + self.cpu + self.sync + self.straggler + self.kv_stall)

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_kv_stall(self, ms: float) -> StepBreakdown:
        if ms <= 0:
            return self
        d = self.as_dict()
        d["kv_stall"] += ms
        return StepBreakdown(**d)


COMPONENTS: tuple[str, ...] = tuple(f.name for f in fields(StepBreakdown))


@dataclass(slots=True)
class PrefillBatch:
    """One chunked-prefill step of an instance.

    new_tokens: tokens computed this step over all requests (their chunks), summed over ranks.
    attended_tokens: sum over the batch of (tokens before the chunk + chunk) - the context the
        chunk's queries attend to (cached prefix included).
    num_requests: requests with a chunk in this step.
    admitted_prompt_tokens: prompt tokens of requests admitted this step (CPU admission work).
    host_loaded_bytes: KV bytes promoted from the host tier for this step's requests.
    ranks: GPUs of the instance (DEP width or TP size).
    busiest_rank_tokens: new tokens of the DP rank computing the most (0: spread evenly over
        the ranks, as a prefill instance's one scheduler spreads them).
    """

    new_tokens: int
    attended_tokens: int
    num_requests: int
    admitted_prompt_tokens: int
    ranks: int
    host_loaded_bytes: float = 0.0
    busiest_rank_tokens: int = 0


@dataclass(slots=True)
class DecodeBatch:
    """One decode step of a DEPn (or TP) instance.

    requests_per_rank / context_tokens_per_rank: live aggregates, one entry per DP rank.
    tokens_per_request: tokens each request emits this step (1 + accepted drafts, mean).
    draft_tokens: draft tokens proposed per request per step (verified in the step).
    new_loads: requests admitted this step (their KV just arrived).
    admitted_prompt_tokens: prompt tokens of those requests (CPU admission work).
    step_index: the instance's step counter (stateful models key history on it).
    rank_admissions: for each DP rank that admits requests this step, (requests, prompt
        tokens, KV blocks received) - the admission work of that rank's scheduler. Empty when
        nothing is admitted; a caller that leaves it empty while admitting is taken to admit
        everything on one rank.
    """

    requests_per_rank: Sequence[int]
    context_tokens_per_rank: Sequence[float]
    tokens_per_request: float
    draft_tokens: int
    new_loads: int
    admitted_prompt_tokens: int
    step_index: int
    rank_admissions: Sequence[tuple[int, int, int]] = ()


class StepModel(Protocol):
    """Prices steps of one instance. One object per instance: it may carry that instance's
    EPLB history and straggler state. A model that tracks expert-load balance may expose
    `last_balancedness` (mean / max rank load of its last priced step); the engine records it
    in the step rows."""

    def prefill_step(self, batch: PrefillBatch) -> StepBreakdown: ...

    def decode_step(self, batch: DecodeBatch) -> StepBreakdown: ...

    def decode_repeat(self, batch: DecodeBatch) -> StepBreakdown:
        """`decode_step(batch)`, for a batch that admits nothing and holds the same requests
        on every rank as the last decode batch this model priced (only their contexts and the
        step index moved): a model may reuse what depends on the request counts alone."""
        ...

    def mixed_step(self, prefill: PrefillBatch, decode: DecodeBatch) -> StepBreakdown:
        """A colocated instance's step: prefill chunks and decode tokens in one forward."""
        ...
