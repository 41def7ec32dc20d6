"""The README's tables say what is there: every scenario option of `scenarios/`, every package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_scenario_option_is_in_the_readme_and_nothing_else():
    """The table listed 1 of 4 models, 2 of 5 GPUs and 2 of 7 deployments, and no plan group."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| group | options |"):]
    table = table[:table.index("\n\n")]
    rows = {}
    for line in table.splitlines():
        m = re.match(r"\| `(\w+)/` \| (.*) \|$", line)
        if m:
            rows[m[1]] = set(re.findall(r"`([a-z0-9_]+)`", m[2]))
    groups = {d.name: {f.stem for f in d.glob("*.yaml")}
              for d in (ROOT / "scenarios").iterdir() if d.is_dir()}
    assert rows == groups


def test_the_readme_layout_names_every_package_and_top_level_directory():
    """The layout table had no row for rackSim/plan/, scenarios/, notebooks/ or hydra_plugins/."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| path | owns |"):]
    listed = set(re.findall(r"^\| `([\w/]+)/` \|", table[:table.index("\n\n")], re.M))
    packages = {f"rackSim/{d.name}" for d in (ROOT / "rackSim").iterdir()
                if (d / "__init__.py").is_file()}
    assert packages <= listed
    assert {"scenarios", "calibration", "benchmarks", "docs", "notebooks",
            "hydra_plugins"} <= listed
