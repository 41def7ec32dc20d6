"""The racks of a fleet: each a set of prefill and decode instances in one NVLink domain group.

`build_fleet` lays out every rack of every rack group (`DeploymentSpec.rack_groups`) in order:
prefill instances and decode instances are numbered across the fleet (records and step rows
use those numbers), decode ranks too (the KV channel's links). One rack with one decode
instance keeps the names and seeds it had before fleets (`prefill-<i>`, `decode`), so the
reference run is unchanged.

A rack carries the disaggregated layout (prefill instances + decode instances) or, in a
colocated fleet, colocated instances that prefill and decode alike (`Rack.colocated`, behind
the rack's router as prefill instances are; nothing crosses a link). Colocated instance j
takes the step-model seed of prefill instance j (a fleet has one kind or the other).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import simpy

from rackSim.config.specs import RackGroupSpec, RunConfig, kv_bytes_per_gpu
from rackSim.engine.colocated import ColocatedInstance
from rackSim.engine.decode import DecodeInstance
from rackSim.engine.kv_transfer import KvTransferChannel, LinkEnd
from rackSim.engine.prefill import PrefillInstance
from rackSim.engine.prefix_cache import BlockCache, TieredPrefixCache
from rackSim.engine.router import Router
from rackSim.metrics.histogram import LatencyHistogram
from rackSim.perf import build_step_model
from rackSim.perf.kv_transfer import scaleout_bandwidth_bytes_s
from rackSim.workload.graph import BLOCK_TOKENS


@dataclass
class Rack:
    """One rack: its prefill instances behind the in-rack router, and its decode instances.

    `work` is the prefill work the global router has sent here and not yet seen prefilled
    (uncached tokens, as estimated when routed); `work_per_gpu` divides it by the rack's
    prefill GPUs, the load the global router compares across racks, and `decode_occupancy`
    (the share of its decode slots in use) breaks its ties."""

    index: int
    group: str
    prefills: list[PrefillInstance]
    decodes: list[DecodeInstance]
    router: Router | None
    prefill_gpus: int
    gpus: int
    work: float = 0.0
    #: decode (or colocated) instances' ITL histograms, by instance name
    itl: dict[str, LatencyHistogram] = field(default_factory=dict)
    colocated: list[ColocatedInstance] = field(default_factory=list)

    @property
    def work_per_gpu(self) -> float:
        return self.work / self.prefill_gpus if self.prefill_gpus else float("inf")

    @property
    def decode_occupancy(self) -> float:
        """Share of the rack's decode (or colocated) slots holding a request, running or
        placed; 0 for a rack without any."""
        insts = self.decodes or self.colocated
        slots = sum(i.ranks * i.max_seqs for i in insts)
        return 1.0 - sum(i.free_slots for i in insts) / slots if slots else 0.0


@dataclass
class Fleet:
    racks: list[Rack]
    prefills: list[PrefillInstance]
    decodes: list[DecodeInstance]
    colocated: list[ColocatedInstance]
    transfer: KvTransferChannel
    #: the rack of every instance, by name
    instance_racks: dict[str, int]


class _Seeds:
    """Step-model seeds: prefill i gets seed*1000 + i and decode j seed*1000 + 999 - j (the
    one-rack values; distinct while the fleet has at most 1000 instances)."""

    def __init__(self, seed: int):
        self.base = seed * 1000

    def prefill(self, i: int) -> int:
        return self.base + i

    def decode(self, j: int) -> int:
        return self.base + 999 - j


def build_fleet(cfg: RunConfig, env: simpy.Environment,
                on_prefilled: Callable, step_writer: Callable, in_window: Callable[[float], bool],
                deliver: Callable, on_prompt_done: Callable) -> Fleet:
    """Every rack of `cfg.deployment`, wired to the simulation's callbacks (`on_prefilled`:
    a prefill instance computed a prompt, whose KV must move; `on_prompt_done`: a colocated
    instance did, and decodes it itself; `step_writer(name, model)`: the step-row writer of
    each instance, `StepLog.writer`)."""
    d, m, hw = cfg.deployment, cfg.model, cfg.hardware
    groups = d.rack_groups
    one_decode = d.num_racks == 1 and groups[0].decode.instances == 1
    seeds = _Seeds(cfg.seed)
    block_bytes = BLOCK_TOKENS * m.kv_bytes_per_token
    eff = d.kv_transfer.efficiency * hw.nvlink_bw_bytes_s
    nic = hw.nic_bw_bytes_s or 0.0
    instance_racks: dict[str, int] = {}
    racks: list[Rack] = []
    prefills: list[PrefillInstance] = []
    decodes: list[DecodeInstance] = []
    colocated: list[ColocatedInstance] = []
    out_ends: list[LinkEnd] = []
    in_ends: list[LinkEnd] = []
    pull_links: list[tuple[DecodeInstance, float, float]] = []
    for g in groups:
        gcfg = cfg.for_group(g) if d.groups else cfg
        pg = g.prefill.gpus_per_instance
        dec, ranks = g.decode, (g.decode.gpus if g.decode.parallelism == "DEP" else 1)
        per_rank = dec.gpus // ranks
        d_blocks = int(kv_bytes_per_gpu(gcfg, dec.gpus) * (dec.gpus / ranks) / block_bytes)
        for _ in range(g.racks):
            k = len(racks)
            if g.colocated_instances:
                rack = _colocated_rack(gcfg, g, env, k, len(colocated), seeds, block_bytes,
                                       on_prompt_done, step_writer, in_window)
                for inst in rack.colocated:
                    instance_racks[inst.name] = k
                colocated.extend(rack.colocated)
                racks.append(rack)
                continue
            rack_prefills = _prefills(gcfg, g, env, len(prefills), seeds, block_bytes,
                                      on_prefilled, step_writer)
            for p in rack_prefills:
                out_ends.append(LinkEnd(k, pg, eff * pg))
                instance_racks[p.name] = k
            rack = Rack(k, g.name, rack_prefills, [],
                        Router(d.router, rack_prefills) if rack_prefills else None,
                        g.prefill.instances * pg, g.gpus_per_rack)
            for _ in range(dec.instances):
                j = len(decodes)
                name = "decode" if one_decode else f"decode-{j}"
                itl = rack.itl[name] = LatencyHistogram()
                model = build_step_model(gcfg, "decode", seed=seeds.decode(j))
                inst = DecodeInstance(
                    env, ranks, dec.max_num_seqs_per_rank, dec.kv_load_cap_per_step,
                    dec.speculative.accepted_tokens_per_step, dec.speculative.num_draft_tokens,
                    [BlockCache(d_blocks) for _ in range(ranks)], model, m.kv_bytes_per_token,
                    None, itl, in_window, cfg.trace_tokens, step_writer, name=name, index=j,
                    rack=k, rank_offset=len(in_ends))
                in_ends.extend(LinkEnd(k, per_rank, eff * dec.gpus / ranks)
                               for _ in range(ranks))
                pull_links.append((inst, min(eff * pg, eff * dec.gpus / ranks),
                                   scaleout_bandwidth_bytes_s(nic, pg, per_rank,
                                                              d.kv_transfer.efficiency)))
                rack.decodes.append(inst)
                decodes.append(inst)
                instance_racks[name] = k
            racks.append(rack)
            prefills.extend(rack_prefills)
    transfer = KvTransferChannel(env, d.kv_transfer, m.num_layers, out_ends, in_ends, nic,
                                 (hw.nic_latency_us or 0.0) / 1e3, deliver)
    if d.kv_transfer.mode == "pull":
        for inst, local_bw, remote_bw in pull_links:
            inst.read_stall_ms = partial(transfer.read_stall_ms, local_bytes_s=local_bw,
                                         remote_bytes_s=remote_bw)
    return Fleet(racks, prefills, decodes, colocated, transfer, instance_racks)


def _colocated_rack(cfg: RunConfig, g: RackGroupSpec, env: simpy.Environment, k: int,
                    first: int, seeds: _Seeds, block_bytes: float,
                    on_prompt_done: Callable, step_writer: Callable,
                    in_window: Callable[[float], bool]) -> Rack:
    """Rack `k` of a colocated group, its instances numbered from `first` across the fleet.
    Each DP rank (one per GPU for DEP, one per instance for TP) has the KV cache of its GPUs
    and, with host offload, their host memory."""
    col, d, m = g.colocated, cfg.deployment, cfg.model
    ranks = col.gpus if col.parallelism == "DEP" else 1
    per_rank = col.gpus // ranks
    gpu_blocks = int(kv_bytes_per_gpu(cfg, col.gpus) * per_rank / block_bytes)
    host_blocks = int(cfg.hardware.host_mem_bytes_per_gpu * per_rank / block_bytes) \
        if d.cache.host_offload else 0
    itl: dict[str, LatencyHistogram] = {}
    out = []
    for j in range(first, first + col.instances):
        name = f"colocated-{j}"
        model = build_step_model(cfg, "colocated", seed=seeds.prefill(j))
        itl[name] = hist = LatencyHistogram()
        out.append(ColocatedInstance(
            env, j, ranks, col.max_num_batched_tokens, col.max_num_seqs_per_rank,
            col.speculative.accepted_tokens_per_step, col.speculative.num_draft_tokens,
            [TieredPrefixCache(gpu_blocks, host_blocks) for _ in range(ranks)], model,
            m.kv_bytes_per_token, hist, in_window, cfg.trace_tokens, on_prompt_done,
            step_writer, rack=k))
    return Rack(k, g.name, [], [], Router(d.router, out), col.instances * col.gpus,
                g.gpus_per_rack, itl=itl, colocated=out)


def _prefills(cfg: RunConfig, g: RackGroupSpec, env: simpy.Environment, first: int,
              seeds: _Seeds, block_bytes: float,
              on_prefilled: Callable, step_writer: Callable) -> list[PrefillInstance]:
    """The prefill instances of one rack, numbered from `first` across the fleet."""
    d, m = cfg.deployment, cfg.model
    pg = g.prefill.gpus_per_instance
    p_blocks = int(kv_bytes_per_gpu(cfg, pg) * pg / block_bytes)
    host_blocks = int(cfg.hardware.host_mem_bytes_per_gpu * pg / block_bytes) \
        if d.cache.host_offload else 0
    out = []
    for i in range(first, first + g.prefill.instances):
        model = build_step_model(cfg, "prefill", seed=seeds.prefill(i))
        out.append(PrefillInstance(
            env, i, pg, g.prefill.max_num_batched_tokens, g.prefill.max_num_seqs,
            TieredPrefixCache(p_blocks, host_blocks), model, m.kv_bytes_per_token,
            on_prefilled=on_prefilled, step_writer=step_writer))
    return out
