"""Build a :class:`~gpu_backend.executor.executor.TorchExecutor` from an experiment config.

``make_torch_executor(cfg, scheduler)`` is the ``executor_factory`` that ``sim.experiment.run`` takes for
``apcsim run ... --backend torch``: it reads the config's ``backend:`` section (model shape, dtype,
device, attention, seed, threads, timing and its repeats), sizes the paged KV cache to the scheduler's pool
(``engine.num_gpu_blocks`` blocks of ``engine.block_size``, block 0 the null block), builds the
model directly on the device, and selects the attention path (the choice and every probe go to
``meta.json`` under ``executor``). With a CPU offload tier (``engine.kv_offloading_size`` or
``engine.num_cpu_blocks``) it adds the worker that performs the tier's copies
(:class:`~gpu_backend.executor.offload_worker.TorchOffloadWorker`, a CPU store of the tier's chunks, pinned on
CUDA); the replay's link model still decides when the scheduler hears of each transfer. Problems are
reported as :class:`sim.experiment.config.ConfigError`.
"""

from __future__ import annotations

import os

import torch

from gpu_backend.attention import select_attention
from gpu_backend.executor.executor import TorchExecutor
from gpu_backend.executor.model import DTYPES, LlamaModel
from gpu_backend.executor.offload_worker import TorchOffloadWorker
from gpu_backend.layout.kv_cache import PagedKVCache
from gpu_backend.layout.shapes import resolve_model_shape
from sim.core.scheduler import Scheduler
from sim.experiment.config import ConfigError, ExperimentConfig

GIB = 1 << 30


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return None


def make_torch_executor(cfg: ExperimentConfig, scheduler: Scheduler) -> TorchExecutor:
    b = cfg.backend
    src = cfg.source
    if b.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{src}: backend.device: cuda requested but torch {torch.__version__} sees no CUDA device")
    if b.num_threads is not None:
        torch.set_num_threads(b.num_threads)
    try:
        spec = resolve_model_shape(b.model_shape, cfg.base_dir)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{src}: backend.model_shape: {exc}") from None
    dtype = DTYPES[b.dtype]
    cc = scheduler.cache_config
    if getattr(cc, "kv_groups", ()):
        raise ConfigError(
            f"{src}: backend: the torch backend runs one full-attention KV-cache group; hybrid / "
            f"sliding-window KV groups are simulated only (use --backend sim)"
        )
    elt = torch.tensor([], dtype=dtype).element_size()
    pool_bytes = 2 * spec.num_layers * cc.num_gpu_blocks * cc.block_size * spec.num_kv_heads * spec.head_dim * elt
    weight_bytes = spec.num_params * elt
    need = pool_bytes + weight_bytes
    tier = scheduler.tier
    if tier is not None:  # the CPU store sits in host memory whatever the device
        conn = tier.connector
        store_bytes = pool_bytes // cc.num_gpu_blocks * conn.manager.num_chunks * conn.blocks_per_chunk
        have = _host_memory_bytes()
        if have is not None and store_bytes + (need if b.device == "cpu" else 0) > have // 2:
            raise ConfigError(
                f"{src}: engine.num_cpu_blocks: a CPU store of {conn.manager.num_chunks} chunks "
                f"({store_bytes / GIB:.1f} GiB for {spec.name}) exceeds half of this machine's memory; "
                f"set a smaller engine.num_cpu_blocks / kv_offloading_size"
            )
    if b.device == "cpu":
        have = _host_memory_bytes()
        if have is not None and need > have // 2:
            raise ConfigError(
                f"{src}: backend: model {spec.name} ({weight_bytes / GIB:.1f} GiB) plus a KV pool of "
                f"{cc.num_gpu_blocks} blocks ({pool_bytes / GIB:.1f} GiB) exceeds half of this machine's memory; "
                f"set engine.num_gpu_blocks (or backend.model_shape: tiny)"
            )
    else:
        free, _ = torch.cuda.mem_get_info()
        if need > free:
            raise ConfigError(
                f"{src}: backend: model {spec.name} ({weight_bytes / GIB:.1f} GiB) plus a KV pool of "
                f"{cc.num_gpu_blocks} blocks ({pool_bytes / GIB:.1f} GiB) exceeds the GPU's free {free / GIB:.1f} GiB; "
                f"set engine.num_gpu_blocks"
            )
    device = torch.device(b.device)
    model = LlamaModel(spec, dtype=dtype, device=device, seed=b.seed if b.seed is not None else cfg.seed)
    cache = PagedKVCache(spec.num_layers, cc.num_gpu_blocks, cc.block_size, spec.num_kv_heads, spec.head_dim,
                         dtype=dtype, device=device)
    try:
        attention, report = select_attention(b.attention, device=device, dtype=dtype, block_size=cc.block_size,
                                             num_heads=spec.num_attention_heads, num_kv_heads=spec.num_kv_heads,
                                             head_dim=spec.head_dim)
    except RuntimeError as exc:
        raise ConfigError(f"{src}: backend.attention: {exc}") from None
    offload = TorchOffloadWorker.for_scheduler(cache, scheduler) if tier is not None else None
    try:
        return TorchExecutor(model, cache, attention,
                             verify_with=scheduler.kv_cache_manager if b.verify_block_tables else None,
                             timing=b.timing, attention_report=report, repeats=b.timing_repeats, offload=offload)
    except ValueError as exc:
        raise ConfigError(f"{src}: backend.timing: {exc} (set backend.num_threads: 1)") from None
