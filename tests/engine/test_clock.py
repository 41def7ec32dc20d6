"""wake_at: an event at an absolute simulated time, to the bit."""

from __future__ import annotations

import pytest
import simpy

from rackSim.engine.clock import wake_at


def test_wakes_at_the_time_itself_where_a_timeout_would_round():
    env = simpy.Environment()
    now = 0.00016968563750245435
    env.run(until=now)
    t = 0.0007509037469304998  # a time whose difference from now does not add back to it
    assert env.now + (t - env.now) != t
    seen = []
    wake_at(env, t).callbacks.append(lambda _e: seen.append(env.now))
    env.run()
    assert seen == [t]


def test_orders_like_a_timeout_scheduled_at_the_same_moment():
    env = simpy.Environment()
    order = []
    env.timeout(1.0).callbacks.append(lambda _e: order.append("earlier timeout"))
    wake_at(env, 1.0).callbacks.append(lambda _e: order.append("wake"))
    env.timeout(1.0).callbacks.append(lambda _e: order.append("later timeout"))
    env.run()
    assert order == ["earlier timeout", "wake", "later timeout"]


def test_refuses_a_time_in_the_past():
    env = simpy.Environment()
    env.run(until=2.0)
    with pytest.raises(ValueError, match="before now"):
        wake_at(env, 1.0)
