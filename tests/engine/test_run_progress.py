"""A run's progress bars: the warm-up counts what ends it; the window, then the drain, start at 0
when the window opens."""

from __future__ import annotations

import re

from rackSim.config import compose_scenario
from rackSim.engine.progress import RunProgress
from rackSim.engine.simulation import Simulation
from rackSim.workload.replay import OpenLoopPhases
from rackSim.workload.sources import load_sessions


def _lines(err: str) -> list[tuple[str, float, float, str]]:
    """(bar, done, total, unit) of every refresh tqdm wrote."""
    return [(m[1], float(m[2]), float(m[3]), m[4]) for m in
            re.finditer(r"(warm-up|window|drain):.*?\| (-?[\d.]+)/([\d.]+) (sim s|lanes)", err)]


def test_an_open_loop_warm_up_counts_its_seconds_and_the_window_starts_at_zero(
        smoke_cfg, capsys):
    """Open loop: the window opens at warmup_s, fixed from the start; before it the window's
    bar once went negative (-20/900) with tqdm's clamping warning."""
    replay = compose_scenario(["experiment=smoke", "workload=mooncake_conversation",
                               "workload.replay.warmup_s=60"]).workload.replay
    phases = OpenLoopPhases(replay)
    bar = RunProgress(phases, 600.0, 300.0)
    for now in (0.0, 20.0, 40.0, 60.0, 65.0, 600.0, 700.0, 960.0, 1000.0):
        bar.update(now)
    bar.close(ended=True)
    err = capsys.readouterr().err
    assert "clamping" not in err
    seen = _lines(err)
    warm = [x for x in seen if x[0] == "warm-up"]
    window = [x for x in seen if x[0] == "window"]
    drain = [x for x in seen if x[0] == "drain"]
    assert warm and window and drain
    assert seen.index(warm[-1]) < seen.index(window[0]) and seen.index(window[-1]) < seen.index(
        drain[0])
    assert all(x[2:] == (60.0, "sim s") and 0 <= x[1] <= 60 for x in warm)
    assert warm[-1][1] == 60.0  # the warm-up's bar ends full
    assert all(x[2:] == (900.0, "sim s") and 0 <= x[1] <= 600 for x in window)
    assert window[0][1] == 0.0
    assert all(x[2:] == (900.0, "sim s") and 600 < x[1] <= 900 for x in drain)
    assert drain[-1][1] == 900.0  # capped at window + drain


def test_a_drain_that_ends_early_shows_complete_and_an_interrupted_one_does_not(capsys):
    """The run ends when nothing is left in flight after the window: the bar then reads the
    simulated time it took as complete. An interrupted (or failed) run keeps what it reached."""
    phases = OpenLoopPhases(compose_scenario(["experiment=smoke", "workload=mooncake_conversation",
                                              "workload.replay.warmup_s=0"]).workload.replay)
    for ended, final in ((True, (650.0, 650.0)), (False, (650.0, 900.0))):
        bar = RunProgress(phases, 600.0, 300.0)
        bar.update(650.0)
        bar.close(ended)
        assert _lines(capsys.readouterr().err)[-1] == ("drain", *final, "sim s")


def test_a_closed_loop_run_counts_its_warm_lanes_then_the_window(smoke_cfg, capsys):
    """A real run of the smoke scenario (48 lanes, one warm-up request each): the warm-up,
    the window to its end, then its drain, which ends early (nothing left in flight) and
    reads complete."""
    sessions = load_sessions(smoke_cfg.workload, smoke_cfg.seed)
    out = Simulation(smoke_cfg, sessions).run(progress=True)
    assert not out.partial
    seen = _lines(capsys.readouterr().err)
    warm = [x for x in seen if x[0] == "warm-up"]
    window = [x for x in seen if x[0] == "window"]
    lanes = smoke_cfg.workload.replay.concurrency
    assert warm[0] == ("warm-up", 0.0, lanes, "lanes") and warm[-1][1] == lanes
    assert [x[1] for x in warm] == sorted(x[1] for x in warm)
    assert seen.index(warm[-1]) < seen.index(window[0]) and window[0][1] == 0.0
    replay = smoke_cfg.workload.replay
    scale = replay.window_s + replay.drain_s  # one scale: the window, then the drain
    assert all(x[2] == scale and x[1] <= replay.window_s for x in window)
    bar, done, total, _ = seen[-1]
    assert bar == "drain" and done == total and replay.window_s < done < (replay.window_s
                                                                         + replay.drain_s)


def test_a_run_without_warm_up_shows_the_window_only(capsys):
    """No warm-up requests and no primer: the window opens at 0 and no warm-up bar shows
    (the window's bar, then the drain's)."""
    cfg = compose_scenario(["experiment=smoke", "workload.replay.warmup_requests_per_lane=0",
                            "workload.replay.primer=false", "workload.replay.window_s=10"])
    Simulation(cfg, load_sessions(cfg.workload, cfg.seed)).run(progress=True)
    seen = _lines(capsys.readouterr().err)
    assert seen[0][:2] == ("window", 0.0) and {x[0] for x in seen} == {"window", "drain"}
    assert seen[-1][0] == "drain" and 10.0 < seen[-1][1] == seen[-1][2]
