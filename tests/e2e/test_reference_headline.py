"""The headline fit's scenario: it composes, it says what it is, and it reproduces the figures
its record states (docs/reference_scenario.md)."""

from __future__ import annotations

import pytest
import yaml

from rackSim.calibrate.fidelity import fitted_headline_scenario
from rackSim.calibrate.headline import read_headline
from rackSim.calibrate.headline_fit import RECORD, WORKLOAD_YAML
from rackSim.calibrate.workload_fit import TARGET_KEYS, FitSettings
from rackSim.config import compose_scenario
from rackSim.run import layout_name, simulate

FITTED = ["workload=agentx_fitted", "deployment=agentx_fitted"]


@pytest.fixture(scope="module")
def record() -> dict:
    return yaml.safe_load(RECORD.read_text())


def test_fitted_scenario_is_the_recorded_point(record: dict) -> None:
    cfg = compose_scenario(FITTED)
    best = record["best"]
    assert best["converged"]  # the record and the scenario say so
    assert all(abs(e) <= FitSettings().tolerance for e in best["errors"].values())
    assert "FITTED to H1-H3" in WORKLOAD_YAML.read_text()
    assert layout_name(cfg.deployment) == best["layout"]
    assert cfg.deployment.router == "session_affinity"
    # the record keeps 5 significant digits (9794.5), the scenario the whole clients
    assert abs(cfg.workload.replay.concurrency - best["params"]["concurrency"]) <= 1
    agentx = cfg.workload.agentx
    assert agentx.output_tokens.median == pytest.approx(best["params"]["output_tokens_median"],
                                                        rel=1e-4)
    assert agentx.resent_output_share == pytest.approx(best["params"]["resent_output_share"],
                                                       rel=1e-4)
    assert 34 <= cfg.deployment.num_gpus <= 64  # H4
    # any window of it drains as the fit's did: the output of its requests in flight counts
    assert cfg.workload.replay.drain_s == record["settings"]["drain_s"]
    # the reference (no overrides) stays the assumed scenario
    assert compose_scenario([]).workload.name == "agentx"


@pytest.mark.slow
def test_fitted_scenario_reproduces_its_record(record: dict) -> None:
    """Simulated as the fit evaluated it (the record's window, warm-up, drain and seed), the
    written scenario gives the recorded H1-H3 up to the rounding of its values (5 significant
    digits): 3 %."""
    summary = simulate(fitted_headline_scenario(record, [])).summary
    h = read_headline()
    published = {"H1": h.throughput_tok_s_gpu, "H2": h.interactivity_tok_s_user,
                 "H3": h.revenue_usd_gpu_h}
    for fid, key in TARGET_KEYS.items():
        recorded = published[fid] * (1 + record["best"]["errors"][fid])
        assert summary[key] == pytest.approx(recorded, rel=0.03), fid
