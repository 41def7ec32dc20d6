"""Hardware as data: every GPU system of scenarios/hardware/ validates, and bad ones are refused
naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from rackSim.config import ConfigError, compose_scenario
from rackSim.config.specs import HardwareSpec

HARDWARE = Path(__file__).resolve().parents[2] / "scenarios" / "hardware"
SYSTEMS = ("h200_hgx", "b200_hgx", "b300_hgx", "gb200_nvl72", "gb300_nvl72")


def _spec(name: str) -> dict:
    return yaml.safe_load((HARDWARE / f"{name}.yaml").read_text())


@pytest.mark.parametrize("name", SYSTEMS)
def test_every_system_validates_and_names_its_tables(name: str) -> None:
    hw = HardwareSpec(**_spec(name))
    assert hw.kernel_tables, "each system names the kernel tables that describe it"
    assert hw.nic_bw_bytes_s in (50e9, 100e9)  # ConnectX-7 or ConnectX-8
    # an NVLink domain: 8 GPUs per HGX node, 72 per NVL72 rack (hardware.md fleet table)
    assert hw.gpus_per_rack == (72 if "nvl72" in name else 8)


def test_h200_has_no_fp4_and_figures_match_hardware_md() -> None:
    hw = HardwareSpec(**_spec("h200_hgx"))
    assert "fp4" not in hw.flops
    assert hw.flops["fp8"] == pytest.approx(1.98e15)
    assert hw.hbm_bw_bytes_s == pytest.approx(4.8e12)
    assert hw.nvlink_bw_bytes_s == pytest.approx(450e9)


@pytest.mark.parametrize("change, expect", [
    ({"flops": {"fp4": 1e15, "bf16": 1e15, "int3": 1e15}}, ["flops", "int3"]),
    ({"flops": {"fp8": 1e15}}, ["flops", "bf16"]),
    ({"nic_bw_bytes_s": 0}, ["nic_bw_bytes_s"]),
])
def test_bad_hardware_is_refused_naming_the_field(change: dict, expect: list[str]) -> None:
    with pytest.raises(ValidationError) as err:
        HardwareSpec(**{**_spec("b200_hgx"), **change})
    for word in expect:
        assert word in str(err.value)


def test_a_dtype_the_gpu_lacks_is_refused_before_running() -> None:
    with pytest.raises(ConfigError, match=r"perf.weight_dtype 'fp4' not in hardware.flops .* "
                                          r"no fp4 tensor cores\); set perf.weight_dtype"):
        compose_scenario(["experiment=smoke", "hardware=h200_hgx"])
