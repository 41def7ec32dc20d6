"""The terminal summary: a run that ended with requests still in flight says so."""

from __future__ import annotations

import pytest

from rackSim.config import compose_scenario
from rackSim.report.table import format_summary
from rackSim.run import simulate

NOTE = "still in flight at the end, so none of their output counts"


@pytest.mark.parametrize(("summary", "shown"), [
    ({"requests_in_flight": 1234}, "NOTE: 1,234 requests sent in the window"),
    ({"requests_in_flight": 0}, None),
    ({"requests_in_flight": 7, "partial": True}, None),  # PARTIAL says it instead
])
def test_requests_left_in_flight_are_named(summary: dict, shown: str | None) -> None:
    text = format_summary(summary)
    if shown is None:
        assert NOTE not in text
    else:
        assert shown in text and NOTE in text and "workload.replay.drain_s" in text
    assert ("PARTIAL" in text) == bool(summary.get("partial"))


@pytest.mark.parametrize(("drain_s", "noted"), [(0.0, True), (60.0, False)])
def test_a_run_without_a_drain_says_what_it_left_out(drain_s: float, noted: bool) -> None:
    """The smoke scenario over 10 s: without a drain some requests are still decoding at
    the stop; with the workload's drain every one finishes."""
    cfg = compose_scenario(["experiment=smoke", "workload.replay.window_s=10",
                            f"workload.replay.drain_s={drain_s}", "progress=false"])
    summary = simulate(cfg, progress=False).summary
    assert (summary["requests_in_flight"] > 0) == noted
    assert (NOTE in format_summary(summary)) == noted
