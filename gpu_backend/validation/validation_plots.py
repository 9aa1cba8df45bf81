"""The figures of ``apcsim validate``: per-request scatter (simulated vs real) and the CDFs.

Mirrors nothing in vLLM. ``scatter.png``: per metric (TTFT, TPOT, E2E) simulated against real run
1, with real run 2 as grey crosses (the noise floor), ``y = x`` and the 10 % / 20 % bands, log-log;
``cdf.png``: the three runs' distributions per metric.

Invariants: matplotlib runs headless (``Agg``); non-positive and NaN values are left out of log
axes; every figure is closed after saving. Imports matplotlib lazily (only when plotting).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_backend.validation.latency_error import METRICS


def _plain_ticks(axis: Any) -> None:
    """Log-axis tick labels as plain numbers (``60``, ``200``) rather than ``6 x 10^1``."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(fmt)
    axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    axis.set_minor_formatter(fmt)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scatter(pairs: pd.DataFrame, path: Path, title: str, num_real: int) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    for ax, m in zip(axes, METRICS):
        real = pairs[f"{m}_real1"].to_numpy(float) * 1e3
        sim = pairs[f"{m}_sim"].to_numpy(float) * 1e3
        ok = np.isfinite(real) & np.isfinite(sim) & (real > 0) & (sim > 0)
        vals = [real[ok], sim[ok]]
        if num_real >= 2:
            r2 = pairs[f"{m}_real2"].to_numpy(float) * 1e3
            ok2 = np.isfinite(r2) & np.isfinite(real) & (real > 0) & (r2 > 0)
            ax.scatter(real[ok2], r2[ok2], s=14, c="0.6", marker="x", label="real run 2 (noise)")
            vals.append(r2[ok2])
        ax.scatter(real[ok], sim[ok], s=16, c="tab:blue", alpha=0.8, label="simulated")
        allv = np.concatenate(vals) if vals else np.array([1.0])
        if allv.size:
            lo, hi = allv.min() * 0.8, allv.max() * 1.25
            xs = np.array([lo, hi])
            ax.plot(xs, xs, "k-", lw=1, label="y = x")
            ax.fill_between(xs, xs * 0.9, xs * 1.1, color="tab:green", alpha=0.12, label="±10 %")
            ax.fill_between(xs, xs * 0.8, xs * 1.2, color="tab:green", alpha=0.07, label="±20 %")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_ticks(ax.xaxis)
        _plain_ticks(ax.yaxis)
        ax.set_xlabel(f"real {m.upper()}, run 1 (ms)")
        ax.set_ylabel(f"simulated {m.upper()} (ms)" + (" / real run 2 (x)" if num_real >= 2 else ""))
        ax.set_title(m.upper())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_cdf(pairs: pd.DataFrame, path: Path, title: str, num_real: int) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    series = [("sim", "simulated", "tab:blue", "-"), ("real1", "real run 1", "tab:red", "-")]
    if num_real >= 2:
        series.append(("real2", "real run 2", "tab:orange", "--"))
    for ax, m in zip(axes, METRICS):
        for key, label, color, ls in series:
            v = np.sort(pairs[f"{m}_{key}"].dropna().to_numpy(float)) * 1e3
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", color=color, ls=ls, label=label)
        ax.set_xscale("log")
        _plain_ticks(ax.xaxis)
        ax.set_xlabel(f"{m.upper()} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{m.upper()} CDF")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
