"""The grid (fit at one concurrency, predict the others) on runs whose records come from the
colocated model itself: the bookkeeping, the held-out table, the files, and bad specs."""

from __future__ import annotations

import pandas as pd
import pytest
from validate_support import simulated_run_dir

from rackSim.validate.compare import HEADLINE
from rackSim.validate.grid import (
    GridSpec,
    format_held_out,
    held_out_table,
    run_grid,
    write_grid,
)


def _runner(concurrency: int, seed: int, out):
    out.mkdir(parents=True, exist_ok=True)
    return simulated_run_dir(out, concurrency, seed, window_s=10.0)


def test_grid_fits_once_per_seed_and_predicts_every_point(tmp_path):
    spec = GridSpec(fit_concurrency=3, concurrencies=(1, 5), seeds=(1, 2), window_s=10.0,
                    sources=("driver_records",))
    seen = []
    df = run_grid(spec, _runner, tmp_path, "sim", progress=seen.append)
    assert len(seen) == 6  # 2 seeds x (fit point + 2 held-out points)
    assert set(df.role) == {"fit", "held_out"}
    assert set(df[df.role == "fit"].concurrency) == {3}
    assert (tmp_path / "seed1" / "profile-driver_records.yaml").exists()
    wide = held_out_table(df)
    assert len(wide) == 4 and set(HEADLINE) <= set(wide.columns)
    # records from the model itself: the refined black-box fit predicts them within 25 %
    for m in ("itl_p50_ms", "throughput_tok_s_gpu"):
        assert wide[m].abs().max() < 25, (m, wide[m].tolist())
    text = format_held_out(wide)
    assert text.count("\n") == 4 and ("met" in text or "missed" in text)
    csv, png = write_grid(df, tmp_path / "out")
    assert len(pd.read_csv(csv)) == len(df) and png.stat().st_size > 10_000


@pytest.mark.parametrize("kwargs,match", [
    ({"concurrencies": ()}, "--concurrency:"), ({"seeds": ()}, "--seeds"),
    ({"concurrencies": (0, 2)}, "lanes must be >= 1"), ({"window_s": 0.0}, "--window-s"),
    ({"sources": ("guess",)}, "--sources: unknown")])
def test_bad_grid_specs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GridSpec(**kwargs)
