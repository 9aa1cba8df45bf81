"""TTFT figures of a sweep: percentiles against block size and capacity, and the distribution.

Mirrors nothing in vLLM; plots the replay's TTFT (first token's step end minus arrival, see
``sim.replay.engine``) at the sweep's first salt policy.

* ``ttft_vs_block_size`` / ``ttft_vs_capacity``: TTFT p50 and p99 (log axis when they span more
  than a factor of 4), one row of panels per percentile;
* ``ttft_cdf``: the TTFT distribution per salt policy and config, one line per pool capacity (or
  per block size when the capacity was not swept), read from each point's ``requests.parquet``;
  every panel shares one TTFT range. It is :func:`ttft_cdf_by` over ``salt_policy``: the same
  call over another column (a router) draws one column of panels per value.

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
from sim.analysis.sweep_data import SweepData, num_label

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
    marks = dict(zip(d.configs, fs.line_marks(len(d.configs))))
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
                    ax.plot(c["block_size"], c[col], "-", color=colors[cfg], **marks[cfg])
            fs.log2_axis(ax, blocks)
            ax.set_xlabel("Block size (tokens)")
            if j == 0:
                ax.set_ylabel(f"{name} (s{', log scale' if log else ''})")
            ax.set_title(f"{name}" + (f" -- {d.cap_title(cap)}" if cap is not None else ""))
    handles = [fs.section("config"), *fs.mark_handles([(cfg, colors[cfg]) for cfg in d.configs])]
    return fs.finish(fig, f"{d.name}: time to first token vs block size{note}", handles)


def ttft_vs_capacity(d: SweepData) -> Figure | None:
    if d.cap is None or d.df[d.cap].nunique() < 2:
        return None
    cap_col = d.cap
    caps, blocks = d.caps(), d.blocks()
    salt, note = salt_note(d)
    colors: dict[Any, Any] = dict(zip(blocks, fs.colors(len(blocks))))
    marks = dict(zip(blocks, fs.line_marks(len(blocks))))
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
                    ax.plot(c[cap_col], c[col], "-", color=colors[bs], **marks[bs])
            fs.log_axis(ax, caps)
            ax.set_xlabel(d.cap_label + ", log scale")
            if j == 0:
                ax.set_ylabel(f"{name} (s{', log scale' if log else ''})")
            ax.set_title(f"{name} -- {cfg}")
    handles = [fs.section("block size"), *fs.mark_handles([(f"{bs} tokens", colors[bs]) for bs in blocks])]
    return fs.finish(fig, f"{d.name}: time to first token vs KV pool capacity{note}", handles)


def _ttft_values(d: SweepData, key: str) -> np.ndarray:
    p = d.folder / "points" / key / "requests.parquet"
    if not p.is_file():
        return np.zeros(0)
    t = pd.read_parquet(p, columns=["ttft"])["ttft"].dropna().to_numpy()
    return np.sort(t[t > 0])


def reference_block(d: SweepData) -> int | None:
    """The block size a figure that does not vary it shows: 16 if swept, else the smallest."""
    blocks = d.blocks()
    return (16 if 16 in blocks else blocks[0]) if blocks else None


def _line_role(d: SweepData) -> tuple[str, str]:
    """The default lines of a CDF figure: the pool capacity when swept, else the block size."""
    if d.cap is not None and d.df[d.cap].nunique() > 1:
        return d.cap, "pool"
    if d.tenants is not None and d.df[d.tenants].nunique() > 1:
        return d.tenants, "tenants"
    return "block_size", "block size"


def ttft_cdf_by(d: SweepData, group: str | None, *, lines: str | None = None, stem: str = "per") -> Figure | None:
    """TTFT distributions: one panel per (config, value of the ``group`` column), one line per value
    of ``lines`` (default: the pool capacity when swept, else the tenant count when swept, else the
    block size); every other role axis is held at one value named in the title (block size:
    :func:`reference_block`; capacity and tenant count: the largest; salt policy: the first), so no
    line mixes points. ``group`` may be any table column (``salt_policy``, a router column); None
    gives one column of panels."""
    line_col, line_name = (lines, lines) if lines is not None else _line_role(d)
    groups: list[Any] = list(dict.fromkeys(d.df[group])) if group is not None and group in d.df else [None]
    fixed: dict[str, Any] = {}
    if d.block and "block_size" not in (line_col, group):
        fixed["block_size"] = reference_block(d)
    if d.cap is not None and d.cap not in (line_col, group):
        fixed[d.cap] = d.caps()[-1]
    if d.salt and group != d.salt and line_col != d.salt:
        fixed[d.salt] = d.salts()[0]
    if d.tenants and group != d.tenants and line_col != d.tenants:
        fixed[d.tenants] = max(d.df[d.tenants])
    shown = d.where(**fixed)
    values = sorted(shown[line_col].dropna().unique()) if line_col in shown else []
    colors = dict(zip(values, fs.colors(len(values))))
    marks = dict(zip(values, fs.line_marks(len(values))))
    fig, axes = fs.grid(len(d.configs), len(groups), sharey=True)
    lo, hi = math.inf, 0.0
    for i, cfg in enumerate(d.configs):
        for j, g in enumerate(groups):
            ax = axes[i][j]
            sub = shown[shown["_config"] == cfg]
            if g is not None:
                sub = sub[sub[group] == g]
            for k, v in enumerate(values):
                rows = sub[sub[line_col] == v]
                t = _ttft_values(d, rows["key"].iloc[0]) if len(rows) == 1 else np.zeros(0)
                if t.size:
                    m = dict(marks[v])
                    ax.step(t, np.arange(1, t.size + 1) / t.size, where="post", color=colors[v], lw=m["lw"],
                            marker=m["marker"], ms=m["ms"], mfc=m["mfc"],
                            markevery=(0.03 + 0.1 * k / max(1, len(values)), 0.12))
                    lo, hi = min(lo, float(t[0])), max(hi, float(t[-1]))
            ax.set_xscale("log")
            ax.set_ylim(0, 1.01)
            ax.set_xlabel("TTFT (s, log scale)")
            if j == 0:
                ax.set_ylabel("Fraction of requests")
            ax.set_title(cfg + (f"\n{_short(group)}: {g}" if g is not None else ""))
    if hi <= 0:
        fs.discard(fig)
        return None
    for panels in axes:  # one TTFT range for every panel, so that panels compare
        for ax in panels:
            fs.log_ticks(ax.xaxis, limits=(lo, hi))
    handles = [fs.section(line_name), *fs.mark_handles([(_value_label(d, line_col, v), colors[v]) for v in values])]
    held = ", ".join(_held(d, col, v) for col, v in fixed.items())
    what = f"per {_short(group)}" if group is not None else "per config"
    return fs.finish(fig, f"{d.name}: TTFT distribution {what}" + (f" ({held})" if held else ""), handles)


def _value_label(d: SweepData, col: str, v: Any) -> str:
    if col == d.cap:
        return d.cap_title(v).replace("KV pool ", "")
    if col == "block_size":
        return f"{v} tokens"
    return num_label(v) if isinstance(v, (int, float)) else str(v)


def _short(col: str | None) -> str:
    return (col or "").replace("_", " ")


def _held(d: SweepData, col: str, v: Any) -> str:
    if col == d.cap:
        return d.cap_title(v)
    return f"{_short(col)} {v}"


def ttft_cdf(d: SweepData) -> Figure | None:
    """The TTFT distribution per salt policy (:func:`ttft_cdf_by` over ``salt_policy``)."""
    return ttft_cdf_by(d, d.salt)
