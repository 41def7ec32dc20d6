"""Speculative-decoding emission arithmetic (hand-calculated)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rackSim.engine.decode import decode_steps, emitted_after


@pytest.mark.parametrize("n, a, steps", [
    (1, 3.25, 1),      # the first step emits the first token
    (2, 3.25, 2),
    (5, 3.25, 3),      # 1 + 3.25 = 4.25 < 5 -> one more step
    (14, 3.25, 5),     # 1 + 4 x 3.25 = 14 exactly
    (15, 3.25, 6),
    (300, 1.0, 300),   # no speculation: one token per step
    (300, 4.0, 76),    # 1 + ceil(299 / 4)
])
def test_decode_steps(n, a, steps):
    assert decode_steps(n, a) == steps


def test_integer_emission_schedule_averages_acceptance():
    # 3.25 tokens per step -> steps emit 3, 3, 3, 4 in turn (whole tokens).
    per_step = [emitted_after(k, 3.25) - emitted_after(k - 1, 3.25) for k in range(1, 9)]
    assert per_step == [3, 3, 3, 4, 3, 3, 3, 4]


@given(n=st.integers(1, 5000), a=st.floats(1.0, 4.0))
def test_last_step_remainder_in_range(n, a):
    s = decode_steps(n, a)
    if s > 1:
        last = n - 1 - a * (s - 2)
        assert 0 < last <= a + 1e-9
        assert emitted_after(s - 1, a) >= n - 1  # the whole-token schedule also finishes
