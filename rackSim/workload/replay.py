"""Closed-loop replay policy, shared by the simulator and the validated-mode driver.

`concurrency` lanes are live agent clients. Each lane replays one session at a time (its
subagent branches run concurrently, so in-flight requests may exceed the concurrency) and
starts the next session when one finishes. A lane's first session starts where a lane of a
long-running replay would be at a random instant, so that a window opened soon after the start
already sees the steady state's mix: the pool's sessions are laid end to end in nominal time
(each request 1 s to its first token and 5 ms per output token, the tool and think delays as
written), lane i draws a uniform point in the i-th of `concurrency` equal slices of that line,
and starts the session it falls in at the main-chain turn in progress there. A long session is
in progress at a random instant more often than a short one, and at a late turn as often as
at an early one; starting every lane at session 0, or at a uniform turn of a uniformly chosen
session, over-weights short sessions and early turns (short prompts) until the first
sessions have run out, a session's length or more (`start: fresh` starts every lane at its
session's first turn at once instead: a batch of agents launched together). A *primer* first
sends the starting turn's parent prompt (one output token) to make the active prefix
resident. Then each lane's first
`warmup_requests_per_lane` requests warm up; the measurement window opens when every lane has
finished its warm-up and lasts `window_s`.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

import numpy as np

from rackSim.config.specs import ReplaySpec
from rackSim.workload.graph import RequestSpec, SessionGraph, SessionInstance

PRIMER, WARMUP, WINDOW, DRAIN = "primer", "warmup", "window", "drain"
_LANE_SHIFT, _SESSION_SHIFT = 40, 20  # node key = lane << 40 | k << 20 | rid  (< 2**60)


class SessionCursor:
    """Which requests of one session replay may be sent, as earlier ones complete."""

    def __init__(self, inst: SessionInstance, start_rid: int = 0):
        self.inst = inst
        graph = inst.graph
        if start_rid == 0:
            self._waiting_on = {r.rid: len(r.after) for r in graph.requests}
        else:
            self._waiting_on = {r.rid: sum(1 for a in r.after if a >= start_rid)
                                for r in graph.requests if r.rid >= start_rid}
        self._children = graph.dependents
        self._start = start_rid
        self._left = len(self._waiting_on)

    def start(self) -> list[RequestSpec]:
        reqs = self.inst.graph.requests
        return [reqs[rid] for rid, n in self._waiting_on.items() if n == 0]

    def complete(self, rid: int) -> list[RequestSpec]:
        """Mark `rid` finished; return the requests this makes ready to send."""
        self._left -= 1
        ready = []
        reqs = self.inst.graph.requests
        for c in self._children[rid]:
            if c < self._start:
                continue
            self._waiting_on[c] -= 1
            if self._waiting_on[c] == 0:
                ready.append(reqs[c])
        return ready

    @property
    def done(self) -> bool:
        return self._left == 0


@dataclass(frozen=True, slots=True)
class LaneStart:
    """A lane's first session: where it starts and the primer that warms its prefix."""

    inst: SessionInstance
    start_rid: int
    primer: RequestSpec | None


class _Phases:
    """The measurement window and the phase of a request sent at a given time."""

    window_start_s: float | None
    spec: ReplaySpec

    def phase_at(self, now_s: float) -> str:
        if self.window_start_s is None or now_s < self.window_start_s:
            return WARMUP
        if now_s < self.window_start_s + self.spec.window_s:
            return WINDOW
        return DRAIN

    @property
    def window_end_s(self) -> float | None:
        if self.window_start_s is None:
            return None
        return self.window_start_s + self.spec.window_s


class OpenLoopPhases(_Phases):
    """Open loop (timestamped traces): the first `warmup_s` warm up, then the window."""

    def __init__(self, spec: ReplaySpec):
        self.spec = spec
        self.window_start_s = spec.warmup_s

    def phase_of_send(self, lane: int, now_s: float) -> str:
        return self.phase_at(now_s)

    def warmup_progress(self, now_s: float) -> tuple[float, float, str]:
        """(done, total, unit) of the warm-up: simulated seconds of `warmup_s`."""
        return min(now_s, self.spec.warmup_s), self.spec.warmup_s, "sim s"

    def note_done(self, lane: int, now_s: float) -> bool:
        return False


