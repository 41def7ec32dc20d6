"""Candidate fleets: `racks` x one rack layout on one hardware option.

A rack layout of family `disaggregated` is `prefill_instances` x DEP`prefill_gpus` prefill +
`decode_instances` x DEP`decode_gpus` decode inside one NVLink domain; of family `colocated`,
`colocated_instances` x DEP`colocated_gpus` instances that prefill and decode alike. Each
kind of instance runs with dual-batch overlap or without (`*_dbo`; None: as the scenario
says), so the same widths with and without it are different layouts. Every
instance lives in one rack, so a fleet of identical racks with session affinity to a rack
splits the demand evenly (each rack serves `agents / racks`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from rackSim.config.specs import DBO_MARK
from rackSim.plan.spec import Space


@dataclass(frozen=True, slots=True)
class RackLayout:
    family: str
    prefill_instances: int
    prefill_gpus: int
    decode_instances: int
    decode_gpus: int
    colocated_instances: int = 0
    colocated_gpus: int = 0
    prefill_dbo: bool | None = None
    decode_dbo: bool | None = None
    colocated_dbo: bool | None = None

    @property
    def gpus(self) -> int:
        return (self.prefill_instances * self.prefill_gpus
                + self.decode_instances * self.decode_gpus
                + self.colocated_instances * self.colocated_gpus)

    @property
    def name(self) -> str:
        """e.g. `P8xDEP2+DEP32`, `P4xDEP2+2xDEP16`, `C3xDEP16`, `P4xDEP8(dbo)+DEP32` (the
        simulator's layout label)."""
        if self.family == "colocated":
            return (f"C{self.colocated_instances}xDEP{self.colocated_gpus}"
                    f"{_mark(self.colocated_dbo)}")
        return (f"P{self.prefill_instances}xDEP{self.prefill_gpus}{_mark(self.prefill_dbo)}"
                f"+{self._decode_label}")

    @property
    def family_key(self) -> str:
        """The family a rejected layout is reported under: kind, instance widths and
        overlap."""
        if self.family == "colocated":
            return f"colocated: DEP{self.colocated_gpus}{_mark(self.colocated_dbo)} instances"
        return (f"{self.family}: DEP{self.prefill_gpus}{_mark(self.prefill_dbo)} prefill + "
                f"{self._decode_label} decode")

    @property
    def _decode_label(self) -> str:
        """`DEP32`, `2xDEP16` for several decode instances, `DEP32(dbo)` with the overlap."""
        dec = f"DEP{self.decode_gpus}{_mark(self.decode_dbo)}"
        return f"{self.decode_instances}x{dec}" if self.decode_instances > 1 else dec


def _mark(dbo: bool | None) -> str:
    """`(dbo)` after an instance kind that runs with dual-batch overlap."""
    return DBO_MARK if dbo else ""


def smallest_layouts(space: Space) -> Iterator[RackLayout]:
    """One layout per family of `space`, with one instance of each kind: the fewest GPUs a
    rack of that family takes (one per overlap setting searched)."""
    unset = [None]
    for family in space.families:
        if family == "colocated":
            for cw in space.colocated_gpus:
                for co in space.colocated_dbo or unset:
                    yield RackLayout(family, 0, 0, 0, 0, 1, cw, colocated_dbo=co)
            continue
        for dw in space.decode_gpus:
            for di in space.decode_instances:
                for pw in space.prefill_gpus_per_instance:
                    for po in space.prefill_dbo or unset:
                        for do in space.decode_dbo or unset:
                            yield RackLayout(family, 1, pw, di, dw, prefill_dbo=po,
                                             decode_dbo=do)


def rack_layouts(space: Space, gpus_per_rack: int) -> Iterator[RackLayout]:
    """Every layout of `space` that fits a rack of `gpus_per_rack` GPUs: each family's
    smallest layout with every instance count of its variable kind (prefill, or colocated)
    the rack holds."""
    for first in smallest_layouts(space):
        if first.family == "colocated":
            most = min(space.colocated_instances_max, gpus_per_rack // first.colocated_gpus)
            for ci in range(1, most + 1):
                yield replace(first, colocated_instances=ci)
            continue
        left = gpus_per_rack - first.decode_gpus * first.decode_instances
        for pi in range(1, min(space.prefill_instances_max, left // first.prefill_gpus) + 1):
            yield replace(first, prefill_instances=pi)
