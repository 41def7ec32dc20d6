"""The global router: which rack prefills a request, and which decode instance decodes it.

In a colocated fleet the rack's router picks a colocated instance, which prefills and decodes
the request itself: only the rack choice below applies.

Rack choice (`deployment.fleet_router.policy`), recorded in `RequestRecord.route`:

- round_robin: entry racks in turn (`round_robin`).
- least_work: the entry rack with the least outstanding prefill work per prefill GPU
  (`least_work`); among racks with equal work (at light load every queue is empty), the one
  whose decode slots are least occupied, so that new sessions do not all land in the
  first rack.
- session_affinity: a session's requests go to its home rack, the rack of its first request
  (`affinity`); a new session starts in the least-work entry rack (`new_session`).
- prefix_affinity: the home rack, unless the least-work other rack's work plus this whole
  prompt is smaller, per prefill GPU, than the home rack's work plus the part of the prompt
  its prefix cache lacks (`prefix_home` / `prefix_moved`): a prefix stays where it was
  computed, so moving means recomputing it.
- spill-over (any policy with a home rack, when `spill_tokens_per_gpu` is set): a home rack
  whose work per prefill GPU exceeds it is saturated, and the session moves to the
  least-work rack that is not (`spill`).

A moved session becomes at home in its new rack; its old prefix is not copied (it ages out of
the old rack's caches). Work is the uncached tokens routed to a rack and not yet prefilled,
kept up to date on route and on prefill, so a choice costs one pass over a short list of
racks, and none at all for a session at home under affinity.

Decode placement: the instance that decoded the session last, if it sits in the prefill's
rack (or the session's KV must cross racks anyway) and has a free slot; else the local
instance with the most free slots; when none has one (or the rack has no decode instances)
and `decode_spill` is on, the instance with the most free slots in the fleet. The suffix
`+decode_remote` marks a request whose KV then crosses racks.
"""

from __future__ import annotations

from rackSim.config.specs import FleetRouterSpec
from rackSim.engine.colocated import ColocatedInstance
from rackSim.engine.decode import DecodeInstance
from rackSim.engine.fleet import Rack
from rackSim.engine.prefill import PrefillInstance
from rackSim.engine.request import Job


class FleetRouter:
    def __init__(self, spec: FleetRouterSpec, racks: list[Rack], decodes: list[DecodeInstance]):
        self.spec, self.racks, self.decodes = spec, racks, decodes
        entry = spec.entry_groups
        self.prefilling = [r for r in racks if r.router is not None]
        self.entry = [r for r in self.prefilling if entry is None or r.group in entry]
        self.single = len(racks) == 1
        self._next = 0
        self._home: dict[int, Rack] = {}          # session key base -> its rack
        self._decode: dict[int, DecodeInstance] = {}  # session key base -> last decode instance
        #: session key base -> (rack, prefill instance) that prefilled it last
        self._last_prefill: dict[int, tuple[Rack, PrefillInstance]] = {}

    # -- prefill -------------------------------------------------------------------------
    def route(self, job: Job) -> None:
        """Send `job` to a prefill instance of the rack the policy picks."""
        rack, reason = (self.racks[0], "single_rack") if self.single else self._pick(job)
        rec = job.rec
        rec.prefill_rack, rec.route = rack.index, reason
        inst, uncached = rack.router.route(job)
        inst.submit(job, uncached)
        job.routed_tokens = job.prompt_tokens - job.computed
        rack.work += job.routed_tokens
        self._last_prefill[job.inst.key_base] = (rack, inst)

    def prefilled(self, job: Job) -> None:
        """`job`'s prompt is computed: its work leaves its prefill rack's queue."""
        self.racks[job.rec.prefill_rack].work -= job.routed_tokens

    def home(self, key: int, rack: Rack, prefill: PrefillInstance | ColocatedInstance,
             decode: DecodeInstance | None) -> None:
        """Primer: a session whose prefix was made resident in `rack` lives there (on a
        colocated instance: `prefill`, with no decode instance)."""
        self._home[key], self._decode[key] = rack, decode
        self._last_prefill[key] = (rack, prefill)
        rack.router.home(key, prefill)

    def _least_work(self, racks: list[Rack]) -> Rack:
        return min(racks, key=_load)

    def _pick(self, job: Job) -> tuple[Rack, str]:
        policy = self.spec.policy
        if policy == "round_robin":
            rack = self.entry[self._next % len(self.entry)]
            self._next += 1
            return rack, "round_robin"
        if policy == "least_work":
            return self._least_work(self.entry), "least_work"
        key = job.inst.key_base
        home = self._home.get(key)
        if home is None:
            rack = self._home[key] = self._least_work(self.entry)
            return rack, "new_session"
        limit = self.spec.spill_tokens_per_gpu
        if limit is not None and home.work_per_gpu > limit:
            other = self._least_work(self.prefilling)
            if other is not home and other.work_per_gpu <= limit:
                self._home[key] = other
                return other, "spill"
        if policy == "session_affinity":
            return home, "affinity"
        return self._prefix_choice(job, key, home)

    def _prefix_choice(self, job: Job, key: int, home: Rack) -> tuple[Rack, str]:
        other = min((r for r in self.prefilling if r is not home), key=_load, default=None)
        if other is None:
            return home, "prefix_home"
        last_rack, last = self._last_prefill.get(key, (None, None))
        uncached = last.estimated_uncached(job) if last_rack is home else job.prompt_tokens
        stay = (home.work + uncached) / home.prefill_gpus
        move = (other.work + job.prompt_tokens) / other.prefill_gpus
        if move < stay:
            self._home[key] = other
            return other, "prefix_moved"
        return home, "prefix_home"

    # -- decode --------------------------------------------------------------------------
    def place_decode(self, job: Job) -> tuple[int, int]:
        """Place a prefilled `job` on a decode instance (`job.decode`, `job.rank_id`,
        `job.remote`); returns its DP rank there and the prompt blocks that rank holds."""
        rack = self.racks[job.rec.prefill_rack]
        key = job.inst.key_base
        inst = self._decode.get(key)
        local = rack.decodes
        if inst is None or inst.free_slots <= 0 or (inst.rack != rack.index and local):
            inst = max(local, key=_free) if local else None
            if (inst is None or inst.free_slots <= 0) and (self.spec.decode_spill or not local):
                best = max(self.decodes, key=_free)
                if inst is None or best.free_slots > 0:
                    inst = best
        self._decode[key] = inst
        rank, hit = inst.choose_rank(job)
        job.decode, job.rank_id = inst, inst.rank_offset + rank
        job.remote = inst.rack != rack.index
        rec = job.rec
        rec.decode_instance, rec.decode_rack = inst.index, inst.rack
        if job.remote:
            rec.route += "+decode_remote"
        return rank, hit


def _load(rack: Rack) -> tuple[float, float]:
    return rack.work_per_gpu, rack.decode_occupancy


def _free(inst: DecodeInstance) -> int:
    return inst.free_slots
