"""CPU offload tier figures of a sweep: where prompt tokens hit, and TTFT, against the CPU tier size.

Mirrors nothing in vLLM; draws vLLM 0.33.0's own metric split, ``vllm:prompt_tokens_by_source``
(the summary's ``hit_rate_by_source``, :mod:`sim.replay.tier_metrics`): at each request's first
admission, the prompt tokens hit in the GPU prefix cache (``local_cache_hit``) and those loaded from
the CPU tier (``external_kv_transfer``), over all prompt tokens. A point without a tier has no such
keys: its GPU share is ``first_admission_token_hit_rate`` (the same count) and its CPU share 0.

* ``cpu_tier_hit_rate``: stacked bars per tier size (GPU share below, CPU share above, the total
  written over each bar), one panel per value of the sweep's other varying axes (e.g. the eviction
  policy); when the sweep computed bounds, the infinite cache (dashed) and, on each bar, the
  two-tier sequential reference of its policy (``two_tier_<policy>_sequential_hit_rate``; the
  pool's ``lru_sequential_hit_rate`` without a tier) as a black tick;
* ``cpu_tier_ttft``: TTFT p50 and p90 per tier size, one line per value of the other axes.

The x axis is categorical, ordered by the resolved tier size (``cpu_tier_gib`` of the row,
:func:`sim.experiment.tier_axis.tier_facts`): "none" first, then the sizes in GiB as swept (a
``num_cpu_blocks`` axis: chunks, with their GiB). Invariants: a builder returns None unless the
sweep varies a tier-size axis (``engine.kv_offloading_size`` or ``engine.num_cpu_blocks``) over at
least two values; every bar and point is one sweep point, never an average; it never saves.
Imports matplotlib artists through ``sim.analysis.figure_style`` only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.analysis import figure_style as fs
from sim.analysis.sweep_data import SweepData, num_label

SIZE_AXES = ("engine.kv_offloading_size", "engine.num_cpu_blocks")
HIT = "first_admission_token_hit_rate"
GPU_COLOR, CPU_COLOR = "#0072B2", "#E69F00"
_TTFT = (("ttft_p50_s", "TTFT p50"), ("ttft_p90_s", "TTFT p90"))


def tier_axis(d: SweepData) -> str | None:
    """The swept tier-size axis (None unless it takes at least two values among the ok points)."""
    for key in SIZE_AXES:
        if key in d.axes and d.df[key].astype(str).nunique() > 1:
            return key
    return None


def _col(rows: pd.DataFrame, name: str) -> pd.Series:
    return rows[name] if name in rows else pd.Series(np.nan, index=rows.index)


def shares(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the GPU and CPU shares of the prompt tokens (untiered rows: the first-admission hit
    rate and 0)."""
    gpu = _col(rows, "hit_rate_by_source.gpu").fillna(_col(rows, HIT)).to_numpy(dtype=float)
    cpu = _col(rows, "hit_rate_by_source.cpu").fillna(0.0).to_numpy(dtype=float)
    return gpu, cpu


def _sizes(d: SweepData, axis: str) -> pd.DataFrame:
    """Every ok point with its x position (``_x``: one per swept value, ordered by the smallest
    resolved size of that value, "none" first), tick label (``_xl``) and resolved GiB (``_gib``)."""
    rows = d.df.copy()
    chunks = _col(rows, "num_cpu_chunks")
    gib = _col(rows, "cpu_tier_gib").fillna(0.0)
    if axis == "engine.num_cpu_blocks":
        labels = ["none" if pd.isna(c) else f"{int(c):,}" for c in chunks]
    else:  # the size as swept (vLLM rounds it down to whole chunks: cpu_tier_gib)
        labels = ["none" if pd.isna(c) else _size_label(v) for v, c in zip(rows[axis], chunks)]
    rows["_gib"], rows["_xl"] = gib.to_numpy(dtype=float), labels
    smallest = rows.groupby("_xl")["_gib"].min().to_dict()
    order = sorted(smallest, key=lambda lb: (lb != "none", smallest[lb]))
    rows["_x"] = [order.index(lb) for lb in rows["_xl"]]
    return rows


