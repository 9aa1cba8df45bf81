"""Hit-rate figures of a sweep: the first-admission token hit rate against block size and pool
capacity, beside the offline references that count the same way.

Mirrors nothing in vLLM. Like is compared with like: the simulated curve is
``first_admission_token_hit_rate`` (hit tokens granted at each request's first admission over
prompt tokens), and the references of ``workloads.bounds`` count each request once at its lookup
too: the infinite cache (dashed) and Belady at the same capacity (dotted). vLLM's
``prefix_cache_hit_rate``, which also counts the repeated lookups of waiting requests, is not
drawn against them.

* ``hit_rate_vs_block_size``: one curve per config, one panel per capacity (rows: salt policies);
* ``hit_rate_vs_capacity``: against capacity (log axis), one curve per block size, one panel per
  config (rows: salt policies); the infinite cache does not depend on capacity (a flat line).

Each y range is fitted to the curves and references it shows (``fit_ylim``): shared by a row of
panels against block size (the same configs at other capacities), one per panel against capacity
(one config each).

Invariants: a builder returns None when the sweep lacks its x axis; it never saves (the caller
does). Imports matplotlib artists through ``sim.analysis.figure_style`` only.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from sim.analysis import figure_style as fs
from sim.analysis.sweep_data import SweepData

HIT_RATE = "first_admission_token_hit_rate"
BOUND_STYLE: dict[str, fs.LineStyle] = {"infinite_cache_hit_rate": "--", "belady_hit_rate": ":"}
BOUND_LABEL = {"infinite_cache_hit_rate": "infinite cache (upper bound)",
               "belady_hit_rate": "Belady, same pool (optimal eviction)"}
HIT_RATE_LABEL = "First-admission token hit rate\n(hit tokens / prompt tokens)"


def _bounds(d: SweepData) -> list[str]:
    return [b for b in BOUND_STYLE if b in d.df and d.df[b].notna().any()]


def _references(ax: Any, x: Any, rows: Any, bounds: list[str], color: Any) -> None:
    """The reference lines of one curve: Belady wide and dotted below the thin dashed infinite cache,
    so that where the two are equal the dots still show between the dashes."""
    for b in sorted(bounds, key=lambda b: b != "belady_hit_rate"):
        ax.plot(x, rows[b], BOUND_STYLE[b], color=color, lw=2.0 if b == "belady_hit_rate" else 1.1, alpha=0.85)


def _legend(d: SweepData, entries: list[Any], title: str, bounds: list[str]) -> list[Any]:
    handles = [fs.section(title), *fs.mark_handles(entries), fs.section("line style")]
    handles += fs.style_handles([("simulated engine", "-", fs.REFERENCE_COLOR)])
    handles += fs.style_handles([(BOUND_LABEL[b], BOUND_STYLE[b], fs.REFERENCE_COLOR) for b in bounds])
    if len(bounds) == 2 and (((d.df[bounds[0]] - d.df[bounds[1]]).abs() < 1e-3) & (d.df[bounds[0]] > 0)).any():
        handles.append(fs.note("dots between dashes:\nBelady equals the infinite cache"))
    return handles


def hit_rate_vs_block_size(d: SweepData) -> Figure | None:
    if not d.block:
        return None
    salts, caps, blocks = d.salts(), d.caps(), d.blocks()
    colors = dict(zip(d.configs, fs.colors(len(d.configs))))
    marks = dict(zip(d.configs, fs.line_marks(len(d.configs))))
    fig, axes = fs.grid(len(salts), len(caps), sharey="row")
    bounds = _bounds(d)
    for i, salt in enumerate(salts):
        drawn: list[Any] = []
        for j, cap in enumerate(caps):
            ax = axes[i][j]
            sub = d.where(**{d.salt or "": salt, d.cap or "": cap}) if (d.salt or d.cap) else d.df
            curves = []
            for cfg in d.configs:
                c = sub[sub["_config"] == cfg].sort_values("block_size")
                if c.empty:
                    continue
                ax.plot(c["block_size"], c[HIT_RATE], "-", color=colors[cfg], **marks[cfg])
                _references(ax, c["block_size"], c, bounds, colors[cfg])
                drawn += [c[HIT_RATE], *(c[b] for b in bounds)]
                curves.append(c[HIT_RATE].to_numpy())
            fs.note_coinciding(ax, curves, "configs")
            fs.log2_axis(ax, blocks)
            ax.set_xlabel("Block size (tokens)")
            if j == 0:
                ax.set_ylabel(HIT_RATE_LABEL)
            title = d.cap_title(cap)
            if d.salt:
                title = f"{title}\nsalt policy: {salt}" if title else f"salt policy: {salt}"
            ax.set_title(title)
        fs.fit_ylim(axes[i][0], drawn)
    handles = _legend(d, [(cfg, colors[cfg]) for cfg in d.configs], "config", bounds)
    return fs.finish(fig, f"{d.name}: first-admission token hit rate vs block size", handles)


def hit_rate_vs_capacity(d: SweepData) -> Figure | None:
    if d.cap is None or d.df[d.cap].nunique() < 2:
        return None
    cap_col = d.cap
    salts, caps, blocks = d.salts(), d.caps(), d.blocks()
    colors: dict[Any, Any] = dict(zip(blocks, fs.colors(len(blocks))))
    marks = dict(zip(blocks, fs.line_marks(len(blocks))))
    fig, axes = fs.grid(len(salts), len(d.configs), sharey=False)  # configs differ in scale: one range each
    bounds = _bounds(d)
    for i, salt in enumerate(salts):
        for j, cfg in enumerate(d.configs):
            drawn: list[Any] = []
            ax = axes[i][j]
            of_cfg = d.df[d.df["_config"] == cfg]
            sub = d.where(of_cfg, **{d.salt or "": salt}) if d.salt else of_cfg
            curves = []
            for bs in blocks:
                c = sub[sub["block_size"] == bs].sort_values(cap_col)
                if c.empty:
                    continue
                ax.plot(c[cap_col], c[HIT_RATE], "-", color=colors[bs], **marks[bs])
                _references(ax, c[cap_col], c, bounds, colors[bs])
                drawn += [c[HIT_RATE], *(c[b] for b in bounds)]
                curves.append(c[HIT_RATE].to_numpy())
            fs.note_coinciding(ax, curves, "block sizes")
            fs.log_axis(ax, caps)
            ax.set_xlabel(d.cap_label + ", log scale")
            if j == 0:
                ax.set_ylabel(HIT_RATE_LABEL)
            ax.set_title(f"{cfg}" + (f"\nsalt policy: {salt}" if d.salt else ""))
            fs.fit_ylim(ax, drawn)
    handles = _legend(d, [(f"{bs} tokens", colors[bs]) for bs in blocks], "block size", bounds)
    return fs.finish(fig, f"{d.name}: first-admission token hit rate vs KV pool capacity", handles)
