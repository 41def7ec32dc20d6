"""racksim-calibrate: explain experiment, fit stages, missing optional dependency."""

from __future__ import annotations

import pytest

from rackSim.calibrate import aic, fit
from rackSim.calibrate.command import main
from rackSim.calibrate.explain import breakdown_table
from rackSim.calibrate.scenario import DEFAULT_PROFILE
from rackSim.perf.profile import Profile


def test_explain_prints_every_width_and_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--explain", "--widths", "4,16", "--requests-per-rank", "32",
                 "--context", "65536"]) == 0
    out = capsys.readouterr().out
    assert "32 requests/rank" in out and "65536 context" in out
    assert out.count("recursive_doubling") == 4 and out.count(" ring ") == 4


@pytest.mark.parametrize("argv, prog", [
    (["--explain", "--widths", "8"], "racksim-calibrate"),
    (["prefill", "--no-aic"], "racksim-calibrate prefill"),
])
def test_a_profile_flag_that_is_not_a_profile_ends_in_one_line(argv, prog, tmp_path, capsys):
    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\n")
    assert main([*argv, "--profile", str(bad)]) == 3  # the calibration profile class
    err = capsys.readouterr().err
    assert err == (f"{prog}: --profile {bad}: no 'params' field, so this is not a calibration "
                   "profile; point --profile at a file `racksim-calibrate` wrote "
                   "(calibration/*.yaml)\n")



@pytest.mark.parametrize("flag, value, expect", [
    ("--requests-per-rank", "-3", "argument --requests-per-rank: -3 must be above 0"),
    ("--context", "0", "argument --context: 0 must be above 0"),
    ("--widths", "abc", "argument --widths: 'abc' is not a whole number"),
    ("--widths", "4,,8", "argument --widths: '4,,8': an empty item"),
    ("--widths", "8,0", "argument --widths: 0 must be above 0"),
    ("--hardware", "tpu", "argument --hardware: invalid choice: 'tpu' (choose from 'b200_hgx'"),
])
def test_explain_flags_out_of_range_are_usage_errors(flag, value, expect, capsys):
    """Before: a negative request count printed negative throughputs (exit 0), a width or
    hardware name that is not one ended in a traceback."""
    with pytest.raises(SystemExit) as ex:
        main(["--explain", flag, value])
    assert ex.value.code == 2
    captured = capsys.readouterr()
    assert expect in captured.err and captured.out == ""


