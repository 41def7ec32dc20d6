"""Argparse types for the commands' number flags: a bad value ends in argparse's one-line
usage error naming the flag (exit 2), before anything runs."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def above(kind: type, low: float, equal: bool = False) -> Callable[[str], float]:
    """A finite `kind` number above `low` (at least `low`, with `equal`)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            number = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {number}") from None
        if not math.isfinite(value) or value < low or (value == low and not equal):
            raise argparse.ArgumentTypeError(
                f"{text} must be {'at least' if equal else 'above'} {low:g}")
        return value
    return parse


def whole_numbers_above(low: int, equal: bool = False) -> Callable[[str], list[int]]:
    """A comma-separated list of whole numbers, each above `low` (at least `low`, with
    `equal`), e.g. DEP widths `4,8,16`."""
    one = above(int, low, equal)

    def parse(text: str) -> list[int]:
        items = [t.strip() for t in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"{text!r}: an empty item; give e.g. 4,8,16")
        return [one(t) for t in items]
    return parse


positive_int = above(int, 0)
"""A whole number above 0 (counts of things that must exist: lanes, tokens, GiB)."""
count = above(int, 0, equal=True)
"""A whole number at least 0 (retries, tolerated errors, byte offsets)."""
positive_float = above(float, 0)
"""A finite number above 0 (durations, windows, timeouts)."""
nonnegative_float = above(float, 0, equal=True)
"""A finite number at least 0 (a duration that may be none)."""
