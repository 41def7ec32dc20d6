"""The headline workload fit: MAP least squares with a simulator in the loop (here a cheap
analytic stand-in), convergence reporting, leave-one-out and the files it writes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from rackSim.calibrate import headline_fit
from rackSim.calibrate.headline import Layout, read_headline
from rackSim.calibrate.headline_fit import (
    parse_layouts,
    run_fit,
    whatif_layout,
    write_deployment,
    write_workload,
)
from rackSim.calibrate.scenario import SCENARIOS
from rackSim.calibrate.workload_fit import (
    FREE_PARAMETERS,
    Evaluator,
    FitSettings,
    WorkloadFit,
    scenario_changes,
    starting_points,
)
from rackSim.workload.agentx import AgentXSpec


def toy_simulate(_base: list[str], p: dict[str, float], layout: Layout,
                 _s: FitSettings) -> dict[str, float]:
    """A smooth stand-in for the simulator: clients raise throughput and deepen the decode
    batch (slower per user); more new tokens per output token shift the mix to uncached."""
    width = 16.0 / layout.decode_gpus
    thr = 954_000 * (p["concurrency"] / 3000) ** 0.6 * (p["turns_median"] / 25) ** 0.2
    inter = 196 * (3000 / p["concurrency"]) ** 0.5 * width ** 0.3
    rev = 38.96 * thr / 954_000 * (p["new_tokens_median"] / 600) ** 0.4 \
        * (p["output_tokens_median"] / 300) ** 0.1
    return {"throughput_tok_s_gpu": thr, "interactivity_tok_s": inter, "revenue_usd_gpu_h": rev}


def _evaluator(**kw: object) -> Evaluator:
    return Evaluator([], FitSettings(jobs=1, **kw), simulate=toy_simulate)


def test_fit_reaches_all_three_targets() -> None:
    h = read_headline()
    ev = _evaluator()
    fit = WorkloadFit(h, ev).fit(Layout(16, 2, 16), {p.name: p.prior for p in FREE_PARAMETERS})
    assert fit.converged
    assert all(abs(e) < 0.05 for e in fit.errors.values()), fit.errors
    # the priors hold what the targets leave free: tool delay does not enter the toy at all
    assert fit.params["tool_delay_s_median"] == pytest.approx(1.5, rel=0.02)
    assert ev.simulations > 5


def test_points_at_a_limit_stay_inside_the_range() -> None:
    """The surrogate step's bounds end 1e-12 past a limit; the scenario must not see it."""
    fit = WorkloadFit(read_headline(), _evaluator())
    x = [math.log(p.high) + 1e-12 for p in fit.free]
    params = fit._params(x)
    assert all(params[p.name] == p.high for p in fit.free)
    base = {"workload": {"agentx": AgentXSpec().model_dump(mode="json")}}
    agentx = scenario_changes(params, Layout(16, 2, 16), base, FitSettings())["workload"]["agentx"]
    AgentXSpec.model_validate(agentx)  # 1.000000000001 re-sent would fail here
    assert agentx["resent_output_share"] == 1.0


def test_cache_avoids_resimulating(tmp_path: Path) -> None:
    cache = tmp_path / "points.jsonl"
    ev = Evaluator([], FitSettings(jobs=1), cache, simulate=toy_simulate)
    pt = ({p.name: p.prior for p in FREE_PARAMETERS}, Layout(16, 2, 16))
    first = ev([pt, pt])
    assert ev.simulations == 1
    again = Evaluator([], FitSettings(jobs=1), cache, simulate=toy_simulate)
    assert again([pt]) == first[:1] and again.simulations == 0


def test_a_fit_that_cannot_reach_the_targets_is_not_converged() -> None:
    h = read_headline()
    # concurrency pinned far from what H2 needs: the targets cannot all be met
    fit = WorkloadFit(h, _evaluator(), fixed={"concurrency": 60.0}).fit(
        Layout(16, 2, 16), {})
    assert not fit.converged
    assert max(abs(e) for e in fit.errors.values()) > 0.10


