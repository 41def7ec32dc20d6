"""All-to-all, all-reduce, admission and straggler formulas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackSim.perf.comm import (
    COMBINE_BYTES,
    DISPATCH_BYTES,
    allreduce_hops,
    allreduce_ms,
    alltoall_layer_ms,
)
from rackSim.perf.cpu import StragglerModel, admission_ms, max_delay_moments


def test_allreduce_hops_hand() -> None:
    assert allreduce_hops("ring", 32) == 62
    assert allreduce_hops("recursive_doubling", 32) == 5
    assert allreduce_hops("recursive_doubling", 33) == 6
    assert allreduce_hops("ring", 1) == 0
    with pytest.raises(ValueError):
        allreduce_hops("tree", 4)


def test_allreduce_ms_hand() -> None:
    assert allreduce_ms("ring", 4, 0.5, 0.1) == pytest.approx(0.5 + 6 * 0.1)
    assert allreduce_ms("recursive_doubling", 4, 0.5, 0.1) == pytest.approx(0.5 + 2 * 0.1)
    assert allreduce_ms("ring", 1, 0.5, 0.1) == 0.0


@given(n=st.integers(2, 512))
def test_ring_latency_grows_faster_than_recursive_doubling(n: int) -> None:
    assert allreduce_ms("ring", n, 0.1, 0.1) >= allreduce_ms("recursive_doubling", n, 0.1, 0.1)
    assert allreduce_ms("ring", n + 1, 0.1, 0.1) > allreduce_ms("ring", n, 0.1, 0.1)


def test_alltoall_hand() -> None:
    # 1000 copies x 4096 x 3.03125 B x 3/4 remote over 900e6 B/ms + 2 ops of 0.01 ms
    want = 2 * 0.01 + 1000 * 4096 * (DISPATCH_BYTES + COMBINE_BYTES) * 0.75 / 900e6
    assert alltoall_layer_ms(1000, 4096, 4, 0.01, 900e6) == pytest.approx(want)
    assert alltoall_layer_ms(1000, 4096, 1, 0.01, 900e6) == 0.0


def test_admission_hand() -> None:
    assert admission_ms(855_000, 45.38) == pytest.approx(855_000 * 45.38e-6)
    assert admission_ms(0, 45.0) == 0.0


def test_max_delay_is_harmonic_for_exponential_jitter() -> None:
    # E[max of n Exp(mu)] = mu * H_n; Var = mu^2 * sum 1/k^2.
    for n in (2, 4, 32):
        mean, var = max_delay_moments(n, 0.02)
        assert mean == pytest.approx(0.02 * sum(1 / k for k in range(1, n + 1)), rel=1e-4)
        assert var == pytest.approx(0.02 ** 2 * sum(1 / k ** 2 for k in range(1, n + 1)),
                                    rel=1e-3)


def test_lagged_rank_hand() -> None:
    # Two ranks, one lagged by L: E[max(X, L + Y)] = L + mu + mu/2 * exp(-L/mu).
    mu, lag = 0.01, 0.02
    mean, _ = max_delay_moments(2, mu, lag, lagged=1)
    assert mean == pytest.approx(lag + mu + mu / 2 * 2.718281828 ** (-lag / mu), rel=1e-4)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 127), jitter=st.floats(0.001, 1.0), lag=st.floats(0.0, 2.0))
def test_more_ranks_larger_expected_straggler_delay(n: int, jitter: float, lag: float) -> None:
    def expected(model: StragglerModel) -> float:  # what a step draws its delay around
        return model.draw()[0]

    a = StragglerModel(ranks=n, jitter_ms=jitter, sync_points=43)
    b = StragglerModel(ranks=n + 1, jitter_ms=jitter, sync_points=43)
    assert expected(b) > expected(a)
    # With a lagged rank the increase can be below float resolution when the lag dwarfs the
    # jitter (the other ranks almost never arrive last), so only non-decrease is asserted.
    la = StragglerModel(ranks=n, jitter_ms=jitter, sync_points=43, lag_ms=lag, lagged=1)
    lb = StragglerModel(ranks=n + 1, jitter_ms=jitter, sync_points=43, lag_ms=lag, lagged=1)
    assert expected(lb) >= expected(la) * (1 - 1e-6)
    assert expected(la) >= expected(a) * (1 - 1e-6)


def test_straggler_samples_deterministic_and_centred() -> None:
    a = StragglerModel(ranks=32, jitter_ms=0.01, sync_points=43, seed=3)
    b = StragglerModel(ranks=32, jitter_ms=0.01, sync_points=43, seed=3)
    xs = [a.draw()[1] for _ in range(4000)]
    assert xs[:50] == [b.draw()[1] for _ in range(50)]
    assert sum(xs) / len(xs) == pytest.approx(a.draw()[0], rel=0.02)  # centred on the mean
    assert min(xs) >= 0.0
