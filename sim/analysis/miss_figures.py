"""Stacked miss causes of a sweep: where every prompt token went -- hit at first admission, or
missed for one cause of :mod:`sim.replay.attribution` -- against block size, pool capacity and
salt policy, beside (below) the hit rate itself.

Mirrors nothing in vLLM. Each bar is one sweep point: its bottom segment is
``first_admission_token_hit_rate``, the segments above it the ``miss_attribution.<cause>`` columns
(the summary's token-weighted breakdown, flattened into the sweep table) over ``prompt_tokens``, so
a bar is exactly 1 (a test checks it): the hit-rate curve of ``hit_rate_figures`` is the top of the
bottom segment, and the causes say what the rest lost -- ``partial_block`` growing with the block
size, ``evicted`` with a smaller pool, ``isolation`` with a finer salt policy.

* ``miss_causes_vs_block_size``: one panel per config and capacity (at the first salt policy);
* ``miss_causes_vs_capacity``: one panel per config (at the smallest block size, first salt policy);
* ``miss_causes_vs_salt_policy``: one panel per config (smallest block size, largest capacity and,
  with a tenant axis, the largest tenant count).

Every held value is named in the panel title (a bar is one point, never an average). Invariants: a
builder returns None when the sweep lacks its x axis or was run without ``replay.attribution``; it
never saves. Imports matplotlib artists through ``sim.analysis.figure_style`` only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from sim.analysis import figure_style as fs
from sim.analysis.sweep_data import SweepData, num_label

HIT = "first_admission_token_hit_rate"
CAUSES = ("partial_block", "last_token", "isolation", "evicted", "in_flight", "unreachable", "skip", "eagle",
          "routed_away", "cold")
"""Stacking order (bottom up, above the hits): the configuration losses first, then the timeline
ones, a fleet's routing loss (``sim.cluster.fleet_attribution``; 0 for one engine), the compulsory
misses on top."""
_COLORS = dict(zip(("hit",) + CAUSES, ("#0072B2", "#E69F00", "#F0E442", "#CC79A7", "#D55E00", "#56B4E9",
                                       "#009E73", "0.55", "0.75", "#882255", "0.88")))


def fractions(rows: Any) -> dict[str, np.ndarray]:
    """Per row: the first-admission hit rate and each cause's share of the prompt tokens."""
    prompt = rows["prompt_tokens"].to_numpy(dtype=float)
    out = {"hit": rows[HIT].to_numpy(dtype=float)}
    for c in CAUSES:
        col = f"miss_attribution.{c}"
        if c == "routed_away" and col not in rows:
            continue  # one engine: no routing, no legend entry
        out[c] = rows[col].to_numpy(dtype=float) / prompt if col in rows else np.zeros(len(rows))
    return out


def _has(d: SweepData) -> bool:
    return "miss_attribution.cold" in d.df and bool(d.df["miss_attribution.cold"].notna().any())


def _stack(ax: Any, labels: list[str], rows: Any) -> list[Any]:
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    handles = []
    for name, v in fractions(rows).items():
        bars = ax.bar(x, v, bottom=bottom, color=_COLORS[name], width=0.7, edgecolor="white", linewidth=0.4)
        handle = bars.patches[0]  # a legend entry (an artist: figure_style's legend reads its gid)
        handle.set_label("hit (first admission)" if name == "hit" else f"miss: {name}")
        handles.append(handle)
        bottom += v
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 1)
    ax.set_ylabel("Share of prompt tokens")
    return handles


def _figure(d: SweepData, panels: list[tuple[str, Any]], x: str, xlabel: str, title: str) -> Figure | None:
    panels = [(t, rows.sort_values(x)) for t, rows in panels if not rows.empty]
    if not panels:
        return None
    fig, axes = fs.grid(1, len(panels), h=3.6, sharey=True)
    handles: list[Any] = []
    for ax, (t, rows) in zip(axes[0], panels):
        handles = _stack(ax, [num_label(v) if not isinstance(v, str) else v for v in rows[x]], rows) or handles
        ax.set_xlabel(xlabel)
        ax.set_title(t, fontsize=9)
    legend = [fs.section("prompt tokens"), *reversed(handles)]
    return fs.finish(fig, f"{d.name}: {title}", legend)


def _held(d: SweepData, rows: Any, *, block: bool = False, cap: bool = False, salt: bool = False,
          tenants: bool = False) -> tuple[Any, list[str]]:
    """``rows`` at the held values (smallest block, largest capacity, first salt, most tenants)."""
    said: list[str] = []
    if block and d.block:
        bs = d.blocks()[0]
        rows, said = rows[rows["block_size"] == bs], [*said, f"block {bs}"]
    if cap and d.cap:
        c = d.caps()[-1]
        rows, said = rows[rows[d.cap] == c], [*said, d.cap_title(c)]
    if salt and d.salt:
        s = d.salts()[0]
        rows, said = rows[rows[d.salt] == s], [*said, f"salt {s}"]
    if tenants and d.tenants:
        n = rows["num_tenants"].max()
        rows, said = rows[rows["num_tenants"] == n], [*said, f"{n} tenants"]
    return rows, said


def miss_causes_vs_block_size(d: SweepData) -> Figure | None:
    if not d.block or not _has(d):
        return None
    panels = []
    for cfg in d.configs:
        for cap in d.caps():
            rows, said = _held(d, d.where(**{"_config": cfg, d.cap or "": cap}), salt=True, tenants=True)
            panels.append(("\n".join([cfg, *filter(None, [d.cap_title(cap)]), *said]), rows))
    return _figure(d, panels, "block_size", "Block size (tokens)", "where prompt tokens go vs block size")


def miss_causes_vs_capacity(d: SweepData) -> Figure | None:
    if d.cap is None or d.df[d.cap].nunique() < 2 or not _has(d):
        return None
    panels = []
    for cfg in d.configs:
        rows, said = _held(d, d.where(_config=cfg), block=True, salt=True, tenants=True)
        panels.append(("\n".join([cfg, *said]), rows))
    return _figure(d, panels, d.cap, d.cap_label, "where prompt tokens go vs KV pool capacity")


def miss_causes_vs_salt_policy(d: SweepData) -> Figure | None:
    if not d.salt or d.df["salt_policy"].nunique() < 2 or not _has(d):
        return None
    order = {s: i for i, s in enumerate(d.salts())}
    panels = []
    for cfg in d.configs:
        rows, said = _held(d, d.where(_config=cfg), block=True, cap=True, tenants=True)
        rows = rows.assign(_salt_order=rows["salt_policy"].map(order))
        panels.append(("\n".join([cfg, *said]), rows.sort_values("_salt_order")))
    panels = [(t, r) for t, r in panels if not r.empty]
    if not panels:
        return None
    fig, axes = fs.grid(1, len(panels), h=3.6, sharey=True)
    handles: list[Any] = []
    for ax, (t, rows) in zip(axes[0], panels):
        handles = _stack(ax, [str(s) for s in rows["salt_policy"]], rows)
        ax.set_xlabel("Salt policy")
        ax.tick_params(axis="x", labelrotation=20)
        ax.set_title(t, fontsize=9)
    return fs.finish(fig, f"{d.name}: where prompt tokens go vs salt policy", [fs.section("prompt tokens"),
                                                                              *reversed(handles)])
