"""A config's workload: its request stream (``workloads.registry``) and its statistics
(``workloads.stats``), with problems reported against the config file.

Mirrors nothing in vLLM. Invariants: the workload sees only its ``workload:`` section, the
experiment seed, the config's folder and the scheduler block size of the resolved engine
(:mod:`sim.experiment.engine_description`); a :class:`~workloads.errors.WorkloadConfigError`
comes back as :class:`~sim.experiment.config.ConfigError` ``<file>: workload.<key>: <problem>``.

:func:`shared_workload` is the same workload with its stream materialised once per process and
handed out again (the points of a sweep that differ only in engine settings replay one stream, so
a sweep worker builds it once): the stream depends on the ``workload:`` section, the seed and the
folder only (the block size changes only the description), and nothing downstream mutates a
built :class:`~workloads.trace_format.TraceRequest` (the replay and the bounds read them).
Imports neither simpy nor torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from sim.experiment.config import ConfigError, ExperimentConfig, config_to_dict
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


_SHARED: OrderedDict[str, Workload] = OrderedDict()
_SHARED_SIZE = 4
"""Streams :func:`shared_workload` keeps per process (least recently used dropped first)."""


def stream_key(cfg: ExperimentConfig, scope: str | None = None) -> str:
    """What a workload's stream depends on: its ``workload:`` section, the seed and the folder;
    ``scope`` names the run that may share it (the input files do not change within one)."""
    return json.dumps({"workload": config_to_dict(cfg)["workload"], "seed": cfg.seed, "base": cfg.base_dir,
                       "scope": scope}, sort_keys=True, default=str)


def shared_workload(cfg: ExperimentConfig, engine: EngineDescription | None = None, *, scope: str) -> Workload:
    """:func:`build_workload` with the stream materialised (a list) and kept for the next config
    with the same :func:`stream_key` in this process, within ``scope`` (one sweep run: a later run
    reads its input files again); the description is the one for ``engine``, the skip report the
    one filled while materialising (see the module docstring)."""
    fresh = build_workload(cfg, engine)  # lazy: reads nothing yet (the description for this engine)
    key = stream_key(cfg, scope)
    kept = _SHARED.get(key)
    if kept is None:
        for old in [k for k in _SHARED if json.loads(k)["scope"] != scope]:
            del _SHARED[old]  # an earlier run's streams
        kept = dataclasses.replace(fresh, requests=list(fresh.requests))
        _SHARED[key] = kept
        while len(_SHARED) > _SHARED_SIZE:
            _SHARED.popitem(last=False)
    else:
        _SHARED.move_to_end(key)
    return dataclasses.replace(fresh, requests=kept.requests, reader=kept.reader, source=kept.source)


def release_shared() -> None:
    """Drop the streams :func:`shared_workload` keeps (a sweep run in this process is over)."""
    _SHARED.clear()


def workload_stats(cfg: ExperimentConfig, block_sizes: Sequence[int] | None = None, *,
                   facts: bool = True) -> dict[str, Any]:
    """``workloads.stats.workload_stats`` of ``cfg``'s workload, the bound at ``block_sizes``
    (default: the engine's scheduler block size), with the source's facts unless ``facts=False``."""
    engine = resolve(cfg)
    wl = build_workload(cfg, engine)
    extra = stats.source_facts(cfg.workload, cfg.base_dir) if facts else None
    return stats.workload_stats(wl, list(block_sizes) if block_sizes else [engine.block_size], extra)