def test_run_fit_adds_alternatives_whatif_and_loo() -> None:
    h = read_headline()
    ev = _evaluator()
    rec = run_fit(h, [Layout(16, 2, 16), Layout(16, 2, 32)], ev, lambda n: 90.0,
                  lambda s: None)
    best = rec["best"]
    assert best.converged and best.whatif["layout"] == "P16xDEP2+DEP32"
    assert len(rec["alternatives"]) == sum(len(v) for v in headline_fit.ALTERNATIVE_HOLDS.values())
    assert set(rec["loo"]) == {"H1", "H2", "H3"}
    # leaving H2 out, the toy's concurrency is pulled only by H1 and the prior: the
    # left-out prediction is what the other targets imply, not the published value
    assert all(math.isfinite(v["predicted"]) for v in rec["loo"].values())


def test_starting_points_span_the_mix_and_fill_the_decode() -> None:
    h = read_headline()
    starts = starting_points(h, Layout(16, 2, 16), 90.0)
    assert len(starts) == 16
    assert {s["new_tokens_median"] for s in starts} == {900.0, 90.0}
    assert {s["turns_median"] for s in starts} == {25.0, 100.0}
    # Little's law: more clients than decode slots (they also wait on tools)
    assert all(s["concurrency"] > 90 * 16 for s in starts)
    best = WorkloadFit(h, _evaluator()).best_start(Layout(16, 2, 16), starts)
    assert best in starts


def test_scenario_changes_put_medians_into_their_dists() -> None:
    base = {"workload": {"agentx": AgentXSpec().model_dump(mode="json")}}
    ch = scenario_changes({"new_tokens_median": 321.0, "concurrency": 1234.4},
                          Layout(12, 2, 16), base,
                          FitSettings(window_s=30, warmup_requests_per_lane=2, drain_s=9.0))
    nt = ch["workload"]["agentx"]["new_tokens"]
    assert nt["median"] == 321.0 and nt["sigma"] == AgentXSpec().new_tokens.sigma
    replay = ch["workload"]["replay"]
    assert replay["concurrency"] == 1234
    assert (replay["window_s"], replay["warmup_requests_per_lane"], replay["drain_s"]) == (
        30, 2, 9.0)
    assert ch["deployment"]["prefill"]["instances"] == 12
    assert ch["deployment"]["decode"]["gpus"] == 16


def test_layouts_are_checked_against_h4() -> None:
    h = read_headline()
    assert parse_layouts("16:12,32:16", h) == [Layout(12, 2, 16), Layout(16, 2, 32)]
    with pytest.raises(ValueError, match="outside H4"):
        parse_layouts("32:20", h)
    with pytest.raises(ValueError, match="DECODE_GPUS:PREFILL_INSTANCES"):
        parse_layouts("dep16", h)
    assert whatif_layout(Layout(12, 2, 16)) == Layout(12, 2, 32)


def test_written_scenarios_validate(tmp_path: Path) -> None:
    h = read_headline()
    fit = WorkloadFit(h, _evaluator()).fit(Layout(12, 2, 16), {})
    wl, dep = tmp_path / "w.yaml", tmp_path / "d.yaml"
    write_workload(fit, AgentXSpec().model_dump(mode="json"), wl, "2026-12-01")
    write_deployment(fit, SCENARIOS / "deployment" / "agentx_p8_dep32.yaml", dep, "2026-12-01")
    w = yaml.safe_load(wl.read_text())
    spec = AgentXSpec.model_validate(w["agentx"])
    assert spec.output_tokens.median == pytest.approx(fit.params["output_tokens_median"],
                                                      rel=1e-4)
    assert w["replay"]["concurrency"] == round(fit.params["concurrency"])
    # it drains as the fit did: a short window counts the output of its requests in flight
    assert w["replay"]["drain_s"] == FitSettings().drain_s
    assert wl.read_text().count("FITTED to H1-H3") == 8  # the header and seven values
    assert spec.resent_output_share == pytest.approx(fit.params["resent_output_share"],
                                                     rel=1e-4)
    d = yaml.safe_load(dep.read_text())
    assert d["prefill"]["instances"] == 12 and d["decode"]["gpus"] == 16
    assert d["prefill"]["gpus_per_instance"] == 2 and d["name"] == "d"  # named after its file
    assert d["router"] == headline_fit.ROUTER


