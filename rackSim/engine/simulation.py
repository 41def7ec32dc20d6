"""Assemble a simulated deployment (a fleet of racks) from a RunConfig and run it.

Data flow: clients -> global router (rack) -> rack router -> prefill instance (chunked prefill,
prefix cache) -> global router (decode instance) -> KV transfer (NVLink in a rack, scale-out
NICs between racks) -> decode instance (DP ranks, continuous batching) -> clients; in a
colocated fleet, rack router -> colocated instance (prefill and decode) -> clients. Every step
and every request is recorded; inter-token latency goes into one histogram per decode instance
for the measurement window only.
"""

from __future__ import annotations

import copy
import gc
import signal
import threading
import time
from dataclasses import dataclass, field

import simpy

from rackSim.config.specs import RunConfig
from rackSim.engine.client import AgentClients, TraceClients
from rackSim.engine.fleet import build_fleet
from rackSim.engine.fleet_router import FleetRouter
from rackSim.engine.progress import RunProgress
from rackSim.engine.request import Job
from rackSim.metrics.histogram import LatencyHistogram
from rackSim.metrics.records import RequestLog, RequestRecord, StepLog
from rackSim.workload.graph import BLOCK_TOKENS, RequestSpec, SessionGraph, SessionInstance
from rackSim.workload.open_loop import OpenLoopSchedule
from rackSim.workload.replay import ClosedLoopReplay, OpenLoopPhases

