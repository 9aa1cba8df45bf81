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
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sim.core.executor import Executor
from sim.core.scheduler import Scheduler
from sim.experiment.config import ConfigError, ExperimentConfig, config_to_dict
from sim.experiment.engine_description import EngineDescription, gpu_spec, model_spec, resolve
from sim.experiment.kv_worker import build_kv_worker
from sim.experiment.results import run_metadata, write_results
from sim.experiment.results_folder import ResultsFolder
from sim.experiment.workload import build_workload
from sim.replay.engine import Replay, ReplayResult
from sim.timing.fitted_latency import FittedLatency
from sim.timing.latency import FixedLatency, LatencyModel
from sim.timing.roofline import RooflineLatency
from sim.timing.simulated_executor import SimulatedExecutor
from sim.timing.step_noise import StepNoise
from workloads.registry import Workload
from workloads.trace_format import TraceRequest


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
    """The ``sim`` executor: step times from the config's latency model, times the step jitter of
    ``latency.noise`` when set (its own stream: ``noise.seed``, default the experiment seed)."""
    noise = cfg.latency.noise
    jitter = None if noise is None else StepNoise(noise.sigma, noise.seed if noise.seed is not None else cfg.seed)
    return SimulatedExecutor(build_latency(cfg), jitter)


def _progress_enabled(cfg: ExperimentConfig, progress: bool | None) -> bool:
    if progress is not None:
        return progress
    if cfg.replay.progress == "auto":
        return sys.stderr.isatty()
    return bool(cfg.replay.progress)


ExecutorFactory = Callable[[ExperimentConfig, Scheduler], Executor]
"""Builds the executor for a scheduler: :func:`simulated_executor`, or one named in
``sim.experiment.executor`` (``torch``: ``gpu_backend.executor.factory.make_torch_executor``)."""


def replay_experiment(
    cfg: ExperimentConfig,
    *,
    progress: bool | None = None,
    executor_factory: ExecutorFactory | None = None,
    engine: EngineDescription | None = None,
    requests: Callable[[Workload], Iterable[TraceRequest]] | None = None,
    workload: Workload | None = None,
    **replay_kwargs: Any,
) -> tuple[ReplayResult, Workload]:
    """Build everything and replay (no files written). ``executor_factory`` replaces the
    simulated executor (latency model) by another one, e.g. real forward passes; ``engine`` is
    ``cfg``'s resolved engine when the caller has it already; ``requests`` turns the workload into
    the stream replayed (default: the workload's own requests), e.g. to add other parties'
    requests (``sim.experiment.sidechannel``); ``workload`` is ``cfg``'s workload when the caller
    has built it already (a sweep worker's shared stream, ``sim.experiment.workload.shared_workload``;
    one engine only). A config with a ``cluster:`` section replays its
    fleet (``sim.experiment.cluster_run``; the result is a ``ClusterResult``)."""
    if cfg.cluster is not None:
        from sim.experiment.cluster_run import replay_cluster

        if requests is not None:
            raise ConfigError(f"{cfg.source}: cluster: a cluster replay takes no side-channel stream (one engine only)")
        fleet, workload = replay_cluster(cfg, executor_factory or simulated_executor, build_latency, **replay_kwargs)
        fleet.summary["skipped_bad_lines"] = workload.reader.skipped if workload.reader is not None else 0
        fleet.summary["vllm_version"] = cfg.engine.vllm_version
        return fleet, workload
    engine = engine if engine is not None else resolve(cfg)
    scheduler = build_scheduler(engine)
    executor = (executor_factory or simulated_executor)(cfg, scheduler)
    workload = workload if workload is not None else build_workload(cfg, engine)
    replay = Replay(
        scheduler,
        executor,
        workload.requests if requests is None else requests(workload),
        fast_forward=cfg.replay.fast_forward,
        progress=_progress_enabled(cfg, progress),
        total=workload.total,
        record_events=cfg.replay.record_events,
        reject_invalid=cfg.replay.on_invalid_request == "reject",
        attribution=cfg.replay.attribution,
        kv_worker=build_kv_worker(engine),
        **replay_kwargs,
    )
    result = replay.run()
    describe = getattr(executor, "describe", None)
    if callable(describe):
        workload.executor_info = describe()
    # what the loaders skipped (skip_bad_lines) is part of the result: summary.json, sweep rows
    result.summary["skipped_bad_lines"] = workload.reader.skipped if workload.reader is not None else 0
    # whose metric semantics the summary follows (prefix_cache: every lookup, or each admission)
    result.summary["vllm_version"] = cfg.engine.vllm_version
    return result, workload