class ClosedLoopReplay(_Phases):
    """Assigns sessions to lanes and tracks warm-up and the measurement window."""

    def __init__(self, sessions: list[SessionGraph], spec: ReplaySpec, seed: int):
        if not sessions:
            raise ValueError("workload: no sessions to replay")
        self.sessions, self.spec, self.seed = sessions, spec, seed
        self._count = [0] * spec.concurrency      # sessions started per lane
        self._first = [0] * spec.concurrency      # pool index of each lane's first session
        self._sent = [0] * spec.concurrency       # real requests sent per lane
        self._warm_left = spec.concurrency
        self._warm = [False] * spec.concurrency
        self.window_start_s: float | None = None
        if spec.warmup_requests_per_lane == 0 and not spec.primer:
            self.window_start_s = 0.0
            self._warm_left = 0

    @property
    def lanes(self) -> int:
        return self.spec.concurrency

    def _instance(self, lane: int) -> SessionInstance:
        """The lane's next session: the pool in order from its first one, so that over a
        long replay every lane runs every session once per pass (lanes are never pinned to a
        few sessions, which would weight short ones by how often they repeat)."""
        k = self._count[lane]
        self._count[lane] += 1
        graph = self.sessions[(self._first[lane] + k) % len(self.sessions)]
        return SessionInstance(graph, key_base=(lane << _LANE_SHIFT) | (k << _SESSION_SHIFT),
                               lane=lane)

    @cached_property
    def _pool_line(self) -> tuple[list[float], list[tuple[list[float], list[int]]]]:
        """The pool's sessions end to end in nominal time: (cumulative end of each session,
        per session the nominal send times and rids of its main-chain requests, in send
        order; all its requests if it has no main agent) (s)."""
        ends, mains = [], []
        for g in self.sessions:
            send, finish = g.nominal_times()
            ends.append(max(finish, default=0.0))
            timed = sorted(zip(send, (r.rid for r in g.requests), strict=True))
            main = [t for t in timed if g.requests[t[1]].agent == 0] or timed
            mains.append(([s for s, _ in main], [rid for _, rid in main]))
        return list(accumulate(ends)), mains

    def start_point(self, lane: int) -> tuple[int, int]:
        """(session index in the pool, main-chain rid) where `lane` starts: a uniform point
        in its slice of the pool's nominal time line (module docstring)."""
        ends, mains = self._pool_line
        rng = np.random.default_rng([self.seed, lane, 7])
        x = (lane + float(rng.random())) / self.lanes * ends[-1]
        j = min(bisect_right(ends, x), len(ends) - 1)
        sends, rids = mains[j]
        at = x - (ends[j - 1] if j else 0.0)
        return j, rids[max(bisect_right(sends, at) - 1, 0)]

    def first(self, lane: int) -> LaneStart:
        """The lane's first session and turn (`start_point`, or the pool's session `lane`
        from its first turn when the replay starts `fresh`), with its primer."""
        if self.spec.start == "fresh":
            self._first[lane] = lane % len(self.sessions)
            return LaneStart(self._instance(lane), 0, None)
        self._first[lane], start = self.start_point(lane)
        inst = self._instance(lane)
        parent = inst.graph.requests[start].parent
        primer = None
        if self.spec.primer and parent is not None:
            p = inst.graph.requests[parent]
            primer = RequestSpec(rid=p.rid, parent=p.parent, prefix_tokens=p.prefix_tokens,
                                 new_tokens=p.new_tokens, output_tokens=1, agent=p.agent)
        return LaneStart(inst, start, primer)

    def next(self, lane: int) -> SessionInstance:
        """The lane's next session (from its first turn)."""
        return self._instance(lane)

    def warmup_progress(self, now_s: float) -> tuple[float, float, str]:
        """(done, total, unit) of the warm-up: lanes that have finished theirs."""
        return self.lanes - self._warm_left, self.lanes, "lanes"

    def phase_of_send(self, lane: int, now_s: float) -> str:
        """Phase of a request the lane sends now; counts it toward the lane's warm-up."""
        self._sent[lane] += 1
        if self._sent[lane] <= self.spec.warmup_requests_per_lane:
            return WARMUP
        return self.phase_at(now_s)

    def note_done(self, lane: int, now_s: float) -> bool:
        """A lane's request finished. Returns True when this opens the measurement window."""
        if self._warm[lane] or self._sent[lane] < self.spec.warmup_requests_per_lane:
            return False
        self._warm[lane] = True
        self._warm_left -= 1
        if self._warm_left == 0 and self.window_start_s is None:
            self.window_start_s = now_s
            return True
        return False
