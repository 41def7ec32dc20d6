"""The colocated engine model: chunked prefill, 128-token prefix hits, continuous batching."""

from __future__ import annotations

import pytest

from rackSim.config.specs import ReplaySpec
from rackSim.perf.measured import Profile, ServerShape
from rackSim.validate.colocated import simulate_colocated
from rackSim.workload.graph import RequestSpec, SessionGraph

COEF = {"const_ms": 2.0, "per_prefill_token_ms": 0.01, "per_prefill_request_ms": 1.0,
        "per_decode_request_ms": 0.5, "per_context_token_ms": 0.0}


def _profile(api_ms: float = 0.0, budget: int = 2048) -> Profile:
    return Profile(coeffs=dict(COEF), overhead_ms=0.5, api_overhead_ms=api_ms,
                   server=ServerShape(max_num_batched_tokens=budget))


def _chain() -> SessionGraph:
    """Turn 0: 3000-token prompt, 4 outputs. Turn 1 re-sends turn 0's context + 300 new."""
    r0 = RequestSpec(rid=0, parent=None, prefix_tokens=0, new_tokens=3000, output_tokens=4)
    r1 = RequestSpec(rid=1, parent=0, prefix_tokens=3004, new_tokens=300, output_tokens=3,
                     after=(0,), delay_s=0.5)
    return SessionGraph(session_id="s", requests=(r0, r1))


def _run(profile: Profile):
    replay = ReplaySpec(concurrency=1, primer=False, warmup_requests_per_lane=0, window_s=1.2)
    return simulate_colocated([_chain()], replay, profile, seed=0)


def test_lone_session_by_hand():
    out = _run(_profile(api_ms=5.0))
    # the lane's first session starts at a random turn; the second replay starts at turn 0
    r0 = next(r for r in out.records if r.rid == 0)
    r1 = next(r for r in out.records if r.rid == 1 and r.session_key == r0.session_key)
    # 3000 tokens under a 2048 budget: two prefill steps, the first token ends the second
    s1 = 2.0 + 0.5 + 0.01 * 2048 + 1.0
    s2 = 2.0 + 0.5 + 0.01 * 952 + 1.0
    dec = 2.0 + 0.5 + 0.5
    assert r0.ttft_ms == pytest.approx(5.0 + s1 + s2)
    assert r0.token_times_s[1] - r0.token_times_s[0] == pytest.approx(dec / 1e3)
    assert r0.output_tokens == len(r0.token_times_s) == 4 and r0.cached_tokens == 0
    # turn 1 hits its prefix in whole 128-token blocks: 3004 -> 2944 tokens
    assert r1.cached_tokens == 2944
    assert r1.send_s == pytest.approx(r0.finish_s + 0.5)
    assert r1.ttft_ms == pytest.approx(5.0 + 2.0 + 0.5 + 0.01 * (3304 - 2944) + 1.0)
    first = out.records[0]  # cold: the whole prompt in 2048-token chunks
    rows = list(out.steps)
    assert [r[4] for r in rows[:2]] == [1, 1]
    assert [r[5] for r in rows[:2]] == [2048, first.prompt_tokens - 2048]
    done = [r for r in out.records if r.finish_s == r.finish_s]
    # every request's first token comes from its last prefill step, the rest from decode steps
    assert sum(r[7] for r in rows) == sum(r.output_tokens - 1 for r in done)


def test_more_lanes_more_batching():
    replay = ReplaySpec(concurrency=3, primer=False, warmup_requests_per_lane=0, window_s=1.0)
    out = simulate_colocated([_chain()], replay, _profile(), seed=0)
    assert max(r[6] for r in out.steps) >= 2  # decode steps batch several requests
    assert all(r.output_tokens == len(r.token_times_s) for r in out.records
               if r.finish_s == r.finish_s)


