"""``apcsim plot``: the standard figures of a sweep folder, as PNG and SVG beside its table.

Mirrors nothing in vLLM. The registry of figures and the command's one verb (``plot_sweep``);
the figures live in ``hit_rate_figures``, ``ttft_figures`` and ``salt_figure``, the sweep's table
and axis roles in ``sweep_data``, the style in ``figure_style``:

* ``hit_rate_vs_block_size`` -- vLLM's ``token_hit_rate`` vs block size, one curve per config, one
  panel per capacity (rows: salt policies), with the offline references of
  ``workloads.bounds``;
* ``hit_rate_vs_capacity`` -- the same against capacity (log axis), one curve per block size;
* ``ttft_vs_block_size`` / ``ttft_vs_capacity`` -- TTFT p50 and p99, at the first salt policy;
* ``ttft_cdf`` -- the TTFT distribution of every (config, capacity) panel, one curve per block size;
* ``salt_policy`` -- hit rate, TTFT p50 and p99 per salt policy;
* ``cluster_vs_replicas`` / ``cluster_vs_load`` -- routers against replica count and load
  (``cluster_figures``).
* ``miss_causes_vs_block_size`` / ``_vs_capacity`` / ``_vs_salt_policy`` -- the hit rate and the
  stacked miss causes (``miss_figures``; sweeps run with ``replay.attribution``).
* ``cpu_tier_hit_rate`` / ``cpu_tier_ttft`` -- prompt-token hits by source (GPU, CPU tier) and TTFT
  p50/p90 against the CPU offload tier's size (``tier_figures``; sweeps over
  ``engine.kv_offloading_size`` or ``engine.num_cpu_blocks``).

Invariants: a figure whose x axis was not swept is skipped; failed points are left out; files are
written atomically. Reads result tables only: imports no simpy and never re-runs the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from matplotlib.figure import Figure

from sim.analysis.cluster_figures import cluster_vs_load, cluster_vs_replicas
from sim.analysis.figure_style import draw_figures, png_bytes, save_figure
from sim.analysis.hit_rate_figures import hit_rate_vs_block_size, hit_rate_vs_capacity
from sim.analysis.miss_figures import miss_causes_vs_block_size, miss_causes_vs_capacity, miss_causes_vs_salt_policy
from sim.analysis.salt_figure import salt_policy
from sim.analysis.sweep_data import SweepData
from sim.analysis.tier_figures import cpu_tier_hit_rate, cpu_tier_ttft
from sim.analysis.ttft_figures import ttft_cdf, ttft_vs_block_size, ttft_vs_capacity

__all__ = [
    "FIGURES", "SweepData", "hit_rate_vs_block_size", "hit_rate_vs_capacity", "plot_sweep", "png_bytes",
    "salt_policy", "save_figure", "ttft_cdf", "ttft_vs_block_size", "ttft_vs_capacity",
]

FIGURES: dict[str, Callable[[SweepData], Figure | None]] = {
    "hit_rate_vs_block_size": hit_rate_vs_block_size,
    "hit_rate_vs_capacity": hit_rate_vs_capacity,
    "ttft_vs_block_size": ttft_vs_block_size,
    "ttft_vs_capacity": ttft_vs_capacity,
    "ttft_cdf": ttft_cdf,
    "salt_policy": salt_policy,
    "cluster_vs_replicas": cluster_vs_replicas,
    "cluster_vs_load": cluster_vs_load,
    "miss_causes_vs_block_size": miss_causes_vs_block_size,
    "miss_causes_vs_capacity": miss_causes_vs_capacity,
    "miss_causes_vs_salt_policy": miss_causes_vs_salt_policy,
    "cpu_tier_hit_rate": cpu_tier_hit_rate,
    "cpu_tier_ttft": cpu_tier_ttft,
}
"""Every figure: file stem -> builder (``builder(SweepData) -> Figure | None``, None when the sweep
lacks the axes it needs)."""


def plot_sweep(folder: str | Path) -> list[Path]:
    """Draw every applicable figure of a sweep folder; returns the files written."""
    d = SweepData(Path(folder))
    return [] if d.df.empty else draw_figures(FIGURES, d, d.folder)