def test_explain_prices_the_model_and_gpu_its_profile_was_fitted_for(capsys):
    """A generated model's profile priced DeepSeek-V4.1-Flash's layers (a ProfileError
    traceback: the profile has no V4 attention constants)."""
    assert main(["--explain", "--profile", "calibration/gb200_nvl72__deepseek_v3.yaml",
                 "--widths", "8,64", "--requests-per-rank", "16", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("decode step breakdown (ms) of deepseek_v3 on gb200_nvl72, ")
    assert out.count("recursive_doubling") == 4
    # the same profile on another GPU, when asked
    assert main(["--explain", "--profile", "calibration/gb200_nvl72__deepseek_v3.yaml",
                 "--hardware", "gb300_nvl72", "--widths", "8"]) == 0
    assert "of deepseek_v3 on gb300_nvl72" in capsys.readouterr().out


def test_headline_with_another_models_profile_names_the_flag(capsys):
    """It ended in a ProfileError traceback (the V4 attention constants are missing)."""
    qwen = "calibration/h200_hgx__qwen3_235b_a22b.yaml"
    assert main(["headline", "--profile", qwen]) == 3
    assert capsys.readouterr().err.startswith(
        f"racksim-calibrate headline: --profile {qwen}: profile 'h200_hgx__qwen3_235b_a22b' "
        "was fitted for model qwen3_235b_a22b on H200-HGX, not for DeepSeek-V4.1-Flash; ")


def test_explain_by_default_takes_the_widths_one_nvlink_domain_holds(capsys):
    """An 8-GPU HGX node holds DEP4 and DEP8 (the default's 16-64 were refused, ending the
    command); DEP8 fills the node, its neighbour instance goes to a second domain."""
    assert main(["--explain", "--profile", "calibration/h200_hgx__qwen3_235b_a22b.yaml",
                 "--requests-per-rank", "16", "--context", "8192"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert sorted({int(r.split()[0]) for r in rows}) == [4, 8]


def test_explain_with_dual_batch_overlap(capsys):
    """`--dbo`: DeepSeek-V3's DEP16 decode at 64 requests a rank splits (256 tokens a rank,
    threshold 32): the all-to-all hides behind the other microbatch (`comm` 0 to rounding),
    the MoE grows (its weights read once per microbatch). The reference's MegaMoE profile:
    exit 2."""
    v3 = Profile.load("calibration/gb200_nvl72__deepseek_v3.yaml")
    off, on = (breakdown_table(v3, [16], 64, 4000, "gb200_nvl72", model="deepseek_v3", dbo=d)
               for d in (False, True))
    assert (on["comm"] < 1e-9).all() and (off["comm"] > 5).all()
    assert (on["moe"] > off["moe"]).all()
    assert main(["--explain", "--profile", "calibration/gb200_nvl72__deepseek_v3.yaml",
                 "--widths", "16", "--dbo"]) == 0
    assert ", dual-batch overlap" in capsys.readouterr().out.splitlines()[0]
    assert main(["--explain", "--widths", "8", "--dbo"]) == 2
    assert "deployment.decode.dbo.enabled: profile 'gb300__deepseek_v4_1_flash'" in \
        capsys.readouterr().err


def test_explain_width_that_does_not_fit_the_rack_names_it(capsys):
    assert main(["--explain", "--widths", "128"]) == 2
    err = capsys.readouterr().err
    assert "1 decode x 128" in err and "hardware.gpus_per_rack=72" in err

def test_explain_table_tells_the_story() -> None:
    df = breakdown_table(Profile.load(DEFAULT_PROFILE), [4, 8, 16, 32, 64], 64, 131072)
    assert len(df) == 5 * 2 * 2
    on_rd = df[(df.eplb == "on") & (df.allreduce == "recursive_doubling")]
    assert list(on_rd.moe) == sorted(on_rd.moe, reverse=True)  # wider: less MoE per step
    for w in (16, 32, 64):
        at = df[df.DEP == w]
        ring = at[(at.allreduce == "ring") & (at.eplb == "on")].sync.item()
        rd = at[(at.allreduce == "recursive_doubling") & (at.eplb == "on")].sync.item()
        assert ring > rd
        on = at[(at.eplb == "on") & (at.allreduce == "ring")]
        off = at[(at.eplb == "off") & (at.allreduce == "ring")]
        assert on.bal_target.item() > off.bal_target.item()
        assert (on.moe + on.comm).item() < (off.moe + off.comm).item()
    parts = ["moe", "attention", "indexer", "dense", "comm", "draft", "cpu", "sync", "straggler"]
    assert df[parts].sum(axis=1).to_numpy() == pytest.approx(df.step_ms.to_numpy())


def test_cpu_stage_fits_c1_and_c2_exactly() -> None:
    p = fit.start_profile(None) if aic.aic_root() else fit.start_profile(
        Profile.load(DEFAULT_PROFILE))
    pub = fit.figures.published_values()
    p = fit._fit_stage(p, ["allreduce_call_ms", "allreduce_hop_ms"],
                       lambda q: fit._rel(fit.figures.predict_cpu(q), pub,
                                          ["C1.ring", "C1.recursive_doubling"]), ["C1"], "t")
    pred = fit.figures.predict_cpu(p)
    assert pred["C1.ring"] == pytest.approx(10.8, rel=1e-4)
    assert pred["C1.recursive_doubling"] == pytest.approx(1.5, rel=1e-4)
    # closed form: call + 62 hop = 10.8, call + 5 hop = 1.5
    assert p.value("allreduce_hop_ms") == pytest.approx(9.3 / 57, rel=1e-4)


def test_kernel_fit_skipped_with_message_without_aic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aic, "aic_root", lambda: None)
    logs: list[str] = []
    p = fit.start_profile(Profile.load(DEFAULT_PROFILE))
    before = p.value("moe_hbm_efficiency")
    p = fit.fit_kernels(p, logs.append)
    assert logs == [fit.AIC_MISSING]
    assert p.value("moe_hbm_efficiency") == before