def test_the_front_end_hands_a_step_s_outputs_out_one_after_another():
    """output_ms per output token: a step with n running requests reaches its clients
    (n + 1) / 2 x output_ms after it ends: first token, every token, the finish, and so the
    client's next request; the engine's own steps do not move."""
    base, fe = _run(_profile(api_ms=5.0)), _profile(api_ms=5.0)
    fe.output_ms = 2.0
    out = _run(fe)
    pick = lambda o: {(r.session_key, r.rid): r for r in o.records}  # noqa: E731
    a, b = pick(base), pick(out)
    key = next(k for k, r in a.items() if k[1] == 0)
    r0, f0 = a[key], b[key]
    # alone in the engine (n = 1): every token one output's worth (2 ms) later than the
    # engine's step end, counted from the request's send (itself later: the client saw the
    # previous session's finish later)
    assert f0.ttft_ms == pytest.approx(r0.ttft_ms + 2.0)
    assert [(t - f0.send_s) - (s - r0.send_s)
            for t, s in zip(f0.token_times_s, r0.token_times_s, strict=True)] \
        == pytest.approx([2e-3] * 4)
    assert f0.finish_s - f0.send_s == pytest.approx(r0.finish_s - r0.send_s + 2e-3)
    # the engine's time is its own: the prompt is computed as long after the send as before
    assert f0.prefill_end_s - f0.send_s == pytest.approx(r0.prefill_end_s - r0.send_s)
    nxt = b[(key[0], 1)]
    assert nxt.send_s == pytest.approx(f0.finish_s + 0.5)  # the client went on when it saw it


def test_more_lanes_wait_for_more_outputs_ahead():
    """With three lanes a step hands out up to three outputs: a first token waits
    (n + 1) / 2 x output_ms for n = 1, 2 or 3 requests running in its step."""
    fe = _profile()
    fe.output_ms = 2.0
    replay = ReplaySpec(concurrency=3, primer=False, warmup_requests_per_lane=0, window_s=1.0)
    out = simulate_colocated([_chain()], replay, fe, seed=0)
    n = {round(2 * (r.first_token_s - r.prefill_end_s) * 1e3 / 2.0 - 1, 9)
         for r in out.records if r.first_token_s == r.first_token_s}
    assert n <= {1.0, 2.0, 3.0} and max(n) > 1


def test_the_simulated_server_s_own_means_by_hand():
    """A lone session never queues; its prefill is its prompt's steps; the server's TTFT
    starts after the intake (2 of the 5 ms before the scheduler)."""
    from rackSim.validate.runs import simulated_server_means_ms

    prof = _profile(api_ms=5.0)
    prof.intake_ms = 2.0
    out = _run(prof)
    done = [r for r in out.records if r.first_token_s == r.first_token_s]
    means = simulated_server_means_ms(out, prof)
    prefill = sum((r.prefill_end_s - r.prefill_start_s) * 1e3 for r in done) / len(done)
    assert means["server_queue_mean_ms"] == pytest.approx(0.0, abs=1e-9)
    assert means["server_prefill_mean_ms"] == pytest.approx(prefill)
    assert means["server_ttft_mean_ms"] == pytest.approx(3.0 + prefill)
    r0 = next(r for r in done if r.rid == 0 and r.prompt_tokens == 3000)
    # the cold 3000-token prompt: two chunks under the 2048-token budget
    assert (r0.prefill_end_s - r0.prefill_start_s) * 1e3 == pytest.approx(
        2.0 + 0.5 + 0.01 * 2048 + 1.0 + 2.0 + 0.5 + 0.01 * 952 + 1.0)
    # three lanes under a 1024-token budget: a 3000-token prompt takes whole steps, so
    # requests arriving meanwhile queue for steps with room
    tight = _profile(api_ms=5.0, budget=1024)
    replay = ReplaySpec(concurrency=3, primer=False, warmup_requests_per_lane=0, window_s=1.0)
    busy = simulate_colocated([_chain()], replay, tight, seed=0)
    assert simulated_server_means_ms(busy, tight)["server_queue_mean_ms"] > 1.0
    # between two scrapes, as vLLM observes them: TTFT of the requests whose first token
    # falls in the window, queue and prefill of those that finish in it
    ok = [r for r in busy.records if r.first_token_s == r.first_token_s]
    ends = sorted(r.prefill_end_s for r in ok)
    lo, hi = ends[1], ends[-2]
    win = simulated_server_means_ms(busy, tight, (lo, hi))
    first = [r for r in ok if lo <= r.prefill_end_s <= hi]
    ended = [r for r in ok if lo <= r.finish_s <= hi]
    assert 0 < len(first) < len(ok) and {id(r) for r in ended} != {id(r) for r in first}
    assert win["server_ttft_mean_ms"] == pytest.approx(
        sum((r.prefill_end_s - r.send_s) * 1e3 - tight.intake_ms for r in first) / len(first))
    assert win["server_prefill_mean_ms"] == pytest.approx(
        sum((r.prefill_end_s - r.prefill_start_s) * 1e3 for r in ended) / len(ended))
    assert simulated_server_means_ms(busy, tight, (-2.0, -1.0))["server_ttft_mean_ms"] != \
        simulated_server_means_ms(busy, tight, (-2.0, -1.0))["server_ttft_mean_ms"]  # NaN


