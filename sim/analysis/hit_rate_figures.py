"""Hit-rate figures of a sweep: vLLM's ``token_hit_rate`` against block size and pool capacity.

Mirrors nothing in vLLM; plots the ``token_hit_rate`` column (prefix-cache hits over queries, as
vLLM's ``PrefixCacheStats`` counts them) next to the offline references of
``workloads.bounds`` (request-level: infinite cache dashed, Belady at the same capacity
dotted).

* ``hit_rate_vs_block_size``: one curve per config, one panel per capacity (rows: salt policies);
* ``hit_rate_vs_capacity``: against capacity (log axis), one curve per block size, one panel per
  config.

Invariants: a builder returns None when the sweep lacks its x axis; it never saves (the caller
does). Imports matplotlib artists through ``sim.analysis.figure_style`` only.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from sim.analysis import figure_style as fs
from sim.analysis.sweep_data import SweepData

BOUND_STYLE: dict[str, fs.LineStyle] = {"infinite_cache_hit_rate": "--", "belady_hit_rate": ":"}
HIT_RATE_LABEL = "Hit rate (fraction of prompt tokens)"


def hit_rate_vs_block_size(d: SweepData) -> Figure | None:
    if not d.block:
        return None
    salts, caps, blocks = d.salts(), d.caps(), d.blocks()
    colors = dict(zip(d.configs, fs.colors(len(d.configs))))
    fig, axes = fs.grid(len(salts), len(caps))
    bounds = [b for b in BOUND_STYLE if b in d.df and d.df[b].notna().any()]
    for i, salt in enumerate(salts):
        for j, cap in enumerate(caps):
            ax = axes[i][j]
            sub = d.where(**{d.salt or "": salt, d.cap or "": cap}) if (d.salt or d.cap) else d.df
            for cfg in d.configs:
                c = sub[sub["_config"] == cfg].sort_values("block_size")
                if c.empty:
                    continue
                ax.plot(c["block_size"], c["token_hit_rate"], "-o", color=colors[cfg], ms=4, lw=1.8)
                for b in bounds:
                    ax.plot(c["block_size"], c[b], BOUND_STYLE[b], color=colors[cfg], lw=1.3, alpha=0.85)
            fs.log2_axis(ax, blocks)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("Block size (tokens per block)")
            if j == 0:
                ax.set_ylabel(HIT_RATE_LABEL)
            title = d.cap_title(cap)
            if d.salt:
                title = f"{title}\nsalt policy: {salt}" if title else f"salt policy: {salt}"
            ax.set_title(title)
    handles = fs.style_handles([(cfg, "-", colors[cfg]) for cfg in d.configs])
    handles += fs.style_handles([("simulated vLLM LRU (token_hit_rate)", "-", "0.3")])
    if "infinite_cache_hit_rate" in bounds:
        handles += fs.style_handles([("infinite cache (request-level bound)", "--", "0.3")])
    if "belady_hit_rate" in bounds:
        handles += fs.style_handles([("Belady offline optimal, same capacity", ":", "0.3")])
    return fs.finish(fig, f"{d.name}: prefix-cache hit rate vs block size", handles, ncol=min(len(handles), 4))


def hit_rate_vs_capacity(d: SweepData) -> Figure | None:
    if d.cap is None or d.df[d.cap].nunique() < 2:
        return None
    cap_col = d.cap
    salts, caps, blocks = d.salts(), d.caps(), d.blocks()
    colors: dict[Any, Any] = dict(zip(blocks, fs.colors(len(blocks), "viridis")))
    fig, axes = fs.grid(len(salts), len(d.configs))
    for i, salt in enumerate(salts):
        for j, cfg in enumerate(d.configs):
            ax = axes[i][j]
            of_cfg = d.df[d.df["_config"] == cfg]
            sub = d.where(of_cfg, **{d.salt or "": salt}) if d.salt else of_cfg
            for bs in blocks:
                c = sub[sub["block_size"] == bs].sort_values(cap_col)
                if c.empty:
                    continue
                ax.plot(c[cap_col], c["token_hit_rate"], "-o", color=colors[bs], ms=4, lw=1.8)
                if "belady_hit_rate" in c and c["belady_hit_rate"].notna().any():
                    ax.plot(c[cap_col], c["belady_hit_rate"], ":", color=colors[bs], lw=1.3)
            fs.log_axis(ax, caps)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel(d.cap_label + ", log scale")
            if j == 0:
                ax.set_ylabel(HIT_RATE_LABEL)
            ax.set_title(f"{cfg}" + (f"\nsalt policy: {salt}" if d.salt else ""))
    handles = fs.style_handles([(f"block size {bs}", "-", colors[bs]) for bs in blocks])
    handles += fs.style_handles([("simulated vLLM LRU (token_hit_rate)", "-", "0.3"),
                                 ("Belady offline optimal, same capacity", ":", "0.3")])
    return fs.finish(fig, f"{d.name}: prefix-cache hit rate vs KV pool capacity", handles,
                     ncol=min(len(handles), 5))
