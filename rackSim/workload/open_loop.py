"""Open-loop replay: timestamped sessions sent at their (sped-up) arrival times.

Shared by the simulator and the validated-mode driver, like the closed-loop lanes in `replay`.
A session's first requests are sent at its arrival; the rest of it (if any) follows its
dependency edges as requests complete (`replay.SessionCursor`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field

from rackSim.config.errors import ScenarioError
from rackSim.workload.graph import SessionGraph, SessionInstance

KEY_SHIFT = 20  # instance i gets key_base (i + 1) << 20: node keys stay below 2**60


class OpenLoopSpec(BaseModel):
    """How a timestamped workload is replayed open loop (the window comes from the run)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    speedup: float = Field(default=1.0, gt=0, description="trace seconds per simulated second")
    offset_s: float = Field(default=0.0, ge=0, description="skip this much of the trace (trace s)")
    jitter_s: float | None = Field(default=None, ge=0, description=(
        "Mooncake: uniform arrival jitter (s); None = 3 s if timestamps are quantised, else 0"))


class OpenLoopSchedule:
    """(send time in simulated s, SessionInstance) pairs in time order.

    send = (start_s - offset_s) / speedup, kept when 0 <= send < window_s. Every graph needs
    `start_s`. Instances are built lazily, so millions of arrivals cost little until sent.
    """

    def __init__(self, graphs: Sequence[SessionGraph], speedup: float = 1.0,
                 offset_s: float = 0.0, window_s: float | None = None):
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        missing = next((g.session_id for g in graphs if g.start_s is None), None)
        if missing is not None:
            raise ValueError(f"session '{missing}' has no start_s: open-loop replay needs "
                             "timestamped sessions (use closed-loop lanes instead)")
        order = sorted(range(len(graphs)), key=lambda i: graphs[i].start_s)
        self._sends: list[tuple[float, SessionGraph]] = []
        self.window_s = window_s
        #: the first send at or after `window_s` (simulated s), None when there is none
        self.next_send_s: float | None = None
        for i in order:
            t = (graphs[i].start_s - offset_s) / speedup
            if t < 0:
                continue
            if window_s is not None and t >= window_s:
                self.next_send_s = t
                break
            self._sends.append((t, graphs[i]))

    @classmethod
    def from_spec(cls, graphs: Sequence[SessionGraph], spec: OpenLoopSpec,
                  window_s: float | None = None) -> OpenLoopSchedule:
        """The schedule `spec` describes; `window_s` = the run's warm-up + measurement window."""
        return cls(graphs, spec.speedup, spec.offset_s, window_s)

    def __len__(self) -> int:
        return len(self._sends)

    def require_arrival_after(self, start_s: float) -> None:
        """Refuse a measurement window, from `start_s` to the schedule's `window_s` (simulated
        s), in which no request arrives: the run would report zeros, not a measurement (a
        trace can be silent for minutes: the Azure code trace sends nothing from 39 to 183 s).
        """
        first = bisect_left(self._sends, start_s, key=lambda send: send[0])
        if first < len(self._sends):
            return
        end = self.window_s if self.window_s is not None else start_s
        near = [f"the last arrival before it is at {self._sends[-1][0]:.1f} s"
                if self._sends else "",
                f"the next after it at {self.next_send_s:.1f} s"
                if self.next_send_s is not None else "no arrival after it"]
        raise ScenarioError(
            f"workload.replay.window_s={end - start_s:g}: no request of the trace arrives in the "
            f"measurement window ({start_s:g}-{end:g} s of the replay, after the "
            f"{start_s:g}-s warm-up; {', '.join(filter(None, near))}); widen the window, or "
            "move it with workload.open_loop.offset_s (trace seconds skipped) or "
            "workload.open_loop.speedup")

    def __iter__(self) -> Iterator[tuple[float, SessionInstance]]:
        for i, (t, g) in enumerate(self._sends):
            yield t, SessionInstance(g, key_base=(i + 1) << KEY_SHIFT)

    @property
    def duration_s(self) -> float:
        """Time of the last send (simulated s), 0 when empty."""
        return self._sends[-1][0] if self._sends else 0.0