CHUNK_S = 5.0  # simulated seconds between progress updates / interrupt checks


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules.

    SimPy numbers every scheduled event from a counter (`_eid`), so the count is read from a
    copy of that counter rather than by wrapping `schedule` (a Python call per event).
    """

    def __init__(self) -> None:
        super().__init__()
        # SimPy binds its event factories (env.timeout, env.event, ...) to the instance only
        # for those defined on the instance's own class; bind them for this subclass too, or
        # every `env.timeout` goes through a descriptor call.
        for cls in type(self).__mro__:
            for name, obj in cls.__dict__.items():
                if type(obj) is simpy.core.BoundClass and name not in self.__dict__:
                    setattr(self, name, getattr(self, name))

    @property
    def events_scheduled(self) -> int:
        return next(copy.copy(self._eid))


class WarmupTooLong(RuntimeError):
    pass


@dataclass
class SimOutput:
    """Everything a run produced (raw; `rackSim.metrics` turns it into a Result)."""

    requests: RequestLog
    steps: StepLog
    itl: LatencyHistogram
    window_start_s: float
    window_end_s: float
    num_gpus: int
    partial: bool
    sim_s: float
    wall_s: float
    events: int
    kv_bytes_moved: float
    notes: list[str] = field(default_factory=list)
    kv_bytes_cross_rack: float = 0.0
    #: the rack of every instance (step rows name instances)
    instance_racks: dict[str, int] = field(default_factory=dict)
    #: each decode instance's ITL histogram over the window (`itl` is their sum)
    decode_itl: dict[str, LatencyHistogram] = field(default_factory=dict)
    #: GPUs of each rack
    rack_gpus: list[int] = field(default_factory=list)


class Simulation:
    """One simulated deployment of `cfg` replaying `sessions`."""

    def __init__(self, cfg: RunConfig, sessions: list[SessionGraph]):
        self.cfg = cfg
        d, m = cfg.deployment, cfg.model
        self.env = env = CountingEnvironment()
        self.records = RequestLog()
        self.steps = StepLog()
        self._window_s = cfg.workload.replay.window_s
        self._kv_bytes_per_token = m.kv_bytes_per_token
        fleet = build_fleet(cfg, env, self._prefilled, self.steps.writer, self._in_window,
                            deliver=lambda job: job.decode.deliver(job),
                            on_prompt_done=lambda job: self.router.prefilled(job))
        self.fleet, self.racks = fleet, fleet.racks
        self.prefills, self.decodes, self.transfer = fleet.prefills, fleet.decodes, fleet.transfer
        self.router = FleetRouter(d.fleet_router, fleet.racks, fleet.decodes)
        replay = cfg.workload.replay
        if cfg.workload.timestamped:
            schedule = OpenLoopSchedule.from_spec(sessions, cfg.workload.open_loop,
                                                  replay.warmup_s + replay.window_s)
            schedule.require_arrival_after(replay.warmup_s)
            self.phases = OpenLoopPhases(replay)
            self.clients = TraceClients(env, schedule, self.phases, self._submit, self.records)
        else:
            self.phases = ClosedLoopReplay(sessions, replay, cfg.seed)
            self.clients = AgentClients(env, self.phases, self._submit, self._warm,
                                        self.records)

    # -- wiring ----------------------------------------------------------------------------
    def _submit(self, job: Job) -> None:
        self.router.route(job)

    def _prefilled(self, job: Job) -> None:
        self.router.prefilled(job)
        rank, hit_blocks = self.router.place_decode(job)
        job.decode_rank = rank
        moved = max(0, job.prompt_tokens - hit_blocks * BLOCK_TOKENS)
        self.transfer.send(job, moved * self._kv_bytes_per_token)

    def _warm(self, inst: SessionInstance, spec: RequestSpec) -> None:
        """Primer: make a lane's active prefix resident (no compute is simulated: equivalent
        to a perfectly primed cache). Lanes are spread over the entry racks, then over each
        rack's prefill instances, decode instances and decode ranks, so that the primed state
        is balanced; affinity routing then follows the prefixes."""
        rec = RequestRecord(session_id=inst.graph.session_id, rid=spec.rid, lane=inst.lane,
                            session_key=inst.key_base, agent=spec.agent, send_s=0.0,
                            prompt_tokens=spec.prompt_tokens,
                            phase="primer")
        job = Job(spec=spec, inst=inst, path=inst.prompt_path(spec.rid), rec=rec,
                  on_done=lambda _j: None, output_tokens=1, prompt_tokens=spec.prompt_tokens)
        entry = self.router.entry
        rack = entry[inst.lane % len(entry)]
        q = inst.lane // len(entry)
        if rack.colocated:
            here = rack.colocated[q % len(rack.colocated)]
            here.warm(job, (q // len(rack.colocated)) % here.ranks)
            self.router.home(inst.key_base, rack, here, None)
            return
        prefill = rack.prefills[q % len(rack.prefills)]
        prefill.cache.insert(job.path)
        decodes = rack.decodes or self.decodes
        decode = decodes[q % len(decodes)]
        rank = (q // len(decodes)) % decode.ranks
        decode.caches[rank].insert(job.path)
        decode._affinity[inst.key_base] = rank
        self.router.home(inst.key_base, rack, prefill, decode)

    def _in_window(self, t: float) -> bool:
        start = self.phases.window_start_s
        return start is not None and start <= t < start + self._window_s

    # -- running ---------------------------------------------------------------------------
    def run(self, progress: bool = True, max_warmup_s: float | None = None) -> SimOutput:
        """Run until the window (plus drain) has passed. Ctrl-C stops early: the output is
        then marked partial."""
        replay = self.cfg.workload.replay
        max_warmup_s = max_warmup_s if max_warmup_s is not None else max(
            1800.0, 2 * replay.window_s)
        env = self.env
        t0 = time.perf_counter()
        self.clients.start()
        bar = RunProgress(self.phases, replay.window_s, replay.drain_s) if progress else None
        if bar is not None:
            bar.update(env.now)
        partial = ended = False
        # A run allocates millions of short-lived objects (events, jobs) that reference
        # counting frees, and keeps every request record and step row. The automatic cyclic
        # collector would rescan that growing heap (9% of a 16-minute reference run) to find
        # almost nothing (7.6K cyclic objects against 420K kept): it is off while simulating,
        # and the caller's setting comes back afterwards.
        gc_enabled = gc.isenabled()
        gc.disable()
        ctrl_c = _CtrlC()
        try:
            while not ctrl_c.pressed:
                ws = self.phases.window_start_s
                if ws is None:
                    if env.now > max_warmup_s:
                        raise WarmupTooLong(
                            f"warm-up did not finish within {max_warmup_s:.0f} simulated s "
                            f"({sum(r.phase != 'primer' for r in self.records)} requests sent); "
                            "lower workload.replay.warmup_requests_per_lane or concurrency")
                    env.run(until=env.now + CHUNK_S)
                    if bar is not None:
                        bar.update(env.now)
                    continue
                end = ws + replay.window_s + replay.drain_s
                if env.now >= end or (env.now >= ws + replay.window_s
                                      and self.clients.in_flight == 0):
                    ended = True
                    break
                env.run(until=min(end, env.now + CHUNK_S))
                if bar is not None:
                    bar.update(env.now)
        except KeyboardInterrupt:  # not on the main thread: Ctrl-C arrives as an exception
            partial = True
        finally:
            ctrl_c.restore()
            if gc_enabled:
                gc.enable()
            if bar is not None:
                bar.close(ended)
        partial = partial or ctrl_c.pressed
        self.clients.stopped = True
        ws = self.phases.window_start_s
        ws = env.now if ws is None else ws
        we = min(ws + replay.window_s, env.now)
        decode_itl = {k: v for r in self.racks for k, v in r.itl.items()}
        return SimOutput(requests=self.records, steps=self.steps,
                         itl=LatencyHistogram.merged(decode_itl.values()),
                         window_start_s=ws, window_end_s=we,
                         num_gpus=self.cfg.deployment.num_gpus, partial=partial,
                         sim_s=env.now, wall_s=time.perf_counter() - t0,
                         events=env.events_scheduled, kv_bytes_moved=self.transfer.bytes_moved,
                         kv_bytes_cross_rack=self.transfer.bytes_cross_rack,
                         instance_racks=self.fleet.instance_racks, decode_itl=decode_itl,
                         rack_gpus=[r.gpus for r in self.racks])


class _CtrlC:
    """Ctrl-C (SIGINT) as a flag the run loop reads between chunks, on the main thread.

    A KeyboardInterrupt lands at whatever bytecode is running: inside a SimPy process (which
    SimPy then records as that process's failure and re-raises later), inside a lock, or
    between two updates of one record. A flag stops the run at a chunk boundary with
    everything consistent. Elsewhere (a worker thread cannot set signal handlers) Ctrl-C
    stays an exception."""

    def __init__(self) -> None:
        self.pressed = False
        self._installed = threading.current_thread() is threading.main_thread()
        if self._installed:
            previous = signal.signal(signal.SIGINT, self._press)
            # None: the previous handler was not set from Python; Python's own comes back
            self._previous = signal.default_int_handler if previous is None else previous

    def _press(self, _signum: int, _frame: object) -> None:
        self.pressed = True

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False
