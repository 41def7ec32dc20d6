"""Waking a process at an absolute simulated time, exactly.

A decode instance that runs several steps without yielding (nothing else can happen before
they end, see engine/decode.py) must resume at the end of its last step to the bit: the time
the step would have ended at had every step been its own timeout, `start + duration` summed
step by step. `env.timeout(t - env.now)` would land on `now + (t - now)`, which can differ
from `t` in the last bit, so the event goes into SimPy's queue at `t` itself, in the order a
timeout scheduled now would take (normal priority, the next event number).
"""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.core import NORMAL


def wake_at(env: simpy.Environment, t: float) -> simpy.Event:
    """An event that fires at simulated time `t` (s, not before `env.now`)."""
    if t < env.now:
        raise ValueError(f"wake_at({t}) is before now ({env.now})")
    ev = simpy.Event(env)
    ev._ok, ev._value = True, None  # triggered, like a Timeout
    heappush(env._queue, (t, NORMAL, next(env._eid), ev))
    return ev
