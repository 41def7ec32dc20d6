"""load_graphs: one entry point from a source name to session graphs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rackSim.workload.agentx import AgentXSpec, generate_agentx
from rackSim.workload.jsonl import save_jsonl
from rackSim.workload.sources import load_graphs

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces"


def test_generators_and_files(tmp_path: Path) -> None:
    graphs = load_graphs("agentx", seed=4, num_sessions=3)
    assert graphs == generate_agentx(AgentXSpec(), 4, 3)
    save_jsonl(graphs, tmp_path / "w.jsonl")
    assert load_graphs("jsonl", path=tmp_path / "w.jsonl") == graphs


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"source": "synthetic"}, "needs a SyntheticSessionsSpec"),
    ({"source": "mooncake"}, "needs a path"),
    ({"source": "parquet", "path": "x"}, "unknown workload source"),
])
def test_errors(kwargs: dict, fragment: str) -> None:
    source = kwargs.pop("source")
    with pytest.raises(ValueError, match=fragment):
        load_graphs(source, **kwargs)


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"public traces not found at {TRACES}")
def test_traces_by_name() -> None:
    mc = load_graphs("mooncake", path=TRACES / "mooncake_synthetic_trace.jsonl", seed=2)
    az = load_graphs("azure", path=TRACES / "azure2023_code.csv")
    assert (len(mc), len(az)) == (3_993, 8_819)
