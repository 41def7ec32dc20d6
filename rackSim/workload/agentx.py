"""Parametric AgentX-style session generator (agentic coding sessions as session graphs).

A session is a main-agent chain: the first prompt is a system prompt (shared by every agent
of the session) plus the user's task; every later turn re-sends the previous context plus
new tokens (tool results); with `resent_output_share` < 1 only that share of the previous
response is re-sent (reasoning dropped between turns), as new tokens after the previous
prompt. After a turn the main agent may fork 1..k subagents (a tool call that spawns them):
each starts from the session's system prompt plus a task the main agent wrote, runs its own
chain concurrently, and the main agent's next turn waits for all of them (join) and reads
their final answers as new tokens. A chain whose next turn would pass
`compact_at x context_window` first compacts: it sends the context plus a summarise
instruction, and continues from the system prompt plus that summary, so no prompt + output
ever exceeds the window.

AgentX's per-session statistics are not public (docs/workload.md): EVERY default below is an
ASSUMPTION chosen to reproduce the stated shape (contexts ~15-30K growing to ~100K+ over tens
of turns, a few hundred output tokens, tool delays of seconds, occasional 1-5 subagent
fan-out). The reason for each is in its field description.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rackSim.workload.graph import RequestSpec, SessionGraph


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


_PARAMS = {"constant": {"value"}, "uniform": {"low", "high"}, "randint": {"low", "high"},
           "lognormal": {"median", "sigma"}, "exponential": {"mean"}}


class Dist(_Strict):
    """A distribution of one quantity, samples clipped to [min, max].

    constant(value) | uniform(low, high) | randint(low, high), both ends included |
    lognormal(median, sigma of the log) | exponential(mean).
    """

    kind: Literal["constant", "uniform", "randint", "lognormal", "exponential"]
    value: float | None = Field(default=None, allow_inf_nan=False)
    low: float | None = Field(default=None, allow_inf_nan=False)
    high: float | None = Field(default=None, allow_inf_nan=False)
    median: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    sigma: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    mean: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    min: float = Field(default=0.0, allow_inf_nan=False)
    max: float = Field(default=math.inf, description="inf: no cap")

    @model_validator(mode="after")
    def _check(self) -> Dist:
        need = _PARAMS[self.kind]
        given = {k for k in ("value", "low", "high", "median", "sigma", "mean")
                 if getattr(self, k) is not None}
        if given != need:
            raise ValueError(f"kind '{self.kind}' takes exactly {sorted(need)}, got "
                             f"{sorted(given)}")
        if self.kind in ("uniform", "randint") and self.low > self.high:
            raise ValueError(f"low={self.low} exceeds high={self.high}")
        if math.isnan(self.max):
            raise ValueError("max=nan: give a number, or leave it out for no cap")
        if self.min > self.max:
            raise ValueError(f"min={self.min} exceeds max={self.max}")
        return self

    @property
    def upper(self) -> float:
        """Largest value a sample can take."""
        top = {"constant": self.value, "uniform": self.high, "randint": self.high}
        return min(top.get(self.kind, math.inf), self.max)

    def sample(self, rng: np.random.Generator) -> float:
        k = self.kind
        if k == "constant":
            x = self.value
        elif k == "uniform":
            x = rng.uniform(self.low, self.high)
        elif k == "randint":
            x = rng.integers(math.ceil(self.low), math.floor(self.high) + 1)
        elif k == "lognormal":
            x = self.median * math.exp(self.sigma * rng.standard_normal())
        else:
            x = rng.exponential(self.mean)
        return float(min(max(x, self.min), self.max))

    def sample_int(self, rng: np.random.Generator, lo: int = 0) -> int:
        return max(lo, round(self.sample(rng)))


def _logn(median: float, sigma: float, lo: float, hi: float) -> Dist:
    return Dist(kind="lognormal", median=median, sigma=sigma, min=lo, max=hi)


class AgentXSpec(_Strict):
    """AgentX-style generator parameters. Every default is an ASSUMPTION (see module doc)."""

    num_sessions: int = Field(default=393, gt=0, description=(
        "sessions in the pool; 393 = the number of opt-in sessions AgentX was built from"))
    context_window: int = Field(default=131_072, gt=0, description=(
        "max prompt + output tokens of any request; set it to the served model's window"))
    compact_at: float = Field(default=0.85, gt=0, le=1, description=(
        "a chain compacts before a turn would pass this share of the window; coding agents "
        "auto-compact when most of the window is used"))
    system_tokens: Dist = Field(default=_logn(14_000, 0.2, 4_000, 30_000), description=(
        "system prompt + tool schemas + project instructions, shared by all agents of a "
        "session; together with task_tokens it puts first prompts at ~15-30K"))
    task_tokens: Dist = Field(default=_logn(2_000, 0.8, 50, 20_000), description=(
        "the user's first message with pasted code or files (heavy-tailed)"))
    turns: Dist = Field(default=_logn(25, 0.7, 1, 300), description=(
        "main-agent turns per session (median 25, mean ~32): 'tens of turns'"))
    new_tokens: Dist = Field(default=_logn(900, 1.1, 10, 40_000), description=(
        "tokens appended per turn (tool results: file reads, command output; heavy-tailed, "
        "mean ~1.6K) so that contexts grow to ~100K within a few tens of turns"))
    output_tokens: Dist = Field(default=_logn(220, 0.9, 1, 16_384), description=(
        "tokens generated per request (tool calls, edits, short answers; mean ~330): 'a few "
        "hundred output tokens'"))
    tool_delay_s: Dist = Field(default=_logn(1.5, 1.2, 0.0, 300.0), description=(
        "time between a response and the next request (tool execution; median 1.5 s, mean "
        "~3 s, rare minutes): 'tool delays of seconds'"))
    resent_output_share: float = Field(default=1.0, gt=0, le=1, description=(
        "share of a response the agent sends back in its next prompt. 1: the whole response "
        "(reasoning included) re-enters the context as a continuation of the previous prompt; "
        "below 1 the reasoning is dropped, as reasoning-model APIs and coding agents do between "
        "turns, and only the kept share (the answer / tool call) follows the previous prompt as "
        "new tokens"))
    subagent_prob: float = Field(default=0.025, ge=0, le=1, description=(
        "chance a turn forks subagents (~0.8 fan-outs per 32-turn session, about half the "
        "sessions fork at least once): 'occasional'"))
    fanout: Dist = Field(default=Dist(kind="randint", low=1, high=5), description=(
        "subagents per fork: uniform over the stated 1-5 range (no shape is public)"))
    subagent_task_tokens: Dist = Field(default=_logn(800, 0.7, 50, 10_000), description=(
        "the task prompt the parent writes for a subagent"))
    subagent_turns: Dist = Field(default=_logn(6, 0.6, 1, 60), description=(
        "turns of a subagent chain (median 6, mean ~7): short focused searches / edits"))
    subagent_max_depth: int = Field(default=1, ge=0, description=(
        "fork nesting: 1 = subagents do not spawn subagents (as in common coding agents)"))
    subagent_prefix: Literal["system", "context"] = Field(default="system", description=(
        "what a subagent's prompt shares with its parent: the system prompt, or the parent's "
        "whole context"))
    join_overhead_tokens: int = Field(default=100, ge=0, description=(
        "tokens wrapping each subagent's final answer when the parent reads it back"))
    max_fork_requests: int = Field(default=5_000, gt=0, description=(
        "no more forks once a session holds this many requests (guards nested fan-out from "
        "growing without bound)"))
    compaction_instruction_tokens: int = Field(default=300, ge=1, description=(
        "the summarise instruction a compaction request appends"))
    summary_tokens: Dist = Field(default=_logn(2_500, 0.4, 500, 8_000), description=(
        "length of a compaction summary (its output, re-sent after the system prompt)"))

    @model_validator(mode="after")
    def _check(self) -> AgentXSpec:
        room = self.context_window * (1 - self.compact_at)
        need = self.compaction_instruction_tokens + self.summary_tokens.upper
        if room < need:
            raise ValueError(
                f"compact_at={self.compact_at} leaves {room:.0f} tokens of the window, less than "
                f"a compaction request needs ({need:.0f} = instruction + largest summary); "
                "bound summary_tokens with 'max'")
        start = self.system_tokens.upper + self.summary_tokens.upper + 64
        if start > self.compact_at * self.context_window:
            raise ValueError("the largest system prompt + summary leave no room below "
                             "compact_at x context_window; bound them with 'max'")
        return self


class _Session:
    """Builds one session graph; requests are appended in topological order."""

    def __init__(self, spec: AgentXSpec, rng: np.random.Generator):
        self.s, self.rng = spec, rng
        self.reqs: list[RequestSpec] = []
        self.limit = int(spec.compact_at * spec.context_window)
        self.system = spec.system_tokens.sample_int(rng, lo=1)
        self.agents = 0

    def add(self, parent: int | None, prefix: int, new: int, out: int,
            after: tuple[int, ...], delay: float, agent: int) -> int:
        rid = len(self.reqs)
        self.reqs.append(RequestSpec(rid, parent, prefix, new, out, after, delay, agent))
        return rid

    def output(self) -> int:
        return self.s.output_tokens.sample_int(self.rng, lo=1)

    def delay(self) -> float:
        return self.s.tool_delay_s.sample(self.rng)

    def first(self, parent: int | None, task: int, after: tuple[int, ...], delay: float,
              agent: int) -> int:
        """A chain's first request: the system prompt (shared via `parent`) plus a task."""
        out = self.output()
        task = max(1, min(task, self.limit - self.system - out))
        if parent is None:
            return self.add(None, 0, self.system + task, out, after, delay, agent)
        if self.s.subagent_prefix == "context":
            ctx = self.reqs[parent].context_tokens
            if ctx + task + out <= self.limit:
                return self.add(parent, ctx, task, out, after, delay, agent)
        return self.add(parent, self.system, task, out, after, delay, agent)

    def turn(self, prev: int, new: int, after: tuple[int, ...], delay: float, agent: int) -> int:
        """The next turn of a chain: `prev`'s context plus `new` tokens (compacts first). With
        `resent_output_share` below 1 the prefix is `prev`'s prompt and the kept share of its
        response is new input (its reasoning is not re-sent)."""
        out = self.output()
        p = self.reqs[prev]
        share = self.s.resent_output_share
        if share < 1.0:
            new += round(share * p.output_tokens)
            ctx = p.prompt_tokens
        else:
            ctx = p.context_tokens
        if ctx + new + out <= self.limit:
            return self.add(prev, ctx, new, out, after, delay, agent)
        s = self.s
        summary = s.summary_tokens.sample_int(self.rng, lo=1)
        c = self.add(prev, ctx, s.compaction_instruction_tokens, summary, after, delay, agent)
        new = max(0, min(new, self.limit - self.system - summary - out))
        return self.add(c, self.system, summary + new, out, (c,), 0.0, agent)

    def chain(self, head: int, turns: int, agent: int, depth: int) -> int:
        """Extend the chain starting at `head` to `turns` requests; return its last rid."""
        last = head
        for _ in range(turns - 1):
            ends = self.fork(last, depth)
            answers = sum(self.reqs[e].output_tokens + self.s.join_overhead_tokens for e in ends)
            new = self.s.new_tokens.sample_int(self.rng) + answers
            last = self.turn(last, new, (last, *ends), self.delay(), agent)
        return last

    def fork(self, at: int, depth: int) -> list[int]:
        """Maybe spawn subagents after request `at`; return their chains' last rids."""
        s = self.s
        if depth >= s.subagent_max_depth or self.rng.random() >= s.subagent_prob \
                or len(self.reqs) >= s.max_fork_requests:
            return []
        ends = []
        for _ in range(s.fanout.sample_int(self.rng, lo=1)):
            self.agents += 1
            agent = self.agents
            task = s.subagent_task_tokens.sample_int(self.rng, lo=1)
            head = self.first(at, task, (at,), self.delay(), agent)
            ends.append(self.chain(head, s.subagent_turns.sample_int(self.rng, lo=1), agent,
                                   depth + 1))
        return ends


def generate_agentx(spec: AgentXSpec, seed: int, num_sessions: int | None = None
                    ) -> list[SessionGraph]:
    """A pool of AgentX-style session graphs (`spec.num_sessions` unless given).

    Session i depends only on (seed, i), so pools of different sizes share their first sessions.
    """
    graphs = []
    for i in range(spec.num_sessions if num_sessions is None else num_sessions):
        b = _Session(spec, np.random.default_rng([seed, i]))
        head = b.first(None, spec.task_tokens.sample_int(b.rng, lo=1), (), 0.0, 0)
        b.chain(head, spec.turns.sample_int(b.rng, lo=1), 0, 0)
        graphs.append(SessionGraph(f"agentx-{i:04d}", tuple(b.reqs)))
    return graphs
