"""Open-loop replay: timestamped sessions sent at their (sped-up) arrival times.

Shared by the simulator and the validated-mode driver, like the closed-loop lanes in `replay`.
A session's first requests are sent at its arrival; the rest of it (if any) follows its
dependency edges as requests complete (`replay.SessionCursor`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field

from rackSim.workload.graph import SessionGraph, SessionInstance

KEY_SHIFT = 20  # instance i gets key_base (i + 1) << 20: node keys stay below 2**60


class OpenLoopSpec(BaseModel):
    """How a timestamped workload is replayed open loop (the window comes from the run)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

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
        for i in order:
            t = (graphs[i].start_s - offset_s) / speedup
            if t < 0:
                continue
            if window_s is not None and t >= window_s:
                break
            self._sends.append((t, graphs[i]))

    @classmethod
    def from_spec(cls, graphs: Sequence[SessionGraph], spec: OpenLoopSpec,
                  window_s: float | None = None) -> OpenLoopSchedule:
        """The schedule `spec` describes; `window_s` = the run's warm-up + measurement window."""
        return cls(graphs, spec.speedup, spec.offset_s, window_s)

    def __len__(self) -> int:
        return len(self._sends)

    def __iter__(self) -> Iterator[tuple[float, SessionInstance]]:
        for i, (t, g) in enumerate(self._sends):
            yield t, SessionInstance(g, key_base=(i + 1) << KEY_SHIFT)

    @property
    def duration_s(self) -> float:
        """Time of the last send (simulated s), 0 when empty."""
        return self._sends[-1][0] if self._sends else 0.0
