"""Small built-in workloads for validating against a CPU vLLM server (two cores, tiny MoE).

Contexts stay within 3,000 tokens (the server runs with --max-model-len 4096), outputs are
short, so a window of tens of seconds holds hundreds of requests without saturating two cores.
"""

from __future__ import annotations

from rackSim.config.specs import ReplaySpec, SyntheticSessionsSpec, WorkloadSpec

CPU_TINY_SESSIONS = SyntheticSessionsSpec(
    turns_mean=5, first_prompt_tokens_mean=800, new_tokens_per_turn_mean=250,
    output_tokens_mean=32, tool_delay_s_mean=0.3, subagent_prob=0.2, subagent_fanout_max=2,
    subagent_turns_mean=2, max_context_tokens=3000)
"""Agentic sessions scaled to a CPU server: ~5 turns, 800-token first prompt, +250 per turn,
32 output tokens, 0.3 s tool delay, occasional 1-2 subagents (all means)."""


def cpu_tiny_workload(concurrency: int, window_s: float = 30.0, warmup: int = 2,
                      num_sessions: int = 40) -> WorkloadSpec:
    """The built-in CPU workload at a given concurrency (lanes) and window (s)."""
    return WorkloadSpec(
        name="cpu-tiny-agentic", source="synthetic", num_sessions=num_sessions,
        synthetic=CPU_TINY_SESSIONS,
        replay=ReplaySpec(concurrency=concurrency, primer=True,
                          warmup_requests_per_lane=warmup, window_s=window_s))
