"""The salt-policy figure of a sweep: hit rate, TTFT p50 and p99 per salt policy.

Mirrors nothing in vLLM; compares ``cache_salt`` policies (``workload.tenants.salt``, see
``workloads.tenants``) at a reference block size (16 if swept, else the smallest): against the
tenant count when it was swept (lines, one panel row per config, at the largest capacity), else
bars per config (one panel row per capacity). The hit rate is the first-admission token hit rate,
shown with the infinite-cache bound of the same stream (dashed lines, or a black tick over each
bar); its axis is fitted to both (bars start at 0).

Invariants: returns None unless at least two salt policies were swept; never saves. Imports
matplotlib artists through ``sim.analysis.figure_style`` only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from sim.analysis import figure_style as fs
from sim.analysis.hit_rate_figures import HIT_RATE, HIT_RATE_LABEL
from sim.analysis.sweep_data import SweepData

BOUND = "infinite_cache_hit_rate"
_SALT_METRICS = ((HIT_RATE, HIT_RATE_LABEL, False),
                 ("ttft_p50_s", "TTFT p50 (s)", True),
                 ("ttft_p99_s", "TTFT p99 (s)", True))


def _reference_block(d: SweepData) -> int | None:
    blocks = d.blocks()
    if not blocks:
        return None
    return 16 if 16 in blocks else blocks[0]


def salt_policy(d: SweepData) -> Figure | None:
    if not d.salt or d.df["salt_policy"].nunique() < 2:
        return None
    salts = d.salts()
    bs = _reference_block(d)
    base = d.where(block_size=bs) if d.block else d.df
    colors = dict(zip(salts, fs.colors(len(salts))))
    if d.tenants and base["num_tenants"].nunique() > 1:
        return _against_tenants(d, base, salts, colors, bs)
    return _bars(d, base, salts, colors, bs)


def _against_tenants(d: SweepData, base: Any, salts: list[Any], colors: dict[Any, Any], bs: int | None) -> Figure:
    """Lines against the tenant count, at the largest capacity."""
    cap = d.caps()[-1]
    base = d.where(base, **{d.cap or "": cap})
    fig, axes = fs.grid(len(d.configs), len(_SALT_METRICS), sharey=False)
    tenants = sorted(int(t) for t in base["num_tenants"].unique())
    marks = fs.line_marks(len(salts))
    for i, cfg in enumerate(d.configs):
        for j, (col, label, logy) in enumerate(_SALT_METRICS):
            ax = axes[i][j]
            sub = base[base["_config"] == cfg]
            drawn = []
            for k, s in enumerate(salts):  # distinct markers, earlier ones larger: equal lines stay visible
                c = sub[sub["salt_policy"] == s].sort_values("num_tenants")
                if not c.empty:
                    ax.plot(c["num_tenants"], c[col], "-", color=colors[s], **marks[k])
                    drawn.append(c[col])
                    if not logy and BOUND in c:
                        ax.plot(c["num_tenants"], c[BOUND], "--", color=colors[s], lw=1.1)
                        drawn.append(c[BOUND])
            fs.log2_axis(ax, tenants)
            log = fs.time_axis(ax, "y", sub[col]) if logy else False
            if not logy:
                fs.fit_ylim(ax, drawn)
            ax.set_xlabel("Tenants (count, log scale)")
            ax.set_ylabel(label.replace("(s)", "(s, log scale)") if log else label)
            ax.set_title(cfg)
    where = f"block size {bs}" + (f", {d.cap_title(cap)}" if cap is not None else "")
    handles: list[Artist] = [fs.section("salt policy"), *fs.mark_handles([(str(s), colors[s]) for s in salts]),
                             fs.section("line style"),
                             *fs.style_handles([("simulated engine", "-", fs.REFERENCE_COLOR),
                                                ("infinite cache (hit rate)", "--", fs.REFERENCE_COLOR)])]
    return fs.finish(fig, f"{d.name}: salt policies vs tenant count ({where})", handles)


def _bars(d: SweepData, base: Any, salts: list[Any], colors: dict[Any, Any], bs: int | None) -> Figure:
    """Bars per config, one panel row per capacity."""
    caps = d.caps()
    fig, axes = fs.grid(len(caps), len(_SALT_METRICS), w=max(3.9, 1.1 * len(d.configs) * len(salts) / 2),
                        sharey=False)
    width = 0.8 / len(salts)
    x = np.arange(len(d.configs))
    for i, cap in enumerate(caps):
        sub = d.where(base, **{d.cap or "": cap})
        for j, (col, label, logy) in enumerate(_SALT_METRICS):
            ax = axes[i][j]
            drawn = []
            for k, s in enumerate(salts):
                cells = [sub[(sub["_config"] == cfg) & (sub["salt_policy"] == s)] for cfg in d.configs]
                vals = [_one(c, col) for c in cells]
                xs = x + (k - (len(salts) - 1) / 2) * width
                ax.bar(xs, vals, width, color=colors[s])
                drawn += vals
                if not logy and BOUND in sub:
                    refs = [_one(c, BOUND) for c in cells]
                    ax.hlines(refs, xs - width / 2, xs + width / 2, colors="black", lw=1.6)
                    drawn += refs
            ax.set_xticks(x, d.configs)
            ax.grid(axis="x", visible=False)
            log = fs.time_axis(ax, "y", sub[col]) if logy else False
            if not logy:
                top = max((v for v in drawn if np.isfinite(v)), default=1.0)
                ax.set_ylim(0, min(1.0, max(0.05, top * 1.12)))
            ax.set_ylabel(label.replace("(s)", "(s, log scale)") if log else label)
            ax.set_title(d.cap_title(cap) if cap is not None else label.split(" (")[0])
    tenants = base["num_tenants"].dropna().unique() if "num_tenants" in base else []
    tn = f", {int(tenants[0])} tenants" if len(tenants) == 1 else ""
    handles: list[Artist] = [fs.section("salt policy"),
                             *(Rectangle((0, 0), 1, 1, color=colors[s], label=str(s)) for s in salts),
                             Line2D([], [], color="black", lw=1.6, label="infinite cache (hit rate)")]
    return fs.finish(fig, f"{d.name}: salt policies (block size {bs}{tn})", handles)


def _one(cell: Any, col: str) -> float:
    """The value of ``col`` in a one-point cell (NaN when empty); two points would mean an axis
    is hidden, which the configs rule out (every other axis is part of the config label)."""
    if cell.empty:
        return float("nan")
    if len(cell) > 1:
        raise ValueError(f"{len(cell)} points share one bar of {col}: an axis is unaccounted for")
    return float(cell[col].iloc[0])
