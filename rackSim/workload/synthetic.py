"""A small built-in generator of agentic session graphs.

Each session: a main-agent chain of turns, each re-sending the growing conversation (prefix =
the previous turn's whole context) plus new tokens (tool results, instructions); now and then a
turn forks 1..fanout subagents that share the main agent's context as their prefix, run their
own short chains concurrently, and are joined by the next main turn. Lengths are drawn from
gamma/exponential distributions whose means come from `SyntheticSessionsSpec`. Contexts that
would exceed `max_context_tokens` are compacted: the turn restarts from a fresh summary prompt.
"""

from __future__ import annotations

import numpy as np

from rackSim.config.specs import SyntheticSessionsSpec
from rackSim.workload.graph import RequestSpec, SessionGraph

_SHAPE = 2.0  # gamma shape for lengths: coefficient of variation 0.71 (ASSUMED)


def _gamma(rng: np.random.Generator, mean: float) -> int:
    return max(1, int(rng.gamma(_SHAPE, mean / _SHAPE)))


class _Builder:
    def __init__(self, spec: SyntheticSessionsSpec, rng: np.random.Generator):
        self.spec, self.rng, self.reqs = spec, rng, []

    def add(self, parent: int | None, prefix: int, after: tuple[int, ...], delay: float,
            agent: int) -> int:
        s, rng = self.spec, self.rng
        new = _gamma(rng, s.new_tokens_per_turn_mean)
        out = _gamma(rng, s.output_tokens_mean)
        if prefix + new + out > s.max_context_tokens:  # compaction: restart from a summary
            parent, prefix = None, 0
            new = min(_gamma(rng, s.first_prompt_tokens_mean), s.max_context_tokens // 2)
        rid = len(self.reqs)
        self.reqs.append(RequestSpec(rid=rid, parent=parent, prefix_tokens=prefix, new_tokens=new,
                                     output_tokens=out, after=after, delay_s=delay, agent=agent))
        return rid

    def delay(self) -> float:
        return float(self.rng.exponential(self.spec.tool_delay_s_mean))

    def chain(self, parent: int | None, prefix: int, after: tuple[int, ...], turns: int,
              agent: int) -> int:
        """Append a chain of `turns` requests; each extends the previous one's context."""
        last = None
        for _ in range(turns):
            if last is not None:
                parent, prefix, after = last, self.reqs[last].context_tokens, (last,)
            last = self.add(parent, prefix, after, self.delay() if after else 0.0, agent)
        return last


def generate_sessions(spec: SyntheticSessionsSpec, num_sessions: int, seed: int
                      ) -> list[SessionGraph]:
    """`num_sessions` session graphs, deterministic in `seed`."""
    sessions = []
    for i in range(num_sessions):
        rng = np.random.default_rng([seed, i])
        b = _Builder(spec, rng)
        first = min(_gamma(rng, spec.first_prompt_tokens_mean), spec.max_context_tokens // 2)
        b.reqs.append(RequestSpec(rid=0, parent=None, prefix_tokens=0, new_tokens=first,
                                  output_tokens=_gamma(rng, spec.output_tokens_mean)))
        main, agents = 0, 0
        for _ in range(max(0, int(rng.poisson(spec.turns_mean)) - 1)):
            joins: tuple[int, ...] = ()
            if rng.random() < spec.subagent_prob:
                ctx = b.reqs[main].context_tokens
                ends = []
                for _ in range(int(rng.integers(1, spec.subagent_fanout_max + 1))):
                    agents += 1
                    turns = max(1, int(rng.poisson(spec.subagent_turns_mean)))
                    ends.append(b.chain(main, ctx, (main,), turns, agents))
                joins = tuple(ends)
            main = b.add(main, b.reqs[main].context_tokens, (main, *joins), b.delay(), 0)
        sessions.append(SessionGraph(session_id=f"s{i:04d}", requests=tuple(b.reqs)))
    return sessions
