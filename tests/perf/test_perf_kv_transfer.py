"""KV transfer: one packed region (push) vs per-(block, layer) descriptors read synchronously
(pull), against hand calculations."""

from __future__ import annotations

import pytest

from rackSim.perf.kv_transfer import (
    decode_stall_ms,
    kv_blocks,
    pull_transfer_ms,
    push_transfer_ms,
)

# The reference scenario's pull constants (scenarios/deployment/agentx_p8_dep32.yaml), in ms.
LAT, POST, THREADS, IN_FLIGHT = 1.8e-3, 4.0e-3, 4, 16
LAYERS, BW = 43, 720e9


def _pull(blocks: int, nbytes: float, **kw: float) -> float:
    args = dict(layers=LAYERS, bandwidth_bytes_s=BW, descriptor_latency_ms=LAT,
                descriptor_post_ms=POST, post_threads=THREADS, descriptors_in_flight=IN_FLIGHT)
    args.update(kw)
    return pull_transfer_ms(blocks, nbytes=nbytes, **args)


def test_kv_blocks_counts_a_partial_last_block() -> None:
    assert [kv_blocks(t) for t in (0, 1, 64, 65, 40_000)] == [0, 1, 1, 2, 625]


def test_push_is_one_region() -> None:
    # 20K tokens x 890 B = 17.8 MB at 720 GB/s + one 0.2 ms setup
    assert push_transfer_ms(17.8e6, 720e9, 0.2) == pytest.approx(0.2 + 17.8e6 / 720e9 * 1e3)
    assert push_transfer_ms(0.0, 720e9, 0.2) == 0.0


def test_pull_of_a_40k_context_is_bound_by_posting_descriptors() -> None:
    # 40K tokens = 625 blocks x 43 layers = 26,875 descriptors of ~1.3 KB. Posting: 4 us on 4
    # threads = 1 us each; completion pace 1.8 us / 16 in flight = 0.11 us; bytes 35.6 MB /
    # 720 GB/s = 0.049 ms. Posting wins: 26.875 ms + one trailing 1.8 us latency.
    nbytes = 40_000 * 890.0
    assert _pull(625, nbytes) == pytest.approx(1.8e-3 + 26_875 * 1.0e-3)
    # the old charge (one latency + bytes over the link) was ~0.25 ms: 100x too cheap
    assert _pull(625, nbytes) > 100 * push_transfer_ms(nbytes, BW, 0.2)


def test_pull_is_latency_bound_with_one_descriptor_in_flight() -> None:
    # 10 blocks x 43 = 430 descriptors, one at a time: 1.8 us each, plus the trailing one
    assert _pull(10, 1e3, descriptors_in_flight=1) == pytest.approx(1.8e-3 + 430 * 1.8e-3)


def test_pull_is_bandwidth_bound_when_descriptors_are_large() -> None:
    # one 1 GB descriptor at 100 GB/s: 10 ms of bytes dominate
    assert _pull(1, 1e9, layers=1, bandwidth_bytes_s=1e11) == pytest.approx(1.8e-3 + 10.0)


def test_nothing_to_read_costs_nothing() -> None:
    assert _pull(0, 0.0) == 0.0
    assert decode_stall_ms([], LAYERS, BW, LAT, POST, THREADS, IN_FLIGHT) == 0.0


def test_decode_stall_is_the_slowest_rank_and_a_ranks_reads_add_up() -> None:
    args = (LAYERS, BW, LAT, POST, THREADS, IN_FLIGHT)
    # rank 0 admits two requests of 5 blocks (posted one after the other: 10 blocks, one
    # trailing latency), rank 1 one request of 4 blocks; every rank waits for rank 0.
    stall = decode_stall_ms([(5 + 5, 2e5), (4, 1e5)], *args)
    assert stall == pytest.approx(_pull(10, 2e5))
    assert stall == pytest.approx(2 * _pull(5, 1e5) - LAT)
    # the same reads spread over two ranks run in parallel: half the stall, plus a latency
    assert decode_stall_ms([(5, 1e5), (5, 1e5)], *args) == pytest.approx(_pull(5, 1e5))
