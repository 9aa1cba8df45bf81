"""From a validated :class:`~sim.experiment.config.ExperimentConfig` to a results folder.

Mirrors vLLM's engine start-up (``EngineCore.__init__``: KV-cache sizing, then the scheduler) for
one simulated replica. ``build_*`` functions turn a config into objects: the scheduler from the
resolved engine (:func:`sim.experiment.engine_description.resolve`, the one place that derives
block sizes, pool size and ``max_model_len``), the latency model, the workload
(``sim.experiment.workload``); ``run_experiment`` replays and writes ``results/<name>/``.
Invariants: the engine is resolved once per run and every piece reads that description.
Configuration problems that only show once the pieces meet (a pool too small for
``max_model_len``, an unknown model) raise :class:`~sim.experiment.config.ConfigError` naming the
file and key. Imports neither torch nor gpu_backend: another executor (``--backend torch``)
comes in as an ``executor_factory`` from the registry ``sim.experiment.executor``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.core.executor import Executor
from sim.core.scheduler import Scheduler
from sim.experiment.config import ConfigError, ExperimentConfig, config_to_dict
from sim.experiment.engine_description import EngineDescription, gpu_spec, model_spec, resolve
from sim.experiment.results import run_metadata, write_results
from sim.experiment.workload import build_workload
from sim.replay.engine import Replay, ReplayResult
from sim.timing.fitted_latency import FittedLatency
from sim.timing.latency import FixedLatency, LatencyModel
from sim.timing.roofline import RooflineLatency
from sim.timing.simulated_executor import SimulatedExecutor
from workloads.registry import Workload


def build_scheduler(cfg: ExperimentConfig | EngineDescription) -> Scheduler:
    """The scheduler of a resolved engine (a config is resolved first)."""
    engine = cfg if isinstance(cfg, EngineDescription) else resolve(cfg)
    return Scheduler(engine.scheduler_config, engine.cache_config, engine.block_hasher())


def build_latency(cfg: ExperimentConfig) -> LatencyModel:
    lat = cfg.latency
    if lat.kind == "fixed":
        return FixedLatency(lat.step_time_s)
    if lat.kind == "fitted":
        try:
            return FittedLatency.from_file(cfg.resolve_path(lat.path))
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{cfg.source}: latency.path: {exc}") from None
    gpu = gpu_spec(cfg)  # the GPU first, then the model: the order its problems are reported in
    return RooflineLatency(model_spec(cfg), gpu, lat.overhead_s)


def simulated_executor(cfg: ExperimentConfig, scheduler: Scheduler) -> Executor:
    """The ``sim`` executor: step times from the config's latency model."""
    return SimulatedExecutor(build_latency(cfg))


def _progress_enabled(cfg: ExperimentConfig, progress: bool | None) -> bool:
    if progress is not None:
        return progress
    if cfg.replay.progress == "auto":
        return sys.stderr.isatty()
    return bool(cfg.replay.progress)


ExecutorFactory = Callable[[ExperimentConfig, Scheduler], Executor]
"""Builds the executor for a scheduler: :func:`simulated_executor`, or one named in
``sim.experiment.executor`` (``torch``: ``gpu_backend.factory.make_torch_executor``)."""


def replay_experiment(
    cfg: ExperimentConfig,
    *,
    progress: bool | None = None,
    executor_factory: ExecutorFactory | None = None,
    engine: EngineDescription | None = None,
    **replay_kwargs: Any,
) -> tuple[ReplayResult, Workload]:
    """Build everything and replay (no files written). ``executor_factory`` replaces the
    simulated executor (latency model) by another one, e.g. real forward passes; ``engine`` is
    ``cfg``'s resolved engine when the caller has it already. A config with a ``cluster:``
    section replays its fleet (``sim.experiment.cluster_run``; the result is a ``ClusterResult``)."""
    if cfg.cluster is not None:
        from sim.experiment.cluster_run import replay_cluster

        return replay_cluster(cfg, executor_factory or simulated_executor, build_latency, **replay_kwargs)
    engine = engine if engine is not None else resolve(cfg)
    scheduler = build_scheduler(engine)
    executor = (executor_factory or simulated_executor)(cfg, scheduler)
    workload = build_workload(cfg, engine)
    replay = Replay(
        scheduler,
        executor,
        workload.requests,
        fast_forward=cfg.replay.fast_forward,
        progress=_progress_enabled(cfg, progress),
        total=workload.total,
        record_events=cfg.replay.record_events,
        **replay_kwargs,
    )
    result = replay.run()
    describe = getattr(executor, "describe", None)
    if callable(describe):
        workload.executor_info = describe()
    return result, workload


def run_experiment(
    cfg: ExperimentConfig,
    *,
    out: str | Path | None = None,
    progress: bool | None = None,
    executor_factory: ExecutorFactory | None = None,
) -> tuple[ReplayResult, Path]:
    """Replay ``cfg`` and write its results folder; returns the result and the folder."""
    result, workload = replay_experiment(cfg, progress=progress, executor_factory=executor_factory)
    extra: dict[str, Any] = {"workload": workload.description}
    if workload.executor_info is not None:
        extra["executor"] = workload.executor_info
    if workload.reader is not None:
        extra["skipped_bad_lines"] = workload.reader.skipped
        extra["skipped_line_numbers"] = workload.reader.skipped_lines
    folder = write_results(
        Path(out) if out is not None else cfg.results_dir(),
        config=config_to_dict(cfg),
        requests=result.requests,
        steps=result.steps,
        summary=result.summary,
        meta=run_metadata(result.wall_time_s, extra),
        events=result.events or None if cfg.cluster is None else None,
    )
    if cfg.cluster is not None:
        from sim.experiment.cluster_run import write_cluster_extras

        write_cluster_extras(folder, result)  # type: ignore[arg-type]  # a ClusterResult (replay_experiment)
    return result, folder
