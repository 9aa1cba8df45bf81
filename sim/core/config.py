"""The engine core's plain configs (mirror the knobs of vLLM 0.25.1's ``vllm/config/scheduler.py``
``SchedulerConfig`` and ``vllm/config/cache.py`` ``CacheConfig`` that prefix caching depends on).

Invariants: frozen values, resolved once above the core (``sim.experiment``); the core checks only
its own preconditions (e.g. ``KVCacheManager`` that ``block_size`` is the LCM of ``kv_groups``).
Imports neither simpy nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sim.core.kv_cache_spec import KVGroupSpec
from sim.core.version_profile import V0_25_1, VersionProfile


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduling knobs vLLM exposes (defaults: ``SchedulerConfig`` on its own)."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: Literal["fcfs", "priority"] = "fcfs"
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    async_scheduling: bool = False  # vLLM's AsyncScheduler (output placeholders; see sim.core.scheduler)
    # The vLLM version whose behaviour differences apply (sim.core.version_profile). The core's
    # default is 0.25.1, the version the core's own tests were written against; an experiment's
    # default (engine.vllm_version) is 0.33.0, resolved by sim.experiment.engine_description.
    profile: VersionProfile = V0_25_1
    # 0.33 only (profile.new_scheduler_knobs): vLLM's max_num_active_seqs, the admission cap into
    # RUNNING (None: max_num_seqs), and prefill_schedule_interval, the local prefill cadence (1: off)
    max_num_active_seqs: int | None = None
    prefill_schedule_interval: int = 1

    @property
    def max_num_active_reqs(self) -> int:
        """vLLM 0.33 ``Scheduler.max_num_active_reqs``: ``max_num_active_seqs`` or, unset,
        ``max_num_seqs`` (the waiting loop's cap; 0.25.1 always used ``max_num_seqs``)."""
        return self.max_num_seqs if self.max_num_active_seqs is None else self.max_num_active_seqs


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """vLLM 0.33.0's native CPU offload tier (``--kv-offloading-size``: the OffloadingConnector over a
    ``CPUOffloadingManager``; ``vllm/v1/kv_offload/cpu/spec.py`` and ``.../offloading/config.py``).

    ``num_cpu_chunks`` is the tier's capacity in chunks of ``blocks_per_chunk`` GPU blocks (resolved
    above the core from GiB or given directly); ``policy`` is the manager's ``eviction_policy``;
    ``offload_prompt_only`` and ``store_threshold`` are the connector's extra-config keys of the same
    names (defaults: vLLM's); ``self_describing_kv_events`` is the extra-config key that makes the
    tier's ``BlockStored`` events carry the chunk's block hashes and tokens (``sim.core.offload.events``;
    it matters only when the engine's KV events are on)."""

    num_cpu_chunks: int
    blocks_per_chunk: int = 1
    policy: Literal["lru", "arc"] = "lru"
    offload_prompt_only: bool = True
    store_threshold: int = 0
    self_describing_kv_events: bool = False


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """KV cache knobs: pool size in blocks (block 0 is the null block) and prefix caching."""

    block_size: int = 16
    num_gpu_blocks: int = 1024
    enable_prefix_caching: bool = True
    use_eagle: bool = False
    # Sliding-window / hybrid models (sim.core.kv_cache_spec): empty = one full-attention group of
    # ``block_size`` (the optimised coordinator). Otherwise ``block_size`` must be the scheduler block
    # size (LCM of the group sizes) and the hasher's block size the hash block size (GCD, or
    # ``hash_block_size`` when set).
    kv_groups: tuple[KVGroupSpec, ...] = ()
    hash_block_size: int | None = None
    pool_impl: str = "compiled"  # sim.core.pool_impl: the compiled block pool, or "python" (its oracle)
    # vLLM 0.33 num_hash_lookahead_tokens (EAGLE with lookahead block hashes): the caching of a full
    # block waits for its hash, which needs this many tokens after it (sim.core.hashing)
    num_hash_lookahead_tokens: int = 0
    # vLLM 0.33.0's CPU offload tier behind the KV connector (None: no connector, the untiered engine)
    offload: OffloadConfig | None = None
