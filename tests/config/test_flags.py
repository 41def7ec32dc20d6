"""The number and output-path flags' argparse types: what they accept and the one line they
refuse with."""

from __future__ import annotations

import argparse
import os

import pytest

from rackSim.config.flags import above, output_dir, output_file, whole_numbers_above


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


def test_output_paths_accepted(tmp_path):
    """An existing directory, or one (or a file) whose missing directories can be made;
    nothing is made while the flag is parsed."""
    assert output_dir(str(tmp_path)) == tmp_path
    assert output_dir(str(tmp_path / "a" / "b")) == tmp_path / "a" / "b"
    assert output_file(str(tmp_path / "a" / "t.csv")) == tmp_path / "a" / "t.csv"
    (tmp_path / "old.csv").write_text("x")
    assert output_file(str(tmp_path / "old.csv")) == tmp_path / "old.csv"  # overwritten
    assert list(tmp_path.iterdir()) == [tmp_path / "old.csv"]


def test_output_paths_refused(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for parse, text, message in (
            (output_dir, blocker, f"{blocker} exists and is not a directory; give a directory"),
            (output_dir, blocker / "sub", f"{blocker} is a file, so {blocker / 'sub'} cannot "
                                          "be made; give another path"),
            (output_file, blocker / "t.csv", f"{blocker} is a file, so"),
            (output_file, tmp_path, f"{tmp_path} is a directory; give a file's path")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{message}"):
            parse(str(text))
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root may write anywhere
    with pytest.raises(argparse.ArgumentTypeError,
                       match=f"^{tmp_path} is not writable; give a path you can write$"):
        output_dir(str(tmp_path / "new"))
    assert list(tmp_path.iterdir()) == [blocker]
