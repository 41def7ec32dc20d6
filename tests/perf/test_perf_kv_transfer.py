"""KV transfer: push vs pull, contention."""

from __future__ import annotations

import pytest

from rackSim.perf.kv_transfer import (
    decode_stall_ms,
    kv_transfer_ms,
    pull_transfer_ms,
    push_transfer_ms,
    transfer_ms,
)


def test_kv_transfer_ms_keeps_its_signature() -> None:
    assert kv_transfer_ms(1e9, 1e11, 0.2) == pytest.approx(0.2 + 10.0)
    assert kv_transfer_ms(0, 1e11, 0.2) == 0.0


def test_push_is_one_region() -> None:
    # 20K tokens x 890 B = 17.8 MB at 720 GB/s + one 0.2 ms setup
    assert push_transfer_ms(17.8e6, 720e9, 0.2) == pytest.approx(0.2 + 17.8e6 / 720e9 * 1e3)


def test_pull_pays_latency_per_block() -> None:
    # 20_000 tokens = 313 blocks of 64
    want = 313 * 0.2 + 17.8e6 / 720e9 * 1e3
    assert pull_transfer_ms(17.8e6, 20_000, 720e9, 0.2) == pytest.approx(want)
    assert transfer_ms("pull", 17.8e6, 20_000, 720e9, 0.2) > transfer_ms(
        "push", 17.8e6, 20_000, 720e9, 0.2)


def test_contention_shares_bandwidth() -> None:
    one = push_transfer_ms(1e9, 1e11, 0.0)
    four = push_transfer_ms(1e9, 1e11, 0.0, concurrent=4)
    assert four == pytest.approx(4 * one)


def test_only_pull_stalls_decode() -> None:
    assert decode_stall_ms("push", 1e8, 1000, 1e11, 0.2) == 0.0
    assert decode_stall_ms("pull", 1e8, 1000, 1e11, 0.2) == pytest.approx(16 * 0.2 + 1.0)
    with pytest.raises(ValueError):
        transfer_ms("teleport", 1.0, 1, 1.0, 0.0)
