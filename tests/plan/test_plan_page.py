"""The plan page in real headless Chromium (Debian's package, installed by `ensure_chromium`
when missing): it loads, shows the plan and families tables and every figure, and logs no
error. A broken page is caught by the same probe (the check can fail)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from headless_chromium import ensure_chromium, load_page

from rackSim.plan.command import run_plan, write_plan

PROBE = """(() => ({
  title: document.title,
  planRows: document.querySelectorAll('#plans tbody tr').length,
  planHeaders: Array.from(document.querySelectorAll('#plans thead th')).map(t => t.textContent),
  familyRows: document.querySelectorAll('#families tbody tr').length,
  images: Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight,
                                                i.getBoundingClientRect().width]),
  external: Array.from(document.querySelectorAll('[src]')).map(e => e.getAttribute('src'))
    .filter(s => !s.startsWith('data:')).length,
}))()"""


@pytest.fixture(scope="module", autouse=True)
def chromium() -> str:
    return ensure_chromium()


@pytest.fixture(scope="module")
def plan_page(small_inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    screen_only = small_inputs.plan.model_copy(update={
        "confirm": small_inputs.plan.confirm.model_copy(update={"top_k": 0})})
    result = run_plan(replace(small_inputs, plan=screen_only), out)
    return write_plan(result, small_inputs, out), result


def test_page_renders_tables_and_figures_without_errors(plan_page, tmp_path):
    page, result = plan_page
    got = load_page(page, PROBE, tmp_path / "profile")
    assert got.errors == []
    p = got.probe
    assert p["title"] == "Capacity plan: agentx_reference"
    assert p["planRows"] == len(result.plans) == 3
    assert "P90 tok/s/user (screen)" in p["planHeaders"] and "cost $/Mtok" in p["planHeaders"]
    assert p["familyRows"] == len(result.families) >= 2
    assert len(p["images"]) == 1  # the Pareto figure (no simulation: no error figure)
    for complete, width, height, shown in p["images"]:
        assert complete and width > 300 and height > 200 and shown > 300
    assert p["external"] == 0


def test_the_probe_catches_a_broken_page(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><head><title>bad</title></head><body>"
                   "<table id='plans'><thead><tr><th>x</th></tr></thead><tbody></tbody></table>"
                   "<img src='data:image/png;base64,bm90IGEgcG5n'>"
                   "<script>console.error('boom'); undefined_function();</script>"
                   "</body></html>")
    got = load_page(bad, PROBE, tmp_path / "profile")
    assert any("boom" in e for e in got.errors)
    assert any("undefined_function" in e for e in got.errors)
    assert got.probe["planRows"] == 0
    assert got.probe["images"][0][1] == 0  # the broken image has no pixels
