"""Argparse types for the commands' number and output-path flags: a bad value ends in
argparse's one-line usage error naming the flag (exit 2), before anything runs."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path


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


def unwritable(path: Path, kind: str) -> str | None:
    """Why `path` cannot be written as a `kind` ("directory" or "file"), or None. Missing
    directories on its way are no reason: the commands make them. Checked before a command
    starts, so a run does not end in an OSError traceback after its work."""
    if path.exists():
        if kind == "directory" and not path.is_dir():
            return f"{path} exists and is not a directory; give a directory"
        if kind == "file" and path.is_dir():
            return f"{path} is a directory; give a file's path"
    home = path if kind == "directory" else path.parent
    home = home.absolute()
    while not home.exists():
        home = home.parent
    if not home.is_dir():
        return f"{home} is a file, so {path} cannot be made; give another path"
    if not os.access(home, os.W_OK | os.X_OK):
        return f"{home} is not writable; give a path you can write"
    return None


def _output(kind: str) -> Callable[[str], Path]:
    def parse(text: str) -> Path:
        path = Path(text)
        reason = unwritable(path, kind)
        if reason is not None:
            raise argparse.ArgumentTypeError(reason)
        return path
    return parse


output_dir = _output("directory")
"""A directory to write into: an existing one, or one that can be made."""
output_file = _output("file")
"""A file to write: its directory exists or can be made, and it is not a directory."""
