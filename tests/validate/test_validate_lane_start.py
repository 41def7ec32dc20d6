"""The driver starts a lane as the simulator does: the primer, then the starting turn at once
(not after that turn's tool delay, which the lane has already sat through)."""

from __future__ import annotations

import asyncio

from rackSim.config.specs import ReplaySpec
from rackSim.validate.driver import DriverSettings, ReplayDriver
from rackSim.workload.graph import RequestSpec, SessionGraph


def _session() -> SessionGraph:
    """Turn 1 waits 5 s after turn 0 and generates 1,000 tokens: nominal sends at 0 and 6.02 s,
    the session over at 12.02 s, so the last of four lanes (from 9.02 s) starts at turn 1."""
    return SessionGraph("s", (
        RequestSpec(0, None, 0, 300, 4),
        RequestSpec(1, 0, 304, 50, 1000, after=(0,), delay_s=5.0)))


def test_a_lane_started_mid_session_sends_its_turn_right_after_the_primer(tmp_path):
    replay = ReplaySpec(concurrency=4, primer=True, warmup_requests_per_lane=0, window_s=10.0)
    driver = ReplayDriver([_session()], DriverSettings(endpoints=["http://127.0.0.1:9"],
                                                       replay=replay), tmp_path)
    sent: list[tuple[float, int, bool]] = []

    async def request(client, inst, spec, primer: bool) -> None:  # the server, instant
        sent.append((driver.now(), spec.rid, primer))

    driver._request = request
    driver._completed = lambda *args: None

    async def lane() -> None:
        await driver._lane(None, 3)
        await asyncio.sleep(0.3)  # the spawned sends run

    asyncio.run(lane())
    assert [(rid, primer) for _, rid, primer in sent] == [(0, True), (1, False)]
    assert sent[1][0] - sent[0][0] < 0.2  # not the turn's 5-s delay
