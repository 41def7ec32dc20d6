"""Closed-loop agent clients: each lane replays session graphs one after another.

Driven by callbacks rather than a process per request: a request is sent when its
dependencies have finished and its delay has passed, and its completion (from the decode
instance) releases the requests waiting on it. One timer event per delayed request.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from rackSim.engine.request import Job
from rackSim.metrics.records import RequestRecord
from rackSim.workload.graph import RequestSpec, SessionInstance
from rackSim.workload.replay import ClosedLoopReplay, SessionCursor


class AgentClients:
    def __init__(self, env: simpy.Environment, replay: ClosedLoopReplay,
                 submit: Callable[[Job], None], warm: Callable[[SessionInstance, RequestSpec],
                                                                None],
                 records: list[RequestRecord], on_window_open: Callable[[], None]):
        self.env, self.replay, self.submit, self.warm = env, replay, submit, warm
        self.records, self.on_window_open = records, on_window_open
        self.cursors: list[SessionCursor | None] = [None] * replay.lanes
        self.stopped = False
        self.in_flight = 0

    def start(self) -> None:
        for lane in range(self.replay.lanes):
            first = self.replay.first(lane)
            if first.primer is not None:
                self.warm(first.inst, first.primer)
            cursor = self.cursors[lane] = SessionCursor(first.inst, first.start_rid)
            for spec in cursor.start():
                self._later(cursor, spec)
        if self.replay.window_start_s is not None:
            self.on_window_open()

    def _later(self, cursor: SessionCursor, spec: RequestSpec) -> None:
        if spec.delay_s > 0:
            ev = self.env.timeout(spec.delay_s)
            ev.callbacks.append(lambda _e: self._send(cursor, spec))
        else:
            self._send(cursor, spec)

    def _send(self, cursor: SessionCursor, spec: RequestSpec) -> None:
        end = self.replay.window_end_s
        if self.stopped or (end is not None and self.env.now >= end):
            return  # after the window: in-flight requests drain, nothing new is sent
        inst = cursor.inst
        now = self.env.now
        rec = RequestRecord(session_id=inst.graph.session_id, rid=spec.rid, lane=inst.lane,
                            session_key=inst.key_base, agent=spec.agent, send_s=now,
                            prompt_tokens=spec.prompt_tokens,
                            phase=self.replay.phase_of_send(inst.lane, now))
        self.records.append(rec)
        self.in_flight += 1
        self.submit(Job(spec=spec, inst=inst, path=inst.prompt_path(spec.rid), rec=rec,
                        on_done=self._done, output_tokens=spec.output_tokens,
                        prompt_tokens=spec.prompt_tokens))

    def _done(self, job: Job) -> None:
        self.in_flight -= 1
        lane = job.inst.lane
        if self.replay.note_done(lane, self.env.now):
            self.on_window_open()
        cursor = self.cursors[lane]
        for spec in cursor.complete(job.spec.rid):
            self._later(cursor, spec)
        if cursor.done:
            cursor = self.cursors[lane] = SessionCursor(self.replay.next(lane))
            for spec in cursor.start():
                self._later(cursor, spec)
