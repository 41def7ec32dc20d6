"""One entry point from a workload source name to session graphs (engine, driver, command)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rackSim.workload.agentx import AgentXSpec, generate_agentx
from rackSim.workload.graph import SessionGraph
from rackSim.workload.jsonl import load_jsonl
from rackSim.workload.traces import load_azure, load_mooncake

if TYPE_CHECKING:
    from rackSim.config.specs import SyntheticSessionsSpec, WorkloadSpec

Source = Literal["synthetic", "agentx", "jsonl", "mooncake", "azure"]


def load_graphs(source: Source, *, seed: int = 0, num_sessions: int | None = None,
                path: str | Path | None = None, agentx: AgentXSpec | None = None,
                synthetic: SyntheticSessionsSpec | None = None,
                jitter_s: float | None = None) -> list[SessionGraph]:
    """Session graphs of a workload.

    synthetic / agentx: generated from their spec (`agentx` None = all defaults) and `seed`;
    `num_sessions` None = the spec's own (agentx) or 393 (synthetic).
    jsonl / mooncake / azure: read from `path`; `seed` and `jitter_s` drive Mooncake's jitter.
    """
    if source == "agentx":
        return generate_agentx(agentx or AgentXSpec(), seed, num_sessions)
    if source == "synthetic":
        if synthetic is None:
            raise ValueError("source 'synthetic' needs a SyntheticSessionsSpec")
        from rackSim.workload.synthetic import generate_sessions
        return generate_sessions(synthetic, num_sessions or 393, seed)
    if path is None:
        raise ValueError(f"source '{source}' needs a path")
    if source == "jsonl":
        return load_jsonl(path)
    if source == "mooncake":
        return load_mooncake(path, seed, jitter_s)
    if source == "azure":
        return load_azure(path)
    raise ValueError(f"unknown workload source '{source}'")


def load_sessions(spec: WorkloadSpec, seed: int) -> list[SessionGraph]:
    """The session graphs a run's validated `WorkloadSpec` asks for."""
    return load_graphs(spec.source, seed=seed, num_sessions=spec.num_sessions, path=spec.path,
                       agentx=spec.agentx, synthetic=spec.synthetic,
                       jitter_s=spec.open_loop.jitter_s)
