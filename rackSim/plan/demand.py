"""What a demand of the workload asks of a rack: token mix, prefix reuse, session timing.

Measured once per plan from the workload's session graphs with `rackSim.workload.stats` (no
server simulated):

* per request: mean prompt and output tokens, the decode steps its output needs under the
  acceptance model (the engine's arithmetic, `rackSim.engine.decode.decode_steps`), and the
  mean context a decode batch holds (step-weighted);
* prefix reuse as a function of the prefix-cache capacity *per live agent* (tokens): the
  prompts are replayed in send order on `lanes` closed-loop lanes through one block-LRU cache
  of `capacity x lanes` tokens, in two views: a prefill instance's (`prefill_reuse`: outputs
  are not cached until a later prompt carries them, the decode instance held them) and a
  colocated instance's (`colocated_reuse`: the instance that decoded an output keeps it, so
  the next turn's prompt hits it, as vLLM's prefix cache does). Uncached tokens per request
  (mean, mean square, and their quantiles at every 5 %) are kept per capacity and view and
  interpolated in log capacity;
* session duration, linear in the latencies a server gives: ``d = d0 + n_ttft x TTFT +
  n_tpot x TPOT`` (s), where d0 is the tool / think time on the session's critical path,
  n_ttft the requests on it and n_tpot their output tokens after the first. Found exactly
  from three nominal timelines (exact as long as the critical path does not change).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rackSim.engine.decode import decode_steps
from rackSim.workload.graph import SessionGraph
from rackSim.workload.stats import NominalTiming, prefix_hits, timeline

#: Prefix-cache capacities per live agent at which reuse is measured (tokens).
CACHE_PER_AGENT_TOKENS = (0.0, 2e3, 8e3, 32e3, 64e3, 128e3, 256e3, 1e6, 4e6)
#: Levels at which the uncached tokens' distribution is kept (0, 5 %, ..., 100 %).
UNCACHED_LEVELS = np.linspace(0.0, 1.0, 21)


@dataclass(frozen=True)
class DemandProfile:
    """Per-request and per-session statistics of a workload (tokens, seconds)."""

    requests_per_session: float
    prompt_mean: float
    output_mean: float
    prompt_p90: float
    decode_steps_mean: float
    decode_context_mean: float
    session_d0_s: float
    session_n_ttft: float
    session_n_tpot: float
    #: prefix reuse seen by a prefill instance (prompts cached; disaggregated layouts)
    prefill_reuse: Reuse
    #: prefix reuse seen by a colocated instance (prompts and the outputs it decoded cached)
    colocated_reuse: Reuse

    def session_s(self, ttft_s: float, tpot_s: float) -> float:
        """Mean session duration at these mean latencies (s)."""
        return self.session_d0_s + self.session_n_ttft * ttft_s + self.session_n_tpot * tpot_s


@dataclass(frozen=True)
class Reuse:
    """Uncached prompt tokens per request against the prefix-cache capacity per live agent
    (tokens), measured at `CACHE_PER_AGENT_TOKENS` and interpolated in log capacity."""

    cache_per_agent: np.ndarray
    uncached_mean: np.ndarray
    uncached_sq_mean: np.ndarray
    #: (capacity, level): the `UNCACHED_LEVELS` quantiles of uncached tokens per request
    uncached_quantiles: np.ndarray

    @classmethod
    def measured(cls, prompt: np.ndarray, hits_per_capacity: Sequence[np.ndarray]) -> Reuse:
        """From the cached tokens of each request (`prefix_hits`) at every capacity."""
        unc = [prompt - hits for hits in hits_per_capacity]
        return cls(cache_per_agent=np.array(CACHE_PER_AGENT_TOKENS),
                   uncached_mean=np.array([u.mean() for u in unc]),
                   uncached_sq_mean=np.array([(u ** 2).mean() for u in unc]),
                   uncached_quantiles=np.array([np.quantile(u, UNCACHED_LEVELS) for u in unc]))

    def uncached(self, cache_tokens_per_agent: float) -> tuple[float, float, float]:
        """(mean, mean square, P90) of uncached prompt tokens per request at this capacity."""
        x = np.log1p(self.cache_per_agent)
        at = np.log1p(max(cache_tokens_per_agent, 0.0))
        return (float(np.interp(at, x, self.uncached_mean)),
                float(np.interp(at, x, self.uncached_sq_mean)),
                float(self.uncached_quantile(cache_tokens_per_agent, 0.9)))

    def uncached_quantile(self, cache_tokens_per_agent: np.ndarray | float,
                          q: np.ndarray | float) -> np.ndarray:
        """The `q`-quantiles of uncached prompt tokens per request at these capacities
        (broadcast together; linear between the kept levels)."""
        at = np.log1p(np.maximum(np.asarray(cache_tokens_per_agent, dtype=float), 0.0))
        at, q = np.broadcast_arrays(at, np.clip(np.asarray(q, dtype=float), 0.0, 1.0))
        x = np.log1p(self.cache_per_agent)
        by_level = np.stack([np.interp(at, x, col) for col in self.uncached_quantiles.T], -1)
        pos = q * (len(UNCACHED_LEVELS) - 1)
        lo = np.minimum(np.floor(pos).astype(int), len(UNCACHED_LEVELS) - 2)
        below = np.take_along_axis(by_level, lo[..., None], -1)[..., 0]
        above = np.take_along_axis(by_level, lo[..., None] + 1, -1)[..., 0]
        return below + (above - below) * (pos - lo)


def _session_durations(graphs: Sequence[SessionGraph], ttft_s: float, tpot_s: float
                       ) -> float:
    tab = timeline(graphs, NominalTiming(ttft_s=ttft_s, tpot_s=tpot_s))
    return float(tab.groupby("session")["finish_s"].max().mean())


def profile_demand(graphs: Sequence[SessionGraph], accepted_tokens_per_step: float,
                   lanes: int) -> DemandProfile:
    """Measure a `DemandProfile` of `graphs` replayed on `lanes` live agents."""
    if not graphs:
        raise ValueError("empty workload: no session graphs")
    tab = timeline(graphs, NominalTiming(concurrency=max(lanes, 1)))
    prompt = tab["prompt"].to_numpy(dtype=float)
    output = tab["output"].to_numpy(dtype=float)
    steps = np.array([decode_steps(int(o), accepted_tokens_per_step) for o in output])
    caps = [per_agent * max(lanes, 1) for per_agent in CACHE_PER_AGENT_TOKENS]
    d0 = _session_durations(graphs, 0.0, 0.0)
    # TPOT applies to tokens after the first; timeline charges every output token, so the
    # requests' first tokens are taken back out of n_tpot below.
    n_ttft = _session_durations(graphs, 1.0, 0.0) - d0
    n_out = _session_durations(graphs, 0.0, 1.0) - d0
    return DemandProfile(
        requests_per_session=len(tab) / len(graphs),
        prompt_mean=float(prompt.mean()), output_mean=float(output.mean()),
        prompt_p90=float(np.quantile(prompt, 0.9)),
        decode_steps_mean=float(steps.mean()),
        decode_context_mean=float((steps * (prompt + output / 2)).sum() / steps.sum()),
        session_d0_s=d0, session_n_ttft=n_ttft, session_n_tpot=max(n_out - n_ttft, 0.0),
        prefill_reuse=Reuse.measured(prompt, prefix_hits(graphs, tab, caps)),
        colocated_reuse=Reuse.measured(prompt, prefix_hits(graphs, tab, caps,
                                                            outputs_kept=True)))
