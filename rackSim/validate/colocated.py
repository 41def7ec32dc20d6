"""One vLLM server, simulated: the engine's colocated instance with a measured step model.

A single vLLM server is not disaggregated: one scheduler mixes prefill chunks and decode
tokens in every step. The validated mode simulates it with the main engine's colocated
instance (`rackSim.engine.colocated.ColocatedInstance`: decode tokens first, then chunked
prefill up to `max_num_batched_tokens`, FIFO admission under `max_num_seqs`, prefix hits in
whole KV blocks of the server's size, at most prompt - 1 tokens, the first token at the end
of the step that completes the prompt) with one rank, the server's shape, its front-end delays
(before the scheduler, and per output token after each step) and the host time a request's
intake takes from the step in progress, all from the measured profile, and every step priced
by `MeasuredStepModel.mixed_step`. Clients are the simulator's own
(`rackSim.engine.client.AgentClients` on `rackSim.workload.replay`), so the replay policy is
the driver's (a lane that starts mid-session first sends its primer, one output token, and
waits for it); every token's time is recorded so ITL is computed from
token times exactly as for the measured run. No speculative decoding (the measured server
runs none); the KV cache holds `kv_capacity_tokens` and nothing is offloaded to the host.

What a turn's prompt re-sends as its predecessor's output is the run's choice
(`driver.PROMPT_OUTPUTS`, run.json `prompt_outputs`): the token ids the server generated, as
an agent re-sends what the model said, so the blocks the output filled hit the server's cache
and the simulated server keeps outputs reusable (`reuse_outputs=True`, as the main engine
does); or the workload's own ids (runs recorded before the choice), which never match the
generated ones, so a turn's hit ends at its predecessor's prompt and the simulated server
keeps only prompts reusable. Measured on a six-lane run of the second kind: one request in
seven hit one 128-token block less than a cache that kept the outputs predicts, exactly those
whose predecessor's last full block held output tokens. What a finished request leaves is
its context less the last sampled token, whose KV vLLM never computes (a primer's: its prompt
and one token), as the engine's colocated instance keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from rackSim.config.specs import PricingSpec, ReplaySpec
from rackSim.engine.client import AgentClients
from rackSim.engine.colocated import ColocatedInstance
from rackSim.engine.prefix_cache import TieredPrefixCache
from rackSim.metrics.histogram import LatencyHistogram
from rackSim.metrics.records import RequestLog, StepLog
from rackSim.perf.measured import MeasuredStepModel, Profile
from rackSim.workload.graph import BLOCK_TOKENS, SessionGraph
from rackSim.workload.replay import ClosedLoopReplay

ZERO_PRICING = PricingSpec(name="none", cached_input_usd_per_mtok=0.0,
                           uncached_input_usd_per_mtok=0.0, output_usd_per_mtok=0.0,
                           gpu_hour_usd=0.0)


@dataclass
class ColocatedOutput:
    """Raw output of a colocated simulation: records, step rows, window (s)."""

    records: RequestLog
    steps: StepLog
    window_start_s: float
    window_end_s: float
    sim_s: float


def simulate_colocated(sessions: list[SessionGraph], replay: ReplaySpec, profile: Profile,
                       seed: int = 0, max_sim_s: float = 3600.0, reuse_outputs: bool = False
                       ) -> ColocatedOutput:
    """Replay `sessions` on one simulated engine priced by `profile`; run until the window has
    passed and the requests in flight have finished (as the driver does). reuse_outputs:
    whether later prompts re-send outputs as the server generated them (module docstring)."""
    env = simpy.Environment()
    records = RequestLog()
    steps = StepLog()
    shape = profile.server
    engine = ColocatedInstance(
        env, 0, 1, shape.max_num_batched_tokens, shape.max_num_seqs, 1.0, 0,
        [TieredPrefixCache(shape.kv_capacity_tokens // BLOCK_TOKENS)],
        MeasuredStepModel.from_profile(profile, seed=seed), 0.0, LatencyHistogram(),
        lambda _t: False,
        True, lambda _job: None, steps.writer, block_tokens=shape.block_tokens,
        api_delay_s=profile.api_overhead_ms / 1e3, output_delay_s=profile.output_ms / 1e3,
        reuse_outputs=reuse_outputs, intake_stall_ms=profile.intake_stall_ms,
        intake_stall_per_token_ms=profile.intake_stall_per_token_ms)
    rp = ClosedLoopReplay(sessions, replay, seed)
    # primers are sent as requests and waited for, as the driver sends them to the server
    clients = AgentClients(env, rp, engine.submit, None, records)
    clients.start()
    while env.now < max_sim_s:
        env.run(until=env.now + 1.0)
        end = rp.window_end_s
        if end is not None and env.now >= end and clients.in_flight == 0:
            break
    clients.stopped = True
    ws = rp.window_start_s if rp.window_start_s is not None else env.now
    we = min(ws + replay.window_s, env.now)
    return ColocatedOutput(records, steps, ws, we, env.now)
