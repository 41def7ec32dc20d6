"""A request in flight through the simulated deployment."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rackSim.metrics.records import RequestRecord
from rackSim.workload.graph import PromptPath, RequestSpec, SessionGraph, SessionInstance


@dataclass(slots=True, eq=False)
class Job:
    """State of one request between send and retirement (all token counts in tokens)."""

    spec: RequestSpec
    inst: SessionInstance
    path: PromptPath
    rec: RequestRecord
    on_done: Callable[[Job], None]
    output_tokens: int
    prompt_tokens: int
    computed: int = 0          # prompt tokens whose KV exists on the prefill instance
    host_blocks: int = 0       # cached blocks that must be promoted from host memory
    decode_rank: int = -1
    finish_step: int = -1
    steps: int = 0             # decode steps it needs
    admit_step: int = -1


class SessionPaths:
    """Prompt and context paths of requests, computed once per session graph and shared by all
    replays of it (`SessionInstance` computes them per replay).

    A derived path's node keys are the replay's `key_base` plus a request index (see
    `workload.graph`), so it is stored relative to `key_base` and shifted for each replay; an
    explicit path (trace loaders) has global keys and is stored as is.
    """

    def __init__(self) -> None:
        # id(graph) -> (graph, {rid: (derived, path)}, {rid: (derived, path)}); the graph is
        # held so that its id stays unique while it is cached
        self._graphs: dict[int, tuple[SessionGraph, dict, dict]] = {}

    def _entry(self, graph: SessionGraph) -> tuple[SessionGraph, dict, dict]:
        entry = self._graphs.get(id(graph))
        if entry is None or entry[0] is not graph:
            entry = self._graphs[id(graph)] = (graph, {}, {})
        return entry

    def prompt(self, inst: SessionInstance, rid: int) -> PromptPath:
        """`inst.prompt_path(rid)`."""
        entry = self._graphs.get(id(inst.graph))
        if entry is None or entry[0] is not inst.graph:
            entry = self._entry(inst.graph)
        return self._get(inst, rid, entry[1], inst.prompt_path)

    def context(self, inst: SessionInstance, rid: int) -> PromptPath:
        """`inst.context_path(rid)`."""
        entry = self._graphs.get(id(inst.graph))
        if entry is None or entry[0] is not inst.graph:
            entry = self._entry(inst.graph)
        return self._get(inst, rid, entry[2], inst.context_path)

    @staticmethod
    def _get(inst: SessionInstance, rid: int, cache: dict,
             compute: Callable[[int], PromptPath]) -> PromptPath:
        kb = inst.key_base
        hit = cache.get(rid)
        if hit is None:
            path = compute(rid)
            derived = inst.graph.requests[rid].path is None
            cache[rid] = (derived, tuple([(k - kb, b) for k, b in path]) if derived else path)
            return path
        derived, path = hit
        if not derived or kb == 0:
            return path
        if len(path) == 1:  # most paths are 1-2 nodes deep
            (k, b), = path
            return ((k + kb, b),)
        if len(path) == 2:
            (k, b), (k2, b2) = path
            return ((k + kb, b), (k2 + kb, b2))
        return tuple([(k + kb, b) for k, b in path])
