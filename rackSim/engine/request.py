"""A request in flight through the simulated deployment."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rackSim.metrics.records import RequestRecord
from rackSim.workload.graph import PromptPath, RequestSpec, SessionInstance

if TYPE_CHECKING:
    from rackSim.engine.decode import DecodeInstance


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
    # fleet placement
    decode: DecodeInstance | None = None  # the instance that decodes it
    rank_id: int = -1          # its decode rank, numbered across the fleet
    remote: bool = False       # its KV crosses racks (scale-out network)
    routed_tokens: int = 0     # uncached tokens the global router charged its prefill rack

