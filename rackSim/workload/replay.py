"""Closed-loop replay policy, shared by the simulator and the validated-mode driver.

`concurrency` lanes are live agent clients. Each lane replays one session at a time (its
subagent branches run concurrently, so in-flight requests may exceed the concurrency) and
starts the next session when one finishes. A lane's first session starts at a random turn of
its main chain, so the lanes are not in lock-step; a *primer* first sends that turn's parent
prompt (one output token) to make the active prefix resident. Then each lane's first
`warmup_requests_per_lane` requests warm up; the measurement window opens when every lane has
finished its warm-up and lasts `window_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        k = self._count[lane]
        self._count[lane] += 1
        graph = self.sessions[(lane + k * self.lanes) % len(self.sessions)]
        return SessionInstance(graph, key_base=(lane << _LANE_SHIFT) | (k << _SESSION_SHIFT),
                               lane=lane)

    def first(self, lane: int) -> LaneStart:
        """The lane's first session, started at a random main-chain turn."""
        inst = self._instance(lane)
        main = [r.rid for r in inst.graph.requests if r.agent == 0]
        rng = np.random.default_rng([self.seed, lane, 7])
        start = int(main[int(rng.integers(len(main)))])
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