def test_command_writes_nothing_when_the_fit_does_not_converge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def never(_b: list[str], p: dict[str, float], lay: Layout, _s: FitSettings
              ) -> dict[str, float]:
        return {"throughput_tok_s_gpu": 1000.0, "interactivity_tok_s": 50.0,
                "revenue_usd_gpu_h": 0.1}

    monkeypatch.setattr(headline_fit, "Evaluator",
                        lambda base, s, cache: Evaluator(base, s, cache, simulate=never))
    for name in ("RECORD", "WORKLOAD_YAML", "DEPLOYMENT_YAML"):
        monkeypatch.setattr(headline_fit, name, tmp_path / f"{name}.yaml")
    rc = headline_fit.main(["--layouts", "16:16", "--max-iterations", "2", "--no-loo",
                            "--no-alternatives", "--cache", str(tmp_path / "c.jsonl")])
    assert rc == headline_fit.EXIT_NOT_CONVERGED
    assert "did not converge" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.yaml"))


def test_command_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert headline_fit.main(["--layouts", "32:30"]) == 2
    assert "outside H4" in capsys.readouterr().err
    for argv, message in ((["--window-s", "0"], "argument --window-s: 0 must be above 0"),
                          (["--refit-iterations", "1"], "--refit-iterations: 1 must be at least 2"),
                          (["--context", "0"], "argument --context: 0 must be above 0"),
                          (["--check-window", "60", "30"],
                           "--check-window: SHORT_S 60 must be below LONG_S 30")):
        with pytest.raises(SystemExit) as ex:  # argparse's usage error, before anything runs
            headline_fit.main(argv)
        assert ex.value.code == 2 and message in capsys.readouterr().err


def test_values_at_the_edge_of_plausibility_are_flagged() -> None:
    h = read_headline()
    fit = WorkloadFit(h, _evaluator()).fit(Layout(16, 2, 16), {})
    assert headline_fit.at_edge(fit) == []
    fit.params["output_tokens_median"] = 51.0  # range 50-1200
    assert headline_fit.at_edge(fit) == ["output_tokens_median=51 (range 50-1200 tokens "
                                         "per request)"]


def test_check_window_compares_two_windows_of_one_scenario() -> None:
    check = headline_fit.check_window(10.0, 20.0, 1, ("experiment=smoke",),
                                      fit=FitSettings(warmup_requests_per_lane=1, drain_s=5.0))
    assert (check["short_warmup_requests_per_lane"], check["short_drain_s"]) == (1, 5.0)
    assert check["short"]["requests_sent"] < check["long"]["requests_sent"]
    for t in ("H1", "H2", "H3"):
        assert check["short_vs_long"][t] == pytest.approx(
            check["short"][t] / check["long"][t] - 1, abs=1e-3)


def test_check_window_needs_a_fit_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(headline_fit, "RECORD", tmp_path / "none.yaml")
    assert headline_fit.main(["--check-window", "60", "3600"]) == 2
    assert "fit first" in capsys.readouterr().err


def test_held_parameters_are_not_fitted_and_say_so(tmp_path: Path) -> None:
    h = read_headline()
    assert headline_fit.parse_holds(["turns_median=60"]) == {"turns_median": 60.0}
    for bad, words in (("turns=3", "not a free parameter"), ("turns_median=x", "not a number"),
                       ("turns_median=500", "outside its plausible range")):
        with pytest.raises(ValueError, match=words):
            headline_fit.parse_holds([bad])
    rec = run_fit(h, [Layout(16, 2, 16)], _evaluator(), lambda n: 90.0, lambda s: None,
                  alternatives=False, loo=False, held={"turns_median": 60.0})
    best = rec["best"]
    assert best.params["turns_median"] == 60.0 and "turns_median" not in best.fitted_names
    wl = tmp_path / "w.yaml"
    write_workload(best, AgentXSpec().model_dump(mode="json"), wl, "2026-12-01")
    line = next(x for x in wl.read_text().splitlines() if x.startswith("  turns:"))
    assert "ASSUMED: held" in line and "median: 60.0" in line


def test_best_point_of_a_fit_that_missed_is_marked(tmp_path: Path) -> None:
    h = read_headline()
    fit = WorkloadFit(h, _evaluator(), fixed={"concurrency": 60.0}).fit(Layout(16, 2, 16), {})
    assert not fit.converged
    wl, dep = tmp_path / "agentx_headline_best.yaml", tmp_path / "d.yaml"
    write_workload(fit, AgentXSpec().model_dump(mode="json"), wl, "2026-12-01")
    write_deployment(fit, SCENARIOS / "deployment" / "agentx_p8_dep32.yaml", dep, "2026-12-01")
    text = wl.read_text() + dep.read_text()
    assert "FITTED" not in text and text.count("NOT CONVERGED") >= 8
    assert yaml.safe_load(wl.read_text())["name"] == "agentx_headline_best"
