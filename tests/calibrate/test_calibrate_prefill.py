"""racksim-calibrate prefill: step grid, table interpolation, the table on a small grid, CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rackSim.calibrate import aic
from rackSim.calibrate.command import main
from rackSim.calibrate.prefill import (
    COLUMNS,
    Chunk,
    Interp,
    KernelTables,
    model_step,
    prefill_table,
    steady_balancedness,
    step_chunks,
)
from rackSim.calibrate.scenario import DEFAULT_PROFILE, operating_point
from rackSim.perf.calibrated import CalibratedStepModel
from rackSim.perf.profile import Profile

PROFILE = Profile.load(DEFAULT_PROFILE)
needs_aic = pytest.mark.skipif(aic.aic_root() is None,
                               reason="aiconfigurator-core not installed (optional extra 'aic')")


def test_steps_fill_the_budget_or_chunk_a_long_request() -> None:
    assert step_chunks(4096, 1024, 16384) == [Chunk(16, 1024, 4096, True)]
    assert step_chunks(4096, 5000, 16384) == [Chunk(3, 5000, 4096, True)]
    assert step_chunks(4096, 32768, 16384) == [Chunk(1, 16384, 4096, True),
                                               Chunk(1, 16384, 20480, False)]
    assert step_chunks(0, 20000, 16384) == [Chunk(1, 16384, 0, True),
                                            Chunk(1, 3616, 16384, False)]


def test_interpolation_hand() -> None:
    """Exact points, linear between points, proportional above the last count, linear below
    the first; an outer value missing an inner point is bracketed among its own points."""
    df = pd.DataFrame({"n": [1, 1, 1, 3, 3], "m": [10, 20, 40, 10, 20],
                       "latency": [1.0, 2.0, 3.0, 5.0, 9.0]})
    f = Interp(df, ["n", "m"])
    assert f(1, 20) == pytest.approx(2.0)
    assert f(1, 30) == pytest.approx(2.5)
    assert f(1, 80) == pytest.approx(6.0)          # 3.0 x 80 / 40
    assert f(1, 5) == pytest.approx(0.5)           # 1.0 - 1.0 x 5 / 10
    assert f(2, 20) == pytest.approx((2.0 + 9.0) / 2)
    assert f(3, 40) == pytest.approx(18.0)         # n = 3 stops at m = 20: 9.0 x 2
    assert f(2, 40) == pytest.approx((3.0 + 18.0) / 2)
    assert f(1, 0) == 0.0                          # never negative


def test_table_on_a_small_grid_without_aic() -> None:
    df, why = prefill_table(PROFILE, [2], [4096], [1024, 32768], use_aic=False)
    assert list(df.new) == [1024, 32768] and list(df.steps) == [1, 2]
    assert df.tables_tok_s_gpu.isna().all() and df.aic_tok_s_gpu.isna().all() and why
    cfg = operating_point(prefill_gpus=2)
    b = steady_balancedness(PROFILE, 2, "gb300_nvl72")
    model = CalibratedStepModel(cfg, "prefill", profile=PROFILE, balancedness=(b, 1.0))
    one = model_step(model, Chunk(16, 1024, 4096, True), 2)
    assert df.model_tok_s_gpu.iloc[0] == pytest.approx(16384 / one["step_ms"] * 1e3, rel=1e-9)
    parts = ["moe", "attention", "indexer", "dense", "comm", "draft", "cpu", "sync",
             "straggler", "kv_stall"]
    assert df[parts].sum(axis=1).to_numpy() == pytest.approx(df.step_ms.to_numpy())
    # a 32K request takes two 16K steps, the second attending 16K more context
    two = [model_step(model, c, 2)["step_ms"] for c in step_chunks(4096, 32768, 16384)]
    assert two[1] > two[0]
    assert df.model_tok_s_gpu.iloc[1] == pytest.approx(32768 / sum(two) * 1e3, rel=1e-9)


@needs_aic
def test_table_lookups_return_the_measured_rows() -> None:
    root = aic.aic_root()
    assert root is not None
    t = KernelTables(root)
    rows = aic.load_gemm_rows(root, "fp8")
    r = rows[(rows.n == 4096) & (rows.k == 8192) & (rows.m == 16384)].iloc[0]
    assert t.gemm["fp8"](4096, 8192, 16384) == pytest.approx(r.latency)
    mhc = aic.load_mhc_rows(root)
    r = mhc[(mhc.hidden_size == 4096) & (mhc.num_tokens == 16384)].iloc[0]
    assert t.mhc(4096, 16384) == pytest.approx(r.latency)


@needs_aic
def test_table_on_a_small_grid_with_aic() -> None:
    """All three prices exist and agree within a factor of two (they price the same step)."""
    df, why = prefill_table(PROFILE, [2, 4], [16384], [4096])
    assert why == ""
    for col in ("model_tok_s_gpu", "tables_tok_s_gpu", "aic_tok_s_gpu"):
        assert np.isfinite(df[col]).all() and (df[col] > 0).all(), col
    ratio = df.tables_tok_s_gpu / df.model_tok_s_gpu
    assert ((ratio > 0.5) & (ratio < 2.0)).all()
    ratio = df.aic_tok_s_gpu / df.model_tok_s_gpu
    assert ((ratio > 0.5) & (ratio < 2.0)).all()


def test_cli_prints_and_writes_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prefill.csv"
    assert main(["prefill", "--widths", "2", "--cached", "4096", "--new", "16384", "--no-aic",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "model_tok_s_gpu" in text and "missing columns" in text
    df = pd.read_csv(out)
    assert set(COLUMNS) <= set(df.columns) and len(df) == 1


def test_cli_prices_the_model_of_a_generated_profile(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    """The kernel-table and aiconfigurator columns price DeepSeek-V4-Flash's layers: for
    another model's profile they are left out, saying why, and the model column prices that
    model (its 8-GPU instance beside the 2-GPU decode instance that fits the rack)."""
    assert main(["prefill", "--profile", "calibration/gb200_nvl72__deepseek_v3.yaml",
                 "--widths", "8", "--cached", "0", "--new", "2000"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("prefill throughput per GPU (uncached tokens/s) of deepseek_v3 on "
                          "gb200_nvl72")
    assert ("missing columns: the kernel-table and aiconfigurator columns price "
            "deepseek-ai/DeepSeek-V4-Flash's layers, not deepseek_v3's") in out
    df, why = prefill_table(Profile.load("calibration/gb200_nvl72__deepseek_v3.yaml"), [8],
                            [0], [2000], "gb200_nvl72", True, "deepseek_v3")
    assert df["tables_tok_s_gpu"].isna().all() and df["aic_tok_s_gpu"].isna().all()
    assert (df["model_tok_s_gpu"] > 0).all() and "not deepseek_v3's" in why


def test_cli_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["prefill", "--help"])
    assert "default: 2,4" in capsys.readouterr().out


@pytest.mark.parametrize("flag, value, says", [
    ("--widths", "abc", "'abc' is not a whole number"),  # was a ValueError traceback
    ("--new", "0", "0 must be above 0"),                 # was a ZeroDivisionError traceback
    ("--cached", "-5", "-5 must be at least 0"),         # was a table of a negative prefix
    ("--hardware", "tpu", "invalid choice: 'tpu'"),
])
def test_cli_refuses_values_that_are_not_a_grid(flag, value, says,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["prefill", "--no-aic", flag, value])
    assert ex.value.code == 2 and f"argument {flag}: {says}" in capsys.readouterr().err


def test_cli_prices_steps_with_dual_batch_overlap(capsys: pytest.CaptureFixture[str]) -> None:
    """`--dbo`: the steps as two microbatches. At the SGLang GB200 operating point the
    all-to-all (a third of the step) hides behind the other microbatch's compute: faster,
    and exposed communication under a fifth of what it was. The reference profile's fused
    MegaMoE kernel has none to hide: exit 2, naming the key."""
    v3 = Profile.load("calibration/gb200_nvl72__deepseek_v3.yaml")
    (off, _), (on, _) = (prefill_table(v3, [8], [0], [2000], "gb200_nvl72", False,
                                       "deepseek_v3", dbo) for dbo in (False, True))
    assert on["model_tok_s_gpu"][0] > 1.1 * off["model_tok_s_gpu"][0]
    assert on["comm"][0] < 0.2 * off["comm"][0]
    assert main(["prefill", "--dbo", "--no-aic", "--widths", "2", "--cached", "0",
                 "--new", "2000"]) == 2
    assert "deployment.prefill.dbo.enabled: profile 'gb300__deepseek_v4_1_flash'" in \
        capsys.readouterr().err
