"""Statistics of an imported pool: shape, delays, fan-out and the infinite-cache token mix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rackSim.workload.agent_logs import import_sessions
from rackSim.workload.agentx import AgentXSpec, generate_agentx
from rackSim.workload.claude_code_logs import read_claude_code
from rackSim.workload.command import main
from rackSim.workload.stats import context_growth_curve, describe, reuse_curve

CLAUDE = Path(__file__).parent / "fixtures" / "agent_logs" / "claude_code"


@pytest.fixture(scope="module")
def imported():
    return import_sessions(read_claude_code(CLAUDE), "claude-code transcripts")


def test_shape_of_the_imported_fixture_by_hand(imported):
    graphs, _ = imported
    s = describe(graphs, cache_tokens=[16_384]).summary
    # main-agent turns: 3 (plain session) and 6 (forked session)
    assert s["turns_per_session_mean"] == 4.5
    # prompt growth over the same agent's previous call, incl. the compaction's -8208
    growth = [803, 502, 1505, 704, 2006, -8208, 402, 1052, 602, 302]
    assert s["context_growth_tokens_per_turn_mean"] == pytest.approx(np.mean(growth))
    assert s["context_growth_tokens_per_turn_p50"] == pytest.approx(653)
    delays = [0.4, 0.9, 0.3, 3.0, 0.5, 0.9, 1.2, 0.7, 2.0, 1.0, 32.1, 4.0]
    assert s["delay_s_mean"] == pytest.approx(np.mean(delays))
    assert s["delay_s_p90"] == pytest.approx(np.quantile(delays, 0.9))
    assert (s["forks_per_session_mean"], s["subagents_per_fork_mean"]) == (0.5, 2.0)
    assert s["peak_prompt_tokens_p50"] == pytest.approx((15_309 + 22_218) / 2)


def test_infinite_cache_mix_matches_the_logged_cache_reads(imported):
    """At an infinite cache the pool's cached tokens are the logs' cache reads (minus the
    first calls' cross-session reads), short by at most the partial block of each prompt."""
    graphs, report = imported
    s = describe(graphs).summary
    total = s["prompt_tokens"] + s["output_tokens"]
    assert s["mix_cached_inf"] + s["mix_uncached_inf"] + s["mix_output"] == pytest.approx(1.0)
    assert s["mix_output"] == pytest.approx(s["output_tokens"] / total)
    reads = s["prefix_tokens"]          # the logs' cache reads kept as prefixes
    children = sum(r.parent is not None for g in graphs for r in g.requests)
    assert reads - 64 * children <= s["cached_tokens_inf"] <= reads
    assert s["mix_cached_inf"] == pytest.approx(s["cached_tokens_inf"] / total)


def test_curves():
    graphs = generate_agentx(AgentXSpec(), 0, num_sessions=12)
    curve = reuse_curve(graphs, [1 << 16, 1 << 18, 1 << 20, None])
    assert np.all(np.diff(curve["reuse"]) >= 0)
    assert curve["reuse"].iloc[-1] == pytest.approx(describe(graphs).summary["reuse_inf"])
    growth = context_growth_curve(graphs)
    assert growth["turn"].tolist() == list(range(len(growth)))
    assert growth["sessions"].iloc[0] == 12 and growth["sessions"].is_monotonic_decreasing
    first = [g.requests[0].prompt_tokens for g in graphs]
    assert growth["prompt_p50"].iloc[0] == pytest.approx(np.median(first))


def test_command_prints_the_mix(tmp_path, capsys):
    pool = tmp_path / "pool.jsonl"
    assert main(["import", str(CLAUDE), "--out", str(pool)]) == 0
    assert main(["--jsonl", str(pool), "--out", str(tmp_path / "stats"), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "token mix at infinite cache" in out and "77.55% / 21.42% / 1.03%" in out
