"""TTFT figures of a sweep: percentiles against block size and capacity, and the distribution.

Mirrors nothing in vLLM; plots the replay's TTFT (first token's step end minus arrival, see
``sim.replay.engine``) at the sweep's first salt policy.

* ``ttft_vs_block_size`` / ``ttft_vs_capacity``: TTFT p50 and p99 (log axis when they span more
  than a factor of 4), one row of panels per percentile;
* ``ttft_cdf``: the TTFT distribution of every (config, capacity) panel, one curve per block size,
  read from each point's ``requests.parquet``; every panel shares one TTFT range.

Invariants: a builder returns None when the sweep lacks its x axis (``ttft_cdf``: when no point
has a requests table); it never saves. Imports matplotlib artists through
``sim.analysis.figure_style`` only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.analysis import figure_style as fs
from sim.analysis.sweep_data import SweepData

_TTFT = (("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99"))


def salt_note(d: SweepData) -> tuple[Any, str]:
    """The salt policy a single-policy figure shows (the sweep's first), and its title note."""
    salt = d.salts()[0]
    return salt, (f" (salt policy: {salt})" if d.salt else "")


def ttft_vs_block_size(d: SweepData) -> Figure | None:
    if not d.block:
        return None
    caps, blocks = d.caps(), d.blocks()
    salt, note = salt_note(d)
    colors = dict(zip(d.configs, fs.colors(len(d.configs))))
    fig, axes = fs.grid(len(_TTFT), len(caps), sharey="row")
    shown = d.where(**{d.salt or "": salt})
    for i, (col, name) in enumerate(_TTFT):
        log = fs.time_axis(axes[i][0], "y", shown[col])
        for j, cap in enumerate(caps):
            ax = axes[i][j]
            sub = d.where(shown, **{d.cap or "": cap})
            for cfg in d.configs:
                c = sub[sub["_config"] == cfg].sort_values("block_size")
                if not c.empty:
                    ax.plot(c["block_size"], c[col], "-o", color=colors[cfg], ms=4, lw=1.8)
            fs.log2_axis(ax, blocks)
            ax.set_xlabel("Block size (tokens per block)")
            if j == 0:
                ax.set_ylabel(f"{name} (s{', log scale' if log else ''})")
            ax.set_title(f"{name}" + (f" -- {d.cap_title(cap)}" if cap is not None else ""))
    handles = fs.style_handles([(cfg, "-", colors[cfg]) for cfg in d.configs])
    return fs.finish(fig, f"{d.name}: time to first token vs block size{note}", handles)


def ttft_vs_capacity(d: SweepData) -> Figure | None:
    if d.cap is None or d.df[d.cap].nunique() < 2:
        return None
    cap_col = d.cap
    caps, blocks = d.caps(), d.blocks()
    salt, note = salt_note(d)
    colors: dict[Any, Any] = dict(zip(blocks, fs.colors(len(blocks), "viridis")))
    fig, axes = fs.grid(len(_TTFT), len(d.configs), sharey="row")
    shown = d.where(**{d.salt or "": salt})
    for i, (col, name) in enumerate(_TTFT):
        log = fs.time_axis(axes[i][0], "y", shown[col])
        for j, cfg in enumerate(d.configs):
            ax = axes[i][j]
            sub = shown[shown["_config"] == cfg]
            for bs in blocks:
                c = sub[sub["block_size"] == bs].sort_values(cap_col)
                if not c.empty:
                    ax.plot(c[cap_col], c[col], "-o", color=colors[bs], ms=4, lw=1.8)
            fs.log_axis(ax, caps)
            ax.set_xlabel(d.cap_label + ", log scale")
            if j == 0:
                ax.set_ylabel(f"{name} (s{', log scale' if log else ''})")
            ax.set_title(f"{name} -- {cfg}")
    handles = fs.style_handles([(f"block size {bs}", "-", colors[bs]) for bs in blocks])
    return fs.finish(fig, f"{d.name}: time to first token vs KV pool capacity{note}", handles,
                     ncol=min(len(handles), 6))


def _ttft_values(d: SweepData, key: str) -> np.ndarray:
    p = d.folder / "points" / key / "requests.parquet"
    if not p.is_file():
        return np.zeros(0)
    t = pd.read_parquet(p, columns=["ttft"])["ttft"].dropna().to_numpy()
    return np.sort(t[t > 0])


def ttft_cdf(d: SweepData) -> Figure | None:
    caps = d.caps()
    blocks = d.blocks()
    salt, note = salt_note(d)
    colors: dict[Any, Any] = dict(zip(blocks, fs.colors(len(blocks), "viridis")))
    fig, axes = fs.grid(len(d.configs), len(caps), sharey=True)
    any_line = False
    lo, hi = math.inf, 0.0
    for i, cfg in enumerate(d.configs):
        for j, cap in enumerate(caps):
            ax = axes[i][j]
            sub = d.where(d.df[d.df["_config"] == cfg], **{d.salt or "": salt, d.cap or "": cap})
            for bs in blocks:
                for _, row in sub[sub["block_size"] == bs].iterrows():
                    t = _ttft_values(d, row["key"])
                    if t.size:
                        ax.step(t, np.arange(1, t.size + 1) / t.size, where="post", color=colors[bs], lw=1.5)
                        any_line = True
                        lo, hi = min(lo, float(t[0])), max(hi, float(t[-1]))
                    break  # one line per block size (the first matching point)
            ax.set_xscale("log")
            fs.log_ticks(ax.xaxis)
            ax.set_ylim(0, 1.01)
            ax.set_xlabel("TTFT (s, log scale)")
            if j == 0:
                ax.set_ylabel("Fraction of requests")
            ax.set_title(cfg + (f" -- {d.cap_title(cap)}" if cap is not None else ""))
    if not any_line:
        fs.discard(fig)
        return None
    for panels in axes:  # one TTFT range for every panel, so that panels compare
        for ax in panels:
            ax.set_xlim(lo / 1.2, hi * 1.2)
            fs.log_ticks(ax.xaxis, hi / lo)
    handles = fs.style_handles([(f"block size {bs}", "-", colors[bs]) for bs in blocks])
    return fs.finish(fig, f"{d.name}: TTFT distribution per config{note}", handles, ncol=min(len(handles), 6))