def engine_facts(cfg: ExperimentConfig, engine: EngineDescription) -> dict[str, Any]:
    """The resolved engine as ``summary.json`` records it (key ``engine``)."""
    return {
        "model": cfg.model, "gpu": cfg.gpu, "block_size": engine.block_size,
        "num_gpu_blocks": engine.num_gpu_blocks, "capacity_tokens": engine.capacity_tokens,
        "kv_pool_gib": engine.kv_pool_gib, "max_model_len": engine.max_model_len,
        "num_kv_groups": len(engine.kv_groups),
        "enable_prefix_caching": engine.cache_config.enable_prefix_caching,
        "vllm_version": engine.profile.version,
        **_tier_facts(engine),
    }


def _tier_facts(engine: EngineDescription) -> dict[str, Any]:
    """The CPU offload tier as ``summary.json`` records it (nothing without a tier)."""
    tier = engine.offload
    if tier is None:
        return {}
    return {"cpu_tier": {
        "num_chunks": tier.num_cpu_chunks, "blocks_per_chunk": tier.blocks_per_chunk,
        "capacity_tokens": engine.cpu_tier_capacity_tokens, "gib": engine.cpu_tier_gib, "policy": tier.policy,
        "offload_prompt_only": tier.offload_prompt_only, "store_threshold": tier.store_threshold,
        "link_gb_s": engine.offload_bandwidth_gb_s, "link_latency_s": engine.offload_link_latency_s,
        "link_source": engine.offload_link_source, "link_duplex": engine.offload_link_duplex,
    }}


def run_experiment(
    cfg: ExperimentConfig,
    *,
    out: str | Path | None = None,
    progress: bool | None = None,
    executor_factory: ExecutorFactory | None = None,
    bounds: bool = False,
    extras: Callable[[Path, ReplayResult], None] | None = None,
) -> tuple[ReplayResult, Path]:
    """Replay ``cfg`` and write its results folder; returns the result and the folder.
    ``extras(folder, result)`` adds files of the caller's (e.g. figures) inside the folder before
    it is swapped in.

    The summary gains the resolved engine (``engine``) and, with ``bounds``, the offline references
    of ``sim.experiment.bounds`` over the replay's own stream (``infinite_cache_hit_rate``,
    ``belady_hit_rate``, ``lru_sequential_hit_rate`` and the diagnosis references); their wall time
    goes to ``meta.json`` (``bounds_wall_time_s``).

    The folder (``out``, default ``<output_dir>/<name>``) is checked and locked before the replay
    and replaced whole at the end (``sim.experiment.results_folder``): an unwritable location or
    a concurrent run on it fails at once (``ResultsError``), and SIGINT raises ``RunInterrupted``
    saying what the folder holds."""
    engine = resolve(cfg)
    with ResultsFolder(Path(out) if out is not None else cfg.results_dir()) as target:
        result, workload = replay_experiment(cfg, progress=progress, executor_factory=executor_factory, engine=engine)
        result.summary["engine"] = engine_facts(cfg, engine)
        extra: dict[str, Any] = {"workload": workload.description, "vllm_version": engine.profile.version}
        if bounds:
            from sim.experiment.bounds import limit_references, run_references

            t0 = time.perf_counter()
            refs = run_references(cfg, engine)
            if cfg.cluster is None:  # the diagnosis references model one engine's pool
                refs.update(limit_references(cfg, engine, refs["infinite_cache_hit_rate"]))
            result.summary.update(refs)
            extra["bounds_wall_time_s"] = time.perf_counter() - t0
        if workload.executor_info is not None:
            extra["executor"] = workload.executor_info
        if workload.summary_notes:  # e.g. a trace converted with the approximate tokenizer (workloads.registry)
            result.summary["workload_notes"] = list(workload.summary_notes)
        if workload.reader is not None:
            extra["skipped_bad_lines"] = workload.reader.skipped
            extra["skipped_line_numbers"] = workload.reader.skipped_lines
        folder = write_results(
            target.final,
            config=config_to_dict(cfg),
            requests=result.request_table,
            steps=result.step_table,
            summary=result.summary,
            meta=run_metadata(result.wall_time_s, extra),
            events=result.events or None if cfg.cluster is None else None,
            tables=cfg.replay.tables,
            folder=target,
            blocks=result.blocks,
            extras=lambda d: _write_extras(cfg, result, d, extras),
        )
    return result, folder


def _write_extras(cfg: ExperimentConfig, result: ReplayResult, folder: Path,
                  extras: Callable[[Path, ReplayResult], None] | None) -> None:
    if cfg.cluster is not None:
        from sim.experiment.cluster_run import write_cluster_extras

        write_cluster_extras(folder, result)  # type: ignore[arg-type]  # a ClusterResult (replay_experiment)
    if extras is not None:
        extras(folder, result)
