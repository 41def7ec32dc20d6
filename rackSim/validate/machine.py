"""How steady is this machine? The floor under every validated-mode error.

A prediction of a real server can be no closer than the server repeats itself, and on a
shared virtual machine the server is only as steady as the CPU under it. `sample` times three
fixed kernels on one CPU every few seconds, with nothing else of ours running:

- `python`: an interpreter loop (what vLLM's API server, engine core and scheduler do);
- `matmul`: float32 activations x an LM-head-shaped weight (8 x hidden @ hidden x vocab, the
  largest GEMM of the tiny validated models);
- `copy`: a memory copy larger than the last-level cache (bandwidth).

Each sample is the best and the median of `repeats` back-to-back timings (ms). `steadiness`
summarises per kernel: P10 / P50 / P90 of the best time, P90 / P10, the lag-one correlation
of consecutive samples (near 0: the speed changes within seconds), and the spread of means
over windows of a run's length (what a measured run averages over). Written by
`racksim-validate machine` as machine.csv and machine.png.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

KERNELS = ("python", "matmul", "copy")


@dataclass(frozen=True)
class KernelSizes:
    """loop_iterations: interpreter loop length; hidden, vocab: the matmul's weight shape;
    copy_mib: bytes copied (MiB). The defaults take ~10-40 ms each on this project's 2-core
    machine; tests shrink them."""

    loop_iterations: int = 300_000
    hidden: int = 256
    vocab: int = 32_000
    copy_mib: int = 64


def _kernels(sizes: KernelSizes) -> dict[str, Callable[[], object]]:
    rng = np.random.default_rng(0)
    act = rng.standard_normal((8, sizes.hidden)).astype(np.float32)
    weight = rng.standard_normal((sizes.hidden, sizes.vocab)).astype(np.float32)
    src = np.ones(sizes.copy_mib << 17)  # float64: MiB x 2**17 values
    dst = np.empty_like(src)

    def python() -> int:
        s = 0
        for i in range(sizes.loop_iterations):
            s += i
        return s

    return {"python": python, "matmul": lambda: act @ weight,
            "copy": lambda: np.copyto(dst, src)}


def check_cpu(cpu: int) -> None:
    """Refuse a CPU this process may not run on, naming the ones it may."""
    allowed = sorted(os.sched_getaffinity(0))
    if cpu not in allowed:
        raise ValueError(f"--cpu {cpu}: this process may run on CPU {allowed} only; pick one "
                         "of those")


def sample(duration_s: float, every_s: float = 3.0, cpu: int = 0, repeats: int = 5,
           sizes: KernelSizes = KernelSizes(), sleep: Callable[[float], None] = time.sleep,
           progress: Callable[[str], None] | None = None) -> tuple[pd.DataFrame, bool]:
    """Time every kernel on `cpu` every `every_s` s for `duration_s` s. Returns (rows, partial):
    one row per sample and kernel (t_s since the start, kernel, best_ms, median_ms), and
    whether Ctrl-C stopped it early (the rows so far are kept). The process is pinned to `cpu`
    while sampling and unpinned after."""
    if duration_s <= 0:
        raise ValueError(f"--duration-s {duration_s}: must be > 0")
    if every_s < 0:
        raise ValueError(f"--every-s {every_s}: must be >= 0")
    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: must be >= 1")
    check_cpu(cpu)
    kernels = _kernels(sizes)
    before = os.sched_getaffinity(0)
    rows: list[dict] = []
    partial = False
    os.sched_setaffinity(0, {cpu})
    try:
        t0 = time.perf_counter()
        while (t := time.perf_counter() - t0) < duration_s:
            for name, kernel in kernels.items():
                ms = []
                for _ in range(repeats):
                    s = time.perf_counter()
                    kernel()
                    ms.append((time.perf_counter() - s) * 1e3)
                rows.append({"t_s": t, "kernel": name, "best_ms": min(ms),
                             "median_ms": float(np.median(ms))})
            if progress is not None:
                progress(f"{t:6.0f} s of {duration_s:.0f} s  " + "  ".join(
                    f"{r['kernel']} {r['best_ms']:.1f} ms" for r in rows[-len(kernels):]))
            sleep(every_s)
    except KeyboardInterrupt:
        partial = True
    finally:
        os.sched_setaffinity(0, before)
    return pd.DataFrame(rows, columns=["t_s", "kernel", "best_ms", "median_ms"]), partial


def steadiness(df: pd.DataFrame, window_s: float = 60.0) -> pd.DataFrame:
    """Per kernel: samples, P10 / P50 / P90 of best_ms, p90_over_p10, lag1_r (correlation of
    consecutive samples; NaN under three samples) and window_spread: max / min of the mean
    best_ms over consecutive `window_s` windows (NaN under two whole windows)."""
    if window_s <= 0:
        raise ValueError(f"--window-s {window_s}: must be > 0")
    out = []
    for name in [k for k in KERNELS if k in set(df.kernel)]:
        g = df[df.kernel == name].sort_values("t_s")
        v = g.best_ms.to_numpy()
        p10, p50, p90 = np.percentile(v, [10, 50, 90])
        lag1 = float(np.corrcoef(v[:-1], v[1:])[0, 1]) if len(v) >= 3 and v.std() > 0 \
            else math.nan
        window = (g.t_s.to_numpy() // window_s).astype(int)
        whole = window < window.max()  # the last window is cut short by the end
        means = g[whole].groupby(window[whole]).best_ms.mean()
        spread = float(means.max() / means.min()) if len(means) >= 2 else math.nan
        out.append({"kernel": name, "samples": len(v), "p10_ms": p10, "p50_ms": p50,
                    "p90_ms": p90, "p90_over_p10": p90 / p10, "lag1_r": lag1,
                    "window_spread": spread})
    return pd.DataFrame(out)


def format_steadiness(table: pd.DataFrame, window_s: float) -> str:
    lines = [f"{'kernel':<8}{'samples':>8}{'P10 ms':>9}{'P50 ms':>9}{'P90 ms':>9}"
             f"{'P90/P10':>9}{'lag-1 r':>9}{f'{window_s:g}-s means max/min':>24}"]
    for r in table.itertuples():
        lines.append(f"{r.kernel:<8}{r.samples:>8}{r.p10_ms:>9.2f}{r.p50_ms:>9.2f}"
                     f"{r.p90_ms:>9.2f}{r.p90_over_p10:>9.2f}{r.lag1_r:>9.2f}"
                     f"{r.window_spread:>24.2f}")
    return "\n".join(lines).replace("nan", "n/a")


def write_machine(df: pd.DataFrame, out: Path) -> tuple[Path, Path]:
    """machine.csv (one row per sample and kernel) and machine.png (each kernel's best time
    relative to its median, against time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    csv = out / "machine.csv"
    df.to_csv(csv, index=False)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for name, g in df.groupby("kernel", sort=False):
        ax.plot(g.t_s, g.best_ms / g.best_ms.median(), marker=".", ms=3, lw=0.8, label=name)
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("time / its median")
    ax.set_title("the same work, timed again and again: the machine's own speed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = out / "machine.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return csv, png
