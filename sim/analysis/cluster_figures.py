"""Cluster figures: routers against replica count and against load (sweeps), and one run's
per-replica load timeline.

Mirrors nothing in vLLM. From a sweep table of cluster points (``cluster.*`` columns of the
summary, see ``sim.cluster.cluster_summary``):

* ``cluster_vs_replicas`` -- ``token_hit_rate``, TTFT p50 and TTFT p99 against
  ``cluster.num_replicas``, one curve per router (the ``cluster.router`` axis label, else the
  router kind);
* ``cluster_vs_load`` -- the same against the swept load knob (``workload.arrival.rate_scale``,
  ``workload.time_scale`` -- larger is *less* load -- or ``workload.arrival.rate``);

and from one run's step table (``replica``, ``start``, ``duration``, ``scheduled_tokens``, ``kv_usage``):

* :func:`replica_load_timeline` -- per replica and time bin (heat maps): the share of the step
  token budget its steps scheduled and the share of its KV pool in use -- not a "busy" fraction,
  which calls a replica decoding one request fully busy --, and below them the number of running
  requests summed over the fleet.

Invariants: a sweep figure is None when its x axis has fewer than two values; builders never save.
Imports matplotlib artists through ``sim.analysis.figure_style`` only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.analysis import figure_style as fs
from sim.analysis.sweep_data import SweepData, num_label

_METRICS = (("token_hit_rate", "token hit rate (vLLM)", False), ("ttft_p50_s", "TTFT p50 (s)", True),
            ("ttft_p99_s", "TTFT p99 (s)", True))
LOAD_KEYS = ("workload.arrival.rate_scale", "workload.time_scale", "workload.arrival.rate")


def router_labels(df: pd.DataFrame) -> pd.Series:
    """One label per row: the ``cluster.router`` axis label, else kind (and llm-d's prefix mode)."""
    if "cluster.router" in df.columns:
        return df["cluster.router"].astype(str)
    kind = df.get("cluster.router.kind", pd.Series("single", index=df.index)).astype(str)
    if "cluster.router.prefix" in df.columns:
        prefix = df["cluster.router.prefix"]
        kind = kind.where(prefix.isna(), kind + " " + prefix.astype(str))
    return kind


def _against(d: SweepData, x: str, xlabel: str, title: str) -> Figure | None:
    df = d.df
    if x not in df.columns or df[x].nunique() < 2:
        return None
    df = df.assign(_router=router_labels(df))
    routers = list(dict.fromkeys(df["_router"]))
    colors = dict(zip(routers, fs.colors(len(routers))))
    fig, axes = fs.grid(1, len(_METRICS), sharey=False)
    xs = sorted(df[x].unique())
    for j, (col, name, timing) in enumerate(_METRICS):
        ax = axes[0][j]
        if timing:
            fs.time_axis(ax, "y", df[col])
        for r in routers:
            c = df[df["_router"] == r].groupby(x, as_index=False)[col].mean().sort_values(x)
            ax.plot(c[x], c[col], "-o", color=colors[r], ms=4, lw=1.8)
        ax.set_xticks(xs, [num_label(v) for v in xs])
        ax.set_xlabel(xlabel)
        ax.set_title(name)
    handles = fs.style_handles([(r, "-", colors[r]) for r in routers])
    return fs.finish(fig, f"{d.name}: {title}", handles)


def cluster_vs_replicas(d: SweepData) -> Figure | None:
    return _against(d, "cluster.num_replicas", "replicas", "routers vs replica count")


def cluster_vs_load(d: SweepData) -> Figure | None:
    for key in LOAD_KEYS:
        if key in d.axes:
            note = " (larger = less load)" if key == "workload.time_scale" else ""
            return _against(d, key, key.split(".")[-1] + note, "routers vs load")
    return None


def replica_load_timeline(steps: pd.DataFrame, title: str, token_budget: int, bins: int = 120) -> Figure:
    """What a capacity planner reads, per replica and time bin (see the module docstring): the share
    of the step token budget (``max_num_batched_tokens``) the replica's steps scheduled, averaged
    over the bin's time (an idle replica counts 0), and its KV-pool use (vLLM's ``kv_usage`` after
    each step, time-weighted); below them the fleet's running requests."""
    end = float((steps["start"] + steps["duration"]).max()) if len(steps) else 1.0
    edges = np.linspace(0.0, max(end, 1e-9), bins + 1)
    width = edges[1] - edges[0]
    n = int(steps["replica"].max()) + 1 if len(steps) else 1
    idx = np.clip(np.searchsorted(edges, steps["start"].to_numpy(), side="right") - 1, 0, bins - 1)
    rep, dur = steps["replica"].to_numpy(dtype=int), steps["duration"].to_numpy()
    budget, pool, running = np.zeros((n, bins)), np.zeros((n, bins)), np.zeros(bins)
    np.add.at(budget, (rep, idx), steps["scheduled_tokens"].to_numpy() / max(token_budget, 1) * dur)
    np.add.at(pool, (rep, idx), steps["kv_usage"].to_numpy() * dur)
    np.add.at(running, idx, steps["running"].to_numpy() * dur)
    fig, axes = fs.grid(3, 1, w=9.0, h=2.4, sharey=False)
    for ax, values, label, name in ((axes[0][0], budget, "token budget used", "step token budget used"),
                                    (axes[1][0], pool, "KV pool used", "KV-cache pool used")):
        im = ax.imshow(np.clip(values / width, 0, 1), aspect="auto", origin="lower", cmap="viridis",
                       extent=(0.0, float(edges[-1]), -0.5, n - 0.5), vmin=0, vmax=1)
        fig.colorbar(im, ax=ax, label=label)
        ax.set_ylabel("replica")
        ax.set_yticks(range(0, n, max(1, n // 16)))
        ax.set_title(f"{name} per replica (share of max_num_batched_tokens = {token_budget:,})"
                     if values is budget else f"{name} per replica (vLLM kv_usage)")
    ax3 = axes[2][0]
    ax3.plot((edges[:-1] + edges[1:]) / 2, running / width, lw=1.5)
    ax3.set_xlabel("simulated time (s)")
    ax3.set_ylabel("running requests (fleet)")
    ax3.set_xlim(0.0, float(edges[-1]))
    ax3.set_ylim(bottom=0)
    return fs.finish(fig, title, [])
