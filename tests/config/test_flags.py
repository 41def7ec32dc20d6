"""The number flags' argparse types: what they accept and the one line they refuse with."""

from __future__ import annotations

import argparse

import pytest

from rackSim.config.flags import above, whole_numbers_above


@pytest.mark.parametrize("kind, low, equal, text, want", [
    (int, 0, False, "3", 3), (float, 0, True, "0", 0.0), (float, 0, False, "1e-3", 1e-3),
])
def test_accepted(kind, low, equal, text, want):
    assert above(kind, low, equal)(text) == want


@pytest.mark.parametrize("kind, low, equal, text, message", [
    (int, 0, False, "0", "0 must be above 0"),
    (float, 0, True, "-1", "-1 must be at least 0"),
    (int, 0, False, "2.5", "'2.5' is not a whole number"),
    (float, 0, False, "x", "'x' is not a number"),
    (float, 0, False, "nan", "nan must be above 0"),
    (float, 0, True, "inf", "inf must be at least 0"),
])
def test_refused(kind, low, equal, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{message}$"):
        above(kind, low, equal)(text)


def test_whole_numbers_above():
    assert whole_numbers_above(0)("4, 8,16") == [4, 8, 16]
    assert whole_numbers_above(0, equal=True)("0,4096") == [0, 4096]
    for text, message in (("4,,8", "an empty item"), ("4,-8", "-8 must be above 0"),
                          ("", "an empty item")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            whole_numbers_above(0)(text)
