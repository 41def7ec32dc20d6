"""Where a run's session graphs come from: the built-in generator or a session-graph file."""

from __future__ import annotations

from rackSim.config.specs import WorkloadSpec
from rackSim.workload.graph import SessionGraph
from rackSim.workload.synthetic import generate_sessions


def load_sessions(spec: WorkloadSpec, seed: int) -> list[SessionGraph]:
    if spec.source == "synthetic":
        return generate_sessions(spec.synthetic, spec.num_sessions, seed)
    from rackSim.workload.jsonl import load_jsonl

    return load_jsonl(spec.path)
