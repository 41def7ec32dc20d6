"""KV between racks: priced on the scale-out NICs (never NVLink), against hand calculations,
with contention on the NICs of each end, in the channel and in a whole simulated fleet."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import simpy

from rackSim.config import compose_scenario, with_changes
from rackSim.engine.kv_transfer import KvTransferChannel, LinkEnd
from rackSim.engine.simulation import Simulation
from rackSim.perf.kv_transfer import decode_stall_ms, pull_transfer_ms, scaleout_bandwidth_bytes_s
from rackSim.workload.sources import load_sessions

GB = 1e9


def test_scaleout_bandwidth_is_the_narrower_ends_nics():
    # a DEP2 prefill instance (2 NICs of 100 GB/s) to one DEP rank (1 NIC), 80% of line rate
    assert scaleout_bandwidth_bytes_s(100 * GB, 2, 1, 0.8) == pytest.approx(80 * GB)
    assert scaleout_bandwidth_bytes_s(50 * GB, 8, 4, 0.5) == pytest.approx(100 * GB)


def test_remote_pull_adds_a_network_round_trip_per_descriptor():
    # one rank reads 10 local blocks and 4 remote blocks of 43 layers
    local = pull_transfer_ms(10, 43, 1e6, 720 * GB, 1.8e-3, 4e-3, 4, 16)
    # a 20 us network: remote descriptors complete 1.8 + 2 x 20 = 41.8 us after posting; with
    # 16 in flight that is 2.6125 us each, slower than posting (4 us / 4 threads = 1 us) and
    # than the bytes; 4 blocks x 43 layers = 172 descriptors, plus the last one's latency
    remote = pull_transfer_ms(4, 43, 4e5, 80 * GB, 1.8e-3 + 2 * 20e-3, 4e-3, 4, 16)
    assert remote == pytest.approx(41.8e-3 + 172 * 41.8e-3 / 16)
    stall = decode_stall_ms([(10, 1e6, 4, 4e5), (3, 1e5)], 43, 720 * GB, 1.8e-3, 4e-3, 4, 16,
                            80 * GB, 20e-3)
    assert stall == pytest.approx(local + remote)  # the slowest rank posts both in turn


def _job(src: int, dst: int, remote: bool) -> SimpleNamespace:
    rec = SimpleNamespace(prefill_instance=src, kv_bytes_moved=0.0)
    return SimpleNamespace(rec=rec, rank_id=dst, remote=remote)


def test_channel_prices_cross_rack_pushes_on_nics_and_queues_them():
    env = simpy.Environment()
    spec = compose_scenario([]).deployment.kv_transfer  # push, 0.2 ms setup, 80% efficiency
    landed: dict[int, float] = {}
    # two prefill instances of 2 GPUs in rack 0 and one in rack 1; two decode ranks in rack 1
    prefills = [LinkEnd(0, 2, 1440 * GB), LinkEnd(0, 2, 1440 * GB), LinkEnd(1, 2, 1440 * GB)]
    ranks = [LinkEnd(1, 1, 720 * GB), LinkEnd(1, 1, 720 * GB)]
    ch = KvTransferChannel(env, spec, 43, prefills, ranks, 100 * GB, 5e-3,
                           deliver=lambda j: landed.__setitem__(id(j), env.now))
    nbytes = 1.6 * GB
    a, b = _job(0, 0, True), _job(1, 0, True)    # two cross-rack pushes into rank 0's NIC
    c = _job(2, 0, False)                         # a local push into rank 0's NVLink link
    for job in (a, b, c):
        ch.send(job, nbytes)
    env.run()
    # by hand: 0.8 x 100 GB/s x min(2, 1) NICs = 80 GB/s; 1.6 GB take 20 ms, plus the 0.2 ms
    # setup and the 5 us network latency
    one = (0.2 + 0.005 + 20.0) / 1e3
    assert landed[id(a)] == pytest.approx(one, rel=1e-12)
    assert landed[id(b)] == pytest.approx(2 * one, rel=1e-12)  # queued behind a on the NIC
    # the local push uses NVLink (0.8 x 900 GB/s = 720 GB/s per rank) and does not wait
    assert landed[id(c)] == pytest.approx((0.2 + 1.6 / 720 * 1e3) / 1e3, rel=1e-12)
    assert ch.bytes_cross_rack == pytest.approx(2 * nbytes)
    assert ch.bytes_moved == pytest.approx(3 * nbytes)


def test_a_fleet_prices_each_cross_rack_push_on_the_scaleout_link():
    """Prefill in one rack, decode in another: a lone client, so no transfer waits; each
    request's KV lands exactly setup + network latency + bytes / NIC bandwidth after its
    prefill ends (bandwidth by hand: 0.8 x 100 GB/s x min(2 prefill GPUs, 1 GPU per rank))."""
    base = compose_scenario(["experiment=smoke", "deployment=fleet_split_pd", "progress=false"])
    cfg = with_changes(base, deployment={"groups": [
        {"name": "p", "racks": 1, "prefill": {"instances": 1}, "decode": {"instances": 0}},
        {"name": "d", "racks": 1, "prefill": {"instances": 0}, "decode": {"instances": 1}}]},
        workload={"num_sessions": 2, "replay": {"concurrency": 1, "window_s": 30.0,
                                                "warmup_requests_per_lane": 0}})
    sim = Simulation(cfg, load_sessions(cfg.workload, cfg.seed))
    out = sim.run(progress=False)
    moved = [r for r in out.requests if r.phase != "primer" and r.kv_bytes_moved > 0]
    assert len(moved) > 5
    for r in moved:
        assert (r.prefill_rack, r.decode_rack) == (0, 1)
        want_ms = 0.2 + 5e-3 + r.kv_bytes_moved / 80e9 * 1e3
        assert (r.kv_ready_s - r.prefill_end_s) * 1e3 == pytest.approx(want_ms, rel=1e-9)
    assert out.kv_bytes_cross_rack == pytest.approx(sum(r.kv_bytes_moved for r in moved))
