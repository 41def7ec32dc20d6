"""The grid on real servers: fit at one concurrency, predict two others, for the tiny MoE (the
shared test server) and the tiny dense model (its own server). A reduced grid (one seed, 8-s
windows) keeps the suite short; `racksim-validate grid` runs the full one (docs/validate.md
has its table).

Stated tolerances on held-out points, from the iteration-log profile (errors are
(predicted - measured) / measured): throughput and ITL P50 within a factor of 2.5. The
prediction is priced at the fitting run's speed, and this machine's own speed moves between
two runs by up to 1.53x (sixteen replays of one server, max / min of their speed,
docs/validate.md "The machine under the server"; 1.7x on a slow morning); the model's own
error, priced at each run's speed, came out at up to 45 % on steady runs (below): 1.7 x 1.45
= 2.5. A factor of 2, this test's first bound, failed once on a clean-clone CI run (the dense
model at 8 lanes, 2.20) while the same tests passed on a rerun. These points extrapolate
further than test_validate_real_server's (4 -> 8 lanes): on a machine shared with other test
suites the tiny MoE's throughput at 8 lanes came out +58 % (the drift probe flagged the run),
the dense model's at 12 lanes +33 % in the full grid. A factor of 2.5 still catches a broken
fit or a broken replay. Predicted again at each run's own speed, ITL P50 within 50 % (below).
The goal of 10 % / 5 % is reported in the printed table (run with -s), not asserted.
"""

from __future__ import annotations

import json
import math

import pytest

from rackSim.validate.compare import HEADLINE
from rackSim.validate.grid import (
    AT_RUN_SPEED,
    GridSpec,
    format_held_out,
    format_repeatability,
    held_out_table,
    local_runner,
    repeatability,
    replay_cpu_workload,
    run_grid,
)
from rackSim.validate.server import ENGINE_CORE, WORKER, ServerSettings

pytestmark = pytest.mark.slow

SPEC = GridSpec(fit_concurrency=4, concurrencies=(2, 8), seeds=(5,), window_s=8.0,
                sources=("iteration_log",))


def _check(df):
    wide = held_out_table(df)
    print("\n" + format_held_out(wide))
    raw = wide[wide.profile == "iteration_log"]
    assert sorted(raw.concurrency) == [2, 8] and set(HEADLINE) <= set(wide.columns)
    for _, row in raw.iterrows():
        tput, itl = row["throughput_tok_s_gpu"], row["itl_p50_ms"]
        for err in (tput, itl):
            assert not math.isnan(err) and 1 / 2.5 < 1 + err / 100 < 2.5, row.to_dict()
    # again at each run's own speed (its iteration log): the machine's share of the error
    # gone, ITL P50 within 50 % on runs whose server did not drift (worst of 60 points on
    # 20-s windows: 20 %; these are 8 s, and a clean-clone CI on a noisy day measured a steady
    # 8-lane tiny-MoE run at +45 % with its raw error -31 %: 35 %, the first bound, failed).
    # A drifting server changed speed during the run (its probes before and after disagree),
    # which one speed factor per run cannot follow: the dense model's 8-lane run, flagged
    # drifting, came out at +58 % once (raw -46 %); such a run is held to the raw bound above
    # only.
    again = wide[wide.profile == "iteration_log" + AT_RUN_SPEED]
    assert sorted(again.concurrency) == [2, 8]
    steady = again[~again.drifting]
    assert (steady.itl_p50_ms.abs() < 50).all(), steady.itl_p50_ms.tolist()
    speed = df[df.profile.str.endswith(AT_RUN_SPEED)]
    assert speed.speed_decode.between(0.3, 3).all() and speed.speed_prefill.between(0.3, 3).all()
    fit = df[(df.role == "fit") & (df.metric == "throughput_tok_s_gpu")]
    assert set(fit.profile) == {"iteration_log", "iteration_log" + AT_RUN_SPEED}
    assert len(fit) == 2 and fit.drifting.dtype == bool
    # the fitting run is the speed reference: its factors are 1 by construction
    assert fit.speed_decode.to_numpy() == pytest.approx(1.0, abs=1e-9)
    # the fitting point replayed: the same workload on the same server; its throughput
    # within 50 % of the first measurement catches a replay that is not the same
    rep = repeatability(df)
    print(format_repeatability(rep))
    assert len(rep) == 1 and rep[list(HEADLINE)].notna().all().all()
    assert abs(rep.throughput_tok_s_gpu.iloc[0]) < 50


def test_grid_tiny_moe(vllm_server, tmp_path):
    def run(concurrency, seed, out):
        return replay_cpu_workload(vllm_server, concurrency, SPEC.window_s, seed, out)
    _check(run_grid(SPEC, run, tmp_path, "tiny-moe"))
    # each run records the server's own CPU over it, per process: the engine core and the
    # model worker computed for a good part of an 8-s window
    cpu = json.loads((tmp_path / "seed5" / "c8" / "run.json").read_text())["server_cpu_s"]
    def busy(prefix: str) -> float:
        return sum(v["cpu_s"] for name, v in cpu.items() if name.startswith(prefix))
    assert busy(ENGINE_CORE) > 1.0 and busy(WORKER) > 1.0, cpu
    assert all(v["wait_s"] >= 0 for v in cpu.values())


def test_grid_tiny_dense(tmp_path):
    """Its own server, which first serves a short warm-up replay at 8 lanes (not in the grid)."""
    runner, stop = local_runner(ServerSettings(model="tiny-dense"), SPEC.window_s, False,
                                tmp_path / "servers", warmup=(8, 3.0))
    try:
        df = run_grid(SPEC, runner, tmp_path, "tiny-dense")
    finally:
        stop()
    _check(df)
    warm = tmp_path / "servers" / "server-1" / "warmup" / "records.jsonl"
    assert len(warm.read_text().splitlines()) >= 8 and set(df.seed) == {5}
