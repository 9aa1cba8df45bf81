"""A config's workload: its request stream (``workloads.registry``) and its statistics
(``workloads.stats``), with problems reported against the config file.

Mirrors nothing in vLLM. Invariants: the workload sees only its ``workload:`` section, the
experiment seed, the config's folder and the scheduler block size of the resolved engine
(:mod:`sim.experiment.engine_description`); a :class:`~workloads.errors.WorkloadConfigError`
comes back as :class:`~sim.experiment.config.ConfigError` ``<file>: workload.<key>: <problem>``.
Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.experiment.config import ConfigError, ExperimentConfig
from sim.experiment.engine_description import EngineDescription, resolve
from workloads import registry, stats
from workloads.errors import WorkloadConfigError
from workloads.registry import Workload


def build_workload(cfg: ExperimentConfig, engine: EngineDescription | None = None) -> Workload:
    """The workload of ``cfg`` (``engine``: its resolved engine, resolved here when not given)."""
    block_size = (engine if engine is not None else resolve(cfg)).block_size
    try:
        return registry.build_workload(cfg.workload, seed=cfg.seed, base_dir=cfg.base_dir, block_size=block_size)
    except WorkloadConfigError as exc:
        raise ConfigError(f"{cfg.source}: {exc}") from None


def workload_stats(cfg: ExperimentConfig, block_sizes: Sequence[int] | None = None, *,
                   facts: bool = True) -> dict[str, Any]:
    """``workloads.stats.workload_stats`` of ``cfg``'s workload, the bound at ``block_sizes``
    (default: the engine's scheduler block size), with the source's facts unless ``facts=False``."""
    engine = resolve(cfg)
    wl = build_workload(cfg, engine)
    extra = stats.source_facts(cfg.workload, cfg.base_dir) if facts else None
    return stats.workload_stats(wl, list(block_sizes) if block_sizes else [engine.block_size], extra)
