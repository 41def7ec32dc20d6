"""Fleet configuration: rack groups, decode instances per rack, the global router, and every
way a fleet can be wrong, refused before anything runs with a message naming the field."""

from __future__ import annotations

import pytest

from rackSim.config import ConfigError, compose_scenario
from rackSim.config.specs import fits_domains


def test_reference_is_one_rack_of_one_layout():
    cfg = compose_scenario([])
    d = cfg.deployment
    (group,) = d.rack_groups
    assert (group.racks, group.decode.instances) == (1, 1)
    assert d.num_racks == 1
    assert d.num_gpus == 8 * 2 + 32  # P8xDEP2 + DEP32, as before fleets existed


def test_racks_multiply_the_layout():
    d = compose_scenario(["deployment=fleet_two_decode", "deployment.racks=14"]).deployment
    assert d.num_racks == 14
    assert d.num_gpus == 14 * (8 * 2 + 2 * 16)


def test_groups_inherit_what_they_leave_out():
    d = compose_scenario(["deployment=fleet_mixed"]).deployment
    dep32, two = d.rack_groups
    assert (dep32.racks, dep32.decode.instances, dep32.decode.gpus) == (10, 1, 32)
    assert (two.racks, two.decode.instances, two.decode.gpus) == (4, 2, 16)
    # a partial decode keeps the deployment's other decode keys
    assert two.decode.speculative == d.decode.speculative
    assert two.decode.max_num_seqs_per_rank == d.decode.max_num_seqs_per_rank
    assert two.prefill == d.prefill
    assert d.num_racks == 14 and d.num_gpus == 10 * 48 + 4 * 48


def test_group_config_carries_the_group_layout():
    cfg = compose_scenario(["deployment=fleet_mixed"])
    two = cfg.deployment.rack_groups[1]
    sub = cfg.for_group(two)
    assert sub.deployment.decode.gpus == 16 and sub.deployment.decode.instances == 2
    assert sub.deployment.num_racks == 1


@pytest.mark.parametrize("widths, domain, domains, fits", [
    ([32, 16, 2, 2], 72, 1, True),
    ([24, 24, 24], 36, 2, False),      # 72 GPUs, but a third 24-wide instance splits a domain
    ([32, 32, 4, 2, 2], 36, 2, True),
    ([8, 8], 8, 2, True),
    ([8, 8, 2], 8, 2, False),
])
def test_instances_pack_into_domains(widths, domain, domains, fits):
    assert fits_domains(widths, domain, domains) is fits


@pytest.mark.parametrize("overrides, expect", [
    # a group's layout does not fit its rack
    (["deployment=fleet_mixed",
      "deployment.groups=[{name:a,racks:2,decode:{instances:3,gpus:32}}]"],
     ["deployment.groups[0].prefill/decode", "100 GPUs", "gpus_per_rack=72"]),
    # an instance wider than an NVLink domain
    (["hardware.nvlink_domain_gpus=36", "deployment.decode.gpus=48"],
     ["deployment.decode.gpus=48", "NVLink domains", "36 GPUs per domain"]),
    # instances that fit the rack's GPU count but not its domains
    (["hardware.nvlink_domain_gpus=36", "deployment.prefill.instances=1",
      "deployment.prefill.gpus_per_instance=24", "deployment.decode.instances=2",
      "deployment.decode.gpus=24"],
     ["deployment.prefill/decode", "2 NVLink domains of 36", "without splitting"]),
    (["hardware.nvlink_domain_gpus=7"], ["nvlink_domain_gpus=7", "gpus_per_rack=72"]),
    # the router names a rack group the fleet does not have
    (["deployment=fleet_mixed", "deployment.fleet_router.entry_groups=[dep32,nope]"],
     ["deployment: fleet_router.entry_groups", "'nope'", "dep32", "two_dep16"]),
    (["deployment.fleet_router.entry_groups=[nope]"],
     ["deployment: fleet_router.entry_groups", "add `groups`"]),
    (["deployment=fleet_split_pd", "deployment.fleet_router.entry_groups=[decode]"],
     ["deployment: fleet_router.entry_groups", "no session could start"]),
    (["deployment.fleet_router.policy=random"], ["deployment.fleet_router.policy"]),
    (["deployment.fleet_router.spill_tokens_per_gpu=-1"],
     ["deployment.fleet_router.spill_tokens_per_gpu"]),
    # racks that contradict the groups, repeated names, a fleet without decode
    (["deployment=fleet_mixed", "deployment.racks=3"], ["deployment: racks=3", "14 racks"]),
    (["deployment=fleet_mixed",
      "deployment.groups=[{name:a,racks:1},{name:a,racks:2}]"],
     ["deployment: groups", "['a']", "repeat"]),
    (["deployment=fleet_mixed", "deployment.groups=[{name:a,racks:2,decode:{instances:0}}]"],
     ["deployment: decode.instances", "no decode instance"]),
    (["deployment.decode.instances=-1"], ["deployment.decode.instances"]),
    # KV between racks needs the scale-out network described
    (["deployment.racks=2", "hardware.nic_latency_us=null"],
     ["hardware.nic_bw_bytes_s / hardware.nic_latency_us", "2 racks"]),
    (["+deployment.groups=[{name:a,racks:1,cores:4}]"], ["deployment.groups[0].cores",
                                                         "unknown key"]),
])
def test_bad_fleets_name_the_field(overrides, expect):
    with pytest.raises(ConfigError) as err:
        compose_scenario(["experiment=smoke", *overrides])
    msg = str(err.value)
    for part in expect:
        assert part in msg, msg
