"""A run's progress on the console: the warm-up, then the measurement window.

The warm-up counts what ends it: lanes that have finished their warm-up requests (closed
loop) or simulated seconds of `warmup_s` (open loop). The window's bar (window then drain, in
simulated seconds) starts its clock when the window opens, so its remaining time is not
skewed by a warm-up that took minutes of wall time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rackSim.workload.replay import ClosedLoopReplay, OpenLoopPhases


class RunProgress:
    """Progress bars of one run, updated with the simulated time (s) between chunks.

    The second bar covers `window_s` then `drain_s`, named after the one under way."""

    def __init__(self, phases: ClosedLoopReplay | OpenLoopPhases, window_s: float,
                 drain_s: float):
        self._phases, self._window_s, self._total_s = phases, window_s, window_s + drain_s
        self._bar = None
        self._in_window = False

    def update(self, now_s: float) -> None:
        ws = self._phases.window_start_s
        if ws is None or now_s < ws:
            done, total, unit = self._phases.warmup_progress(now_s)
            if self._bar is None:
                self._bar = _bar("warm-up", total, unit)
            self._bar.update(done - self._bar.n)
            return
        if not self._in_window:
            if self._bar is not None:  # the warm-up has ended: its bar ends full
                self._bar.update(self._bar.total - self._bar.n)
                self._bar.close()
            self._bar = _bar("window", self._total_s, "sim s")
            self._in_window = True
        done = min(now_s - ws, self._total_s)
        if done > self._window_s and self._bar.desc != "drain":
            self._bar.set_description_str("drain", refresh=False)
        self._bar.update(done - self._bar.n)

    def close(self, ended: bool) -> None:
        """`ended`: the run reached its end; a drain that ended early (nothing left in
        flight) then shows as complete at the simulated time it took."""
        if self._bar is None:
            return
        if ended and self._in_window and self._bar.n < self._bar.total:
            self._bar.total = self._bar.n
            self._bar.refresh()
        self._bar.close()


def _bar(desc: str, total: float, unit: str):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} " + unit
                           + " [{elapsed}<{remaining}]")