def test_a_lane_starting_mid_session_sends_its_primer_and_waits_for_it():
    """As the driver does: the primer is a request of one output token, recorded in phase
    'primer' (the server's own counters see it), and the lane's session starts when it ends."""
    # four lanes over the one session's nominal 2.5 s: the last lane's slice (from 1.9 s)
    # lies past turn 1's send (1.52 s), so at least that lane starts mid-session
    replay = ReplaySpec(concurrency=4, primer=True, warmup_requests_per_lane=0, window_s=1.0)
    out = simulate_colocated([_chain()], replay, _profile(api_ms=5.0), seed=3)
    primers = [r for r in out.records if r.phase == "primer"]
    assert 3 in {p.lane for p in primers}
    assert all(r.output_tokens == 1 and r.send_s == 0.0 for r in primers)
    for p in primers:
        after = [r for r in out.records if r.lane == p.lane and r.phase != "primer"]
        # the lane's first session request goes out the moment its primer finished
        assert min(r.send_s for r in after) == pytest.approx(p.finish_s)
        assert p.ttft_ms == pytest.approx((p.finish_s - p.send_s) * 1e3) and p.ttft_ms > 5.0


def test_a_turn_hits_its_predecessor_s_output_only_when_re_sent_as_generated():
    """Turn 1 re-sends 3000 prompt + 100 output tokens. Re-sent as the workload's own ids (runs
    recorded before `prompt_outputs`), the output never matches what the server generated and
    the turn hits 3000 // 128 = 23 blocks (2944 tokens); re-sent as the server's ids, as an
    agent does (`reuse_outputs=True`, the main engine's instance as it runs), it hits
    3100 // 128 = 24 (3072)."""
    r0 = RequestSpec(rid=0, parent=None, prefix_tokens=0, new_tokens=3000, output_tokens=100)
    r1 = RequestSpec(rid=1, parent=0, prefix_tokens=3100, new_tokens=300, output_tokens=3,
                     after=(0,), delay_s=0.5)
    chain = SessionGraph(session_id="s", requests=(r0, r1))
    replay = ReplaySpec(concurrency=1, primer=False, warmup_requests_per_lane=0, window_s=3.0)

    def turn_one_hit(reuse_outputs: bool) -> int:
        out = simulate_colocated([chain], replay, _profile(), seed=0,
                                 reuse_outputs=reuse_outputs)
        first = next(r for r in out.records if r.rid == 0)
        return next(r.cached_tokens for r in out.records
                    if r.rid == 1 and r.session_key == first.session_key)

    assert turn_one_hit(False) == 2944
    assert turn_one_hit(True) == 3072


def test_a_primer_leaves_only_what_it_computed():
    """A lane that starts at turn 1 first primes turn 0 with one output token. Turn 1 then
    re-sends turn 0's whole context, of which the server computed only the prompt (the
    primer's one token is sampled, never fed back): it hits turn 0's prompt in whole 128-token
    blocks (2944 of 3000), not the 3072 of turn 0's full 3100-token context, even with outputs
    re-sent as generated. Two lanes: the replay starts one of them at turn 1."""
    r0 = RequestSpec(rid=0, parent=None, prefix_tokens=0, new_tokens=3000, output_tokens=100)
    r1 = RequestSpec(rid=1, parent=0, prefix_tokens=3100, new_tokens=300, output_tokens=3,
                     after=(0,), delay_s=0.5)
    chain = SessionGraph(session_id="s", requests=(r0, r1))
    replay = ReplaySpec(concurrency=4, primer=True, warmup_requests_per_lane=0, window_s=2.0)
    out = simulate_colocated([chain], replay, _profile(), seed=0, reuse_outputs=True)
    primed = {r.session_key for r in out.records if r.phase == "primer"}
    assert primed
    for key in primed:
        first = next(r for r in out.records if r.session_key == key and r.phase != "primer")
        assert first.rid == 1 and first.cached_tokens == 2944
    # a turn 1 after its turn 0 ran in full hits the output too
    full = [r for r in out.records if r.rid == 1 and r.session_key not in primed]
    assert full and all(r.cached_tokens == 3072 for r in full)