def _size_label(v: Any) -> str:
    try:
        return num_label(float(v))
    except (TypeError, ValueError):
        return str(v)


def _groups(d: SweepData, axis: str, rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The rows split by the values of every other varying axis, in order of first appearance;
    each group's title names those values."""
    others = [a for a in d.axes if a != axis and rows[a].astype(str).nunique() > 1]
    if not others:
        return [("", rows)]
    keys = rows[others].astype(str).agg(", ".join, axis=1) if len(others) > 1 else rows[others[0]].astype(str)
    titles = rows[others].astype(str).apply(
        lambda r: ", ".join(f"{_short(a)}={r[a]}" for a in others), axis=1)
    out = []
    for k in dict.fromkeys(keys):
        sel = rows[keys == k]
        out.append((str(titles[sel.index[0]]), sel.sort_values("_x")))
    return out


def _legend_names(groups: list[tuple[str, pd.DataFrame]]) -> tuple[str, list[str]]:
    """The lines' legend heading and labels: ``("policy", ["lru", "arc"])`` when one other axis
    varies, else ``("config", [titles])``."""
    keys = {t.split("=")[0] for t, _ in groups}
    if len(keys) == 1 and all(t.count("=") == 1 for t, _ in groups):
        return keys.pop(), [t.split("=", 1)[1] for t, _ in groups]
    return "config", [t or "all points" for t, _ in groups]


def _short(key: str) -> str:
    for prefix in ("engine.kv_offloading_", "engine.", "workload."):
        if key.startswith(prefix) and key != prefix.rstrip("."):
            return key[len(prefix):]
    return key


def _xaxis(ax: Any, rows: pd.DataFrame, axis: str) -> None:
    """Ticks at the swept values of ``rows``; a chunk count gets its GiB when it is one value there."""
    ticks, names = [], []
    for _, sub in rows.groupby("_x"):
        name = str(sub["_xl"].iloc[0])
        gibs = {f"{g:.3g}" for g in sub["_gib"]}
        if axis == "engine.num_cpu_blocks" and name != "none" and len(gibs) == 1:
            name += f"\n({gibs.pop()} GiB)"
        ticks.append(int(sub["_x"].iloc[0]))
        names.append(name)
    ax.set_xticks(ticks, names)
    ax.set_xlim(-0.6, float(rows["_x"].max()) + 0.6)
    ax.set_xlabel("CPU tier size (chunks)" if axis == "engine.num_cpu_blocks" else "CPU tier size (GiB)")
    ax.grid(False, axis="x")


def _sequential(rows: pd.DataFrame) -> np.ndarray | None:
    """Per row, the offline two-tier reference of its own policy (``workloads.tier_bounds``: the GPU
    pool's LRU plus the CPU tier, one request at a time); an untiered row: the pool's LRU alone.
    None when the sweep computed no bounds."""
    if "lru_sequential_hit_rate" not in rows:
        return None
    out = _col(rows, "lru_sequential_hit_rate").to_numpy(dtype=float).copy()
    policy = _col(rows, "cpu_tier_policy")
    for i, pol in enumerate(policy):
        if isinstance(pol, str):
            out[i] = float(_col(rows, f"two_tier_{pol}_sequential_hit_rate").iloc[i])
    return out


def cpu_tier_hit_rate(d: SweepData) -> Figure | None:
    axis = tier_axis(d)
    if axis is None:
        return None
    rows = _sizes(d, axis)
    groups = _groups(d, axis, rows)
    fig, axes = fs.grid(1, len(groups), w=3.9, h=3.8, sharey=True)
    bound = "infinite_cache_hit_rate" if "infinite_cache_hit_rate" in rows and rows[
        "infinite_cache_hit_rate"].notna().any() else None
    tops = [float(np.nanmax(sum(shares(rows))))]
    handles: list[Any] = []
    seq_handle: list[Any] = []
    for ax, (title, g) in zip(axes[0], groups):
        gpu, cpu = shares(g)
        x = g["_x"].to_numpy(dtype=float)
        b1 = ax.bar(x, gpu, width=0.62, color=GPU_COLOR, edgecolor="white", linewidth=0.4)
        b2 = ax.bar(x, cpu, bottom=gpu, width=0.62, color=CPU_COLOR, edgecolor="white", linewidth=0.4)
        for xi, lo, hi in zip(x, gpu, cpu):
            ax.annotate(f"{lo + hi:.3f}", (xi, lo + hi), xytext=(0, 3), textcoords="offset points", ha="center",
                        va="bottom", fontsize=8, color="0.2", zorder=3,
                        bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"})
        if bound is not None:
            ref = g[bound].dropna()
            if len(ref):
                ax.axhline(float(ref.iloc[0]), ls="--", lw=1.1, color=fs.REFERENCE_COLOR)
                tops.append(float(ref.max()))
        seq = _sequential(g)
        if seq is not None and np.isfinite(seq).any():
            (mark,) = ax.plot(x, seq, linestyle="none", marker="_", ms=26, mew=2.2, color="0.1", zorder=4)
            mark.set_label("two-tier LRU / ARC reference:\nthis pool + tier, one\nrequest at a time")
            seq_handle = [mark]
            tops.append(float(np.nanmax(seq)))
        b1.patches[0].set_label("GPU prefix cache (local_cache_hit)")
        b2.patches[0].set_label("CPU tier (external_kv_transfer)")
        handles = [b2.patches[0], b1.patches[0]]
        _xaxis(ax, g, axis)
        if title:
            ax.set_title(title)
    axes[0][0].set_ylabel("Share of prompt tokens\n(first admissions)")
    axes[0][0].set_ylim(0, max(max(tops) * 1.18, 0.02))
    legend = [fs.section("prompt tokens hit in"), *handles]
    if bound is not None:
        legend += fs.style_handles([("infinite cache\n(upper bound)", "--", fs.REFERENCE_COLOR)])
    legend += seq_handle
    legend.append(fs.note("over each bar: GPU + CPU"))
    return fs.finish(fig, f"{d.name}: prompt-token hits by source vs CPU tier size", legend)


def cpu_tier_ttft(d: SweepData) -> Figure | None:
    axis = tier_axis(d)
    if axis is None or not all(c in d.df for c, _ in _TTFT):
        return None
    rows = _sizes(d, axis)
    groups = _groups(d, axis, rows)
    colors = fs.colors(len(groups))
    marks = fs.line_marks(len(groups))
    fig, axes = fs.grid(1, len(_TTFT), w=3.9, h=3.4, sharey=False)
    for ax, (col, name) in zip(axes[0], _TTFT):  # each percentile on its own linear scale from 0
        for (_, g), c, m in zip(groups, colors, marks):
            ax.plot(g["_x"], g[col], "-", color=c, **m)
        top = float(np.nanmax(rows[col].to_numpy(dtype=float)))
        ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
        heading = _legend_names(groups)[0]  # lines within 0.2 % of the largest value: drawn on top of each other
        fs.note_coinciding(ax, [g[col].to_numpy(dtype=float) for _, g in groups],
                           "policies" if heading == "policy" else "configs", tol=0.002 * top)
        _xaxis(ax, rows, axis)
        ax.set_title(name)
        ax.set_ylabel(f"{name} (s)")
    handles: list[Any] = []
    if len(groups) > 1:
        heading, names = _legend_names(groups)
        handles = [fs.section(heading), *fs.mark_handles(list(zip(names, colors)))]
    return fs.finish(fig, f"{d.name}: time to first token vs CPU tier size", handles)
