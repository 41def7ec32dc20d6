"""`notebooks/dep_widths.ipynb` runs top to bottom with nbclient (small scenarios) and is
committed without outputs."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbclient import NotebookClient

from rackSim.config.scenarios import SCENARIOS_DIR

ROOT = SCENARIOS_DIR.parent
NOTEBOOK = ROOT / "notebooks" / "dep_widths.ipynb"


def test_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    prose = [c for c in nb.cells if c.cell_type == "markdown"]
    assert len(prose) >= 6  # a paragraph before each figure


@pytest.mark.parametrize("model,hardware,widths,prefill_gpus,sim_widths", [
    (None, None, [4, 8, 16, 32, 64], 2, [4, 8, 16]),           # the reference pair
    # a generated model, another GPU
    ("qwen3_235b_a22b", "gb200_nvl72", [4, 8, 16, 32, 64], 2, [4, 8, 16]),
    # 671B in FP8 needs 8 GB200 GPUs per instance: DEP4 is left out, prefill is 8 wide (it
    # ended in a ConfigError on DEP4)
    ("deepseek_v3", "gb200_nvl72", [8, 16, 32, 64], 8, [8, 16]),
    # an 8-GPU HGX node holds a DEP4 decode instance beside one 4-GPU prefill instance (it
    # ended in a ConfigError: the smoke layout's two prefill instances); DEP8 fills the node,
    # so it is priced (its neighbour in a second NVLink domain) but not simulated
    ("qwen3_235b_a22b", "h200_hgx", [4, 8], 4, [4])])
def test_runs_top_to_bottom(monkeypatch, model, hardware, widths, prefill_gpus, sim_widths):
    """Any MoE model and GPU with a calibration profile, without code changes."""
    monkeypatch.setenv("RACKSIM_NOTEBOOK_SMALL", "1")
    if model is not None:
        monkeypatch.setenv("RACKSIM_NOTEBOOK_MODEL", model)
        monkeypatch.setenv("RACKSIM_NOTEBOOK_HARDWARE", hardware)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    # breakdown, stragglers, EPLB, all-reduce, throughput/interactivity, TTFT by stage
    assert len(figures) == 6
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("CHECKS ")]
    checks = json.loads(line.removeprefix("CHECKS "))
    assert checks["recursive_doubling_sync_le_ring"] is True
    assert checks["eplb_on_step_le_off"] is True
    assert checks["max_delay_grows_with_ranks"] is True
    assert checks["lagged_rank_adds_delay"] is True
    assert checks["widths"] == widths and checks["prefill_gpus"] == prefill_gpus
    assert checks["sim_widths"] == sim_widths and checks["simulations"] == 2 * len(sim_widths)
    assert 1 <= checks["pareto_points"] <= 6
    assert checks["ttft_stages_known"] is True
