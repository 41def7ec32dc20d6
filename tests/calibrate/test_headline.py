"""Headline arithmetic (racksim-calibrate headline) against hand calculations."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rackSim.calibrate.command import main
from rackSim.calibrate.figures import FIGURES_CSV
from rackSim.calibrate.headline import (
    HeadlineError,
    Layout,
    depth_at_step,
    implied,
    layouts,
    mix_at_output,
    mix_segment,
    read_headline,
)

# Hand calculation: 38.96 $/GPU-h / (954,000 tok/s x 3,600 s / 1e6) = 0.0113440 $ per 1M tokens.
PRICE = 38.96 / 3434.4


def _table(tmp_path: Path, **values: str) -> Path:
    """A copy of the published figures with some values replaced."""
    with open(FIGURES_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        if r["id"] in values:
            r["value"] = values[r["id"]]
    out = tmp_path / "figures.csv"
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return out


def test_published_table_reads_as_published() -> None:
    h = read_headline()
    assert h.usd_per_mtok == pytest.approx(PRICE, rel=1e-9)
    assert (h.gpus_min, h.gpus_max, h.decode_widths) == (34, 64, (16, 32))
    assert h.prefill_gpus_per_instance == 2
    assert h.p90_step_ms == pytest.approx(3.25 / 196 * 1e3)  # 16.58 ms


def test_mix_segment_ends_by_hand() -> None:
    lo, hi = mix_segment(read_headline())
    # o = 0: 0.003 c + 0.15 u = P, c + u = 1 -> u = (P - 0.003) / 0.147 = 5.676 %
    assert (lo.output, lo.uncached) == (0.0, pytest.approx((PRICE - 0.003) / 0.147, rel=1e-9))
    assert lo.cached == pytest.approx(1 - (PRICE - 0.003) / 0.147, rel=1e-9)
    # u = 0: o = (P - 0.003) / 0.597 = 1.398 %
    assert (hi.uncached, hi.output) == (0.0, pytest.approx((PRICE - 0.003) / 0.597, rel=1e-9))
    assert hi.output == pytest.approx(0.013977, abs=1e-6)
    assert lo.uncached == pytest.approx(0.056762, abs=1e-6)


def test_layouts_cover_h4() -> None:
    lays = layouts(read_headline())
    assert len(lays) == 16 + 16  # DEP16: 9..24 prefill instances; DEP32: 1..16
    assert all(34 <= lay.gpus <= 64 for lay in lays)
    assert Layout(8, 2, 32) in lays and Layout(9, 2, 16) in lays
    assert Layout(8, 2, 16) not in lays  # 32 GPUs: below H4


def test_implied_by_hand() -> None:
    h = read_headline()
    imp = implied(h, Layout(8, 2, 32), 64.0)
    # 32 ranks x 64 requests x 196 tok/s = 401,408 output tok/s over 48 x 954,000 tok/s
    assert imp.output_tok_s == pytest.approx(401_408.0)
    o = 401_408.0 / (48 * 954_000.0)
    assert imp.mix.output == pytest.approx(o)
    u = (PRICE - 0.003 - 0.597 * o) / 0.147
    assert imp.mix.uncached == pytest.approx(u, rel=1e-9)
    assert u == pytest.approx(0.021162, abs=2e-6)
    assert imp.uncached_tok_s_per_prefill_gpu == pytest.approx(u * 48 * 954_000 / 16, rel=1e-9)
    assert imp.uncached_tok_s_per_prefill_gpu == pytest.approx(60_566, rel=1e-3)


def test_too_much_output_is_off_the_segment() -> None:
    h = read_headline()
    assert mix_at_output(h, 0.02) is None  # above the 1.398 % maximum
    imp = implied(h, Layout(1, 2, 32), 200.0)
    assert imp.mix is None and not imp.row()["feasible"]


def test_depth_at_step_bisects_a_monotone_step() -> None:
    assert depth_at_step(lambda r: 5.0 + 0.125 * r, 16.6) == pytest.approx(92.8, abs=0.02)
    assert depth_at_step(lambda r: 1.0, 16.6, hi=512) == 512


@pytest.mark.parametrize(("values", "fid", "words"), [
    ({"H3": "4000"}, "H3", "above what all-output tokens could earn"),
    ({"H3": "5"}, "H3", "below what all-cached tokens earn"),
    ({"H1": "-3"}, "H1", "must be positive"),
    ({"H2": "fast"}, "H2", "is not a number"),
    ({"H4": "64 to 34"}, "H4", "empty range"),
    ({"H4": "about 48"}, "H4", "expected value"),
])
def test_bad_tables_name_the_figure(tmp_path: Path, values: dict[str, str], fid: str,
                                    words: str) -> None:
    with pytest.raises(HeadlineError, match=words) as err:
        read_headline(_table(tmp_path, **values))
    assert str(err.value).startswith(fid)


def test_command_prints_segment_and_layouts(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "layouts.csv"
    assert main(["headline", "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    assert "uncached input at most 5.68%, output at most 1.40%" in text
    assert "16.58 ms" in text
    import pandas as pd

    df = pd.read_csv(out)
    assert len(df) == 32 and set(df.decode_gpus) == {16, 32}
    # the decode depth comes from the calibrated step: deep batches, as H2 implies
    assert (df.requests_per_rank > 32).all()
    # a layout off the segment prints '-' (not NaN) and the table says why
    assert "NaN" not in text and not df.feasible.all()
    assert ("-: infeasible: the layout's output rate is above the largest output share H1 "
            "and H3 allow (1.40% of the tokens)") in text


def test_command_refuses_an_infeasible_table(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["headline", "--figures", str(_table(tmp_path, H3="4000"))]) == 2
    assert "H3:" in capsys.readouterr().err
    assert main(["headline", "--figures", str(tmp_path / "none.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_command_refuses_a_context_that_is_not_a_token_count(
        capsys: pytest.CaptureFixture[str]) -> None:
    for value, says in (("0", "0 must be above 0"), ("1.5", "'1.5' is not a whole number")):
        with pytest.raises(SystemExit) as ex:
            main(["headline", "--context", value])
        assert ex.value.code == 2 and f"argument --context: {says}" in capsys.readouterr().err


def test_command_names_a_profile_that_is_not_one(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("just text\n")
    assert main(["headline", "--profile", str(bad)]) == 3  # the profile class's code
    assert (f"racksim-calibrate headline: --profile {bad}: expected a mapping"
            in capsys.readouterr().err)
