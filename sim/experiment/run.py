"""From a validated :class:`~sim.experiment.config.ExperimentConfig` to a results folder.

``build_*`` functions turn config sections into objects (scheduler, latency model, workload);
``run_experiment`` replays and writes ``results/<name>/``. Configuration problems that only show
once the pieces meet (a pool too small for ``max_model_len``, an unknown model) raise
:class:`~sim.experiment.config.ConfigError` naming the file and key.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.core.executor import Executor
from sim.core.hashing import make_block_hasher
from sim.core.kv_cache_spec import blocks_for_one_sequence, cdiv, resolve_block_sizes
from sim.core.scheduler import CacheConfig, Scheduler, SchedulerConfig
from sim.experiment.config import ConfigError, ExperimentConfig, config_to_dict
from sim.experiment.results import run_metadata, write_results
from sim.replay.engine import Replay, ReplayResult
from sim.timing.fitted_latency import FittedLatency
from sim.timing.latency import FixedLatency, LatencyModel
from sim.timing.roofline import ModelSpec, RooflineLatency, kv_cache_blocks, load_gpu_spec, load_model_spec
from sim.timing.simulated_executor import SimulatedExecutor
from workloads.registry import Workload, build_workload


def _source(cfg: ExperimentConfig) -> str:
    return cfg.source


def model_spec(cfg: ExperimentConfig) -> ModelSpec:
    try:
        return load_model_spec(cfg.model if not cfg.model.endswith((".yaml", ".yml")) else str(cfg.resolve_path(cfg.model)))
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{_source(cfg)}: model: {exc}") from None


def resolve_num_gpu_blocks(cfg: ExperimentConfig) -> int:
    """The pool size in blocks (null block included): given, from ``kv_cache_gib``, or from the GPU."""
    e = cfg.engine
    if e.num_gpu_blocks is not None:
        return e.num_gpu_blocks
    key = "engine.kv_cache_gib" if e.kv_cache_gib is not None else "gpu"
    try:
        gpu = load_gpu_spec(cfg.gpu if not cfg.gpu.endswith((".yaml", ".yml")) else str(cfg.resolve_path(cfg.gpu)))
        return kv_cache_blocks(
            model_spec(cfg),
            gpu,
            e.block_size,
            e.gpu_memory_utilization,
            e.kv_cache_gib,
            max_num_batched_tokens=e.max_num_batched_tokens,
        )
    except ValueError as exc:
        raise ConfigError(f"{_source(cfg)}: {key}: {exc}") from None


def build_scheduler(cfg: ExperimentConfig) -> Scheduler:
    e = cfg.engine
    max_model_len = e.max_model_len if e.max_model_len is not None else model_spec(cfg).max_model_len
    num_blocks = resolve_num_gpu_blocks(cfg)
    needed = cdiv(max_model_len, e.block_size)
    groups = e.kv_cache_group_specs()
    block_size = hash_block_size = e.block_size
    if groups:  # sliding-window / hybrid: every group holds its own blocks of one max_model_len sequence
        block_size, hash_block_size = resolve_block_sizes(groups, e.enable_prefix_caching, e.hash_block_size)
        needed = blocks_for_one_sequence(groups, e.max_num_batched_tokens, max_model_len)
    if num_blocks < needed:  # vLLM's _check_enough_kv_cache_memory (it counts the null block)
        key = "engine.num_gpu_blocks" if e.num_gpu_blocks is not None else (
            "engine.kv_cache_gib" if e.kv_cache_gib is not None else "gpu"
        )
        raise ConfigError(
            f"{_source(cfg)}: {key}: a pool of {num_blocks} blocks of {block_size} tokens cannot hold one "
            f"max_model_len={max_model_len} sequence ({needed} blocks); vLLM refuses to start -- enlarge the "
            f"pool or lower engine.max_model_len"
        )
    if not e.enable_chunked_prefill and e.max_num_batched_tokens < max_model_len:
        raise ConfigError(
            f"{_source(cfg)}: engine.max_num_batched_tokens: {e.max_num_batched_tokens} is smaller than "
            f"max_model_len {max_model_len} with chunked prefill off; vLLM rejects this"
        )
    sched_cfg = SchedulerConfig(
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=e.enable_chunked_prefill,
        long_prefill_token_threshold=e.long_prefill_token_threshold,
        policy=e.policy,
        scheduler_reserve_full_isl=e.scheduler_reserve_full_isl,
        watermark=e.watermark,
        async_scheduling=e.async_scheduling,
    )
    cache_cfg = CacheConfig(
        block_size, num_blocks, e.enable_prefix_caching, e.use_eagle, kv_groups=groups, hash_block_size=e.hash_block_size
    )
    hasher = make_block_hasher(e.hash_algo, hash_block_size, e.hash_seed)
    return Scheduler(sched_cfg, cache_cfg, hasher)


def build_latency(cfg: ExperimentConfig) -> LatencyModel:
    lat = cfg.latency
    if lat.kind == "fixed":
        return FixedLatency(lat.step_time_s)
    if lat.kind == "fitted":
        try:
            return FittedLatency.from_file(cfg.resolve_path(lat.path))
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{_source(cfg)}: latency.path: {exc}") from None
    try:
        gpu = load_gpu_spec(cfg.gpu if not cfg.gpu.endswith((".yaml", ".yml")) else str(cfg.resolve_path(cfg.gpu)))
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{_source(cfg)}: gpu: {exc}") from None
    return RooflineLatency(model_spec(cfg), gpu, lat.overhead_s)


def _progress_enabled(cfg: ExperimentConfig, progress: bool | None) -> bool:
    if progress is not None:
        return progress
    if cfg.replay.progress == "auto":
        return sys.stderr.isatty()
    return bool(cfg.replay.progress)


ExecutorFactory = Callable[[ExperimentConfig, Scheduler], Executor]
"""Builds the executor for a scheduler, e.g. ``gpu_backend.factory.make_torch_executor``."""


def replay_experiment(
    cfg: ExperimentConfig,
    *,
    progress: bool | None = None,
    executor_factory: ExecutorFactory | None = None,
    **replay_kwargs: Any,
) -> tuple[ReplayResult, Workload]:
    """Build everything and replay (no files written). ``executor_factory`` replaces the
    simulated executor (latency model) by another one, e.g. real forward passes."""
    scheduler = build_scheduler(cfg)
    executor = SimulatedExecutor(build_latency(cfg)) if executor_factory is None else executor_factory(cfg, scheduler)
    workload = build_workload(cfg)
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
        events=result.events or None,
    )
    return result, folder
