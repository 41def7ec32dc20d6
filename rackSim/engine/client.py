"""Clients: they send each session's requests as their dependencies finish.

Driven by callbacks rather than a process per request: a request is sent when everything it
waits on has finished and its delay has passed, and its completion (reported by the decode
instance) releases the requests waiting on it. One timer event per delayed request.

- `AgentClients`: closed loop. Each lane is a live agent client replaying sessions one after
  another (the replay policy in rackSim.workload.replay).
- `TraceClients`: open loop. Sessions of a timestamped trace start at their arrival times
  (rackSim.workload.open_loop), whatever the deployment's state.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy
from simpy.events import Timeout

from rackSim.engine.request import Job
from rackSim.metrics.records import RequestLog, RequestRecord
from rackSim.workload.graph import RequestSpec, SessionInstance
from rackSim.workload.open_loop import OpenLoopSchedule
from rackSim.workload.replay import (
    PRIMER,
    ClosedLoopReplay,
    LaneStart,
    OpenLoopPhases,
    SessionCursor,
)


class _SessionClients:
    """Sends a session's requests in dependency order; subclasses start the sessions."""

    def __init__(self, env: simpy.Environment, phases: ClosedLoopReplay | OpenLoopPhases,
                 submit: Callable[[Job], None], records: RequestLog):
        self.env, self.phases, self.submit, self.records = env, phases, submit, records
        self.stopped = False
        self.in_flight = 0
        self._cursor: dict[int, SessionCursor] = {}  # session key base -> its cursor

    def _begin(self, inst: SessionInstance, start_rid: int = 0, at_once: bool = False) -> None:
        """Start a session replay; `at_once` sends its first requests without their delay."""
        cursor = self._cursor[inst.key_base] = SessionCursor(inst, start_rid)
        for spec in cursor.start():
            if at_once:
                self._send(cursor, spec)
            else:
                self._later(cursor, spec)

    def _later(self, cursor: SessionCursor, spec: RequestSpec) -> None:
        if spec.delay_s > 0:
            ev = Timeout(self.env, spec.delay_s)
            ev.callbacks.append(lambda _e: self._send(cursor, spec))
        else:
            self._send(cursor, spec)

    def _send(self, cursor: SessionCursor, spec: RequestSpec) -> None:
        end = self.phases.window_end_s
        now = self.env.now
        if self.stopped or (end is not None and now >= end):
            return  # after the window: in-flight requests drain, nothing new is sent
        inst = cursor.inst
        self._submit(inst, spec, self.phases.phase_of_send(inst.lane, now), self._done)

    def _submit(self, inst: SessionInstance, spec: RequestSpec, phase: str,
                done: Callable[[Job], None]) -> None:
        """Record `spec` as sent now in `phase` and submit it; `done` runs when it finishes."""
        rec = RequestRecord(session_id=inst.graph.session_id, rid=spec.rid, lane=inst.lane,
                            session_key=inst.key_base, agent=spec.agent, send_s=self.env.now,
                            prompt_tokens=spec.prompt_tokens, phase=phase)
        self.records.append(rec)
        self.in_flight += 1
        self.submit(Job(spec, inst, inst.prompt_path(spec.rid), rec, done,
                        spec.output_tokens, spec.prompt_tokens))

    def _closed(self, job: Job) -> None:
        """`job` finished: its record is final and it is no longer in flight."""
        self.records.close(job.rec)
        self.in_flight -= 1

    def _done(self, job: Job) -> None:
        self._closed(job)
        inst = job.inst
        self.phases.note_done(inst.lane, self.env.now)
        cursor = self._cursor[inst.key_base]
        for spec in cursor.complete(job.spec.rid):
            self._later(cursor, spec)
        if cursor.done:
            del self._cursor[inst.key_base]
            self._session_finished(inst)

    def _session_finished(self, inst: SessionInstance) -> None:
        pass


class AgentClients(_SessionClients):
    """Closed loop: `replay.lanes` agent clients, each replaying one session at a time.

    A lane that starts mid-session first has its context primed: by `warm` (the prefix is
    resident at once, as on a rack already serving), or with `warm=None` by sending the
    primer as a request of one output token and starting the session when it finishes, as
    the validated mode's driver does to a real server (its record's phase is 'primer')."""

    def __init__(self, env: simpy.Environment, replay: ClosedLoopReplay,
                 submit: Callable[[Job], None],
                 warm: Callable[[SessionInstance, RequestSpec], None] | None,
                 records: RequestLog):
        super().__init__(env, replay, submit, records)
        self.replay, self.warm = replay, warm

    def start(self) -> None:
        for lane in range(self.replay.lanes):
            first = self.replay.first(lane)
            if first.primer is not None and self.warm is None:
                self._prime(first)
                continue
            if first.primer is not None:
                self.warm(first.inst, first.primer)
            self._begin(first.inst, first.start_rid, at_once=True)  # the lane arrives now

    def _prime(self, first: LaneStart) -> None:
        def primed(job: Job) -> None:
            self._closed(job)
            self._begin(first.inst, first.start_rid, at_once=True)

        self._submit(first.inst, first.primer, PRIMER, primed)

    def _session_finished(self, inst: SessionInstance) -> None:
        self._begin(self.replay.next(inst.lane))


class TraceClients(_SessionClients):
    """Open loop: each session of a timestamped trace starts at its arrival time."""

    def __init__(self, env: simpy.Environment, schedule: OpenLoopSchedule,
                 phases: OpenLoopPhases, submit: Callable[[Job], None],
                 records: RequestLog):
        super().__init__(env, phases, submit, records)
        self._arrivals = iter(schedule)

    def start(self) -> None:
        self._next_arrival()

    def _next_arrival(self) -> None:
        """Arm one timer for the next arrival only: pending events stay O(1)."""
        nxt = next(self._arrivals, None)
        if nxt is None:
            return
        t, inst = nxt

        def arrive(_e: simpy.Event) -> None:
            self._begin(inst)
            self._next_arrival()

        self.env.timeout(max(0.0, t - self.env.now)).callbacks.append(arrive)
