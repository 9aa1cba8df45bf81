"""The resolved engine: every number the engine is built from, derived once from a config.

Mirrors what vLLM 0.25.1 settles at start-up before its scheduler exists: the KV-cache groups and
their block sizes (``resolve_kv_cache_block_sizes`` in ``vllm/v1/core/kv_cache_utils.py``: the
scheduler block size is the LCM of the group sizes, the hash block size their GCD or the
override), the pool size in blocks with the null block included (``determine_available_memory``
then ``get_kv_cache_configs``; here ``engine.num_gpu_blocks``, ``engine.kv_cache_gib`` or the GPU
through ``sim.timing.roofline.kv_cache_blocks``), ``max_model_len`` (the engine's or the model's),
and the start-up check ``_check_enough_kv_cache_memory`` (a pool that cannot hold one
``max_model_len`` sequence is refused). The vLLM version (``engine.vllm_version``) is resolved here
once into its :class:`~sim.core.version_profile.VersionProfile`, handed to the core as
``SchedulerConfig.profile``; it also decides the sliding-window in-flight tokens of that check
(0.33.0 ``VllmConfig.max_in_flight_tokens``), the NONE_HASH seed and EAGLE's lookahead hashes.

Invariants: an :class:`EngineDescription` is built only by :func:`resolve`, is frozen, and is the
only place these numbers are derived: the scheduler (``sim.experiment.run.build_scheduler``), the
sweep rows and their offline bounds (``sim.experiment.sweep_point``) and ``apcsim workloads
stats`` (``sim.experiment.workload``) read it, never ``engine.block_size`` and friends. A problem
raises :class:`~sim.experiment.config.ConfigError` naming the file and key, in this order: the
model (when ``max_model_len`` comes from it), the pool size, the pool against ``max_model_len``,
chunked prefill against ``max_model_len``.

Imports neither simpy, torch nor gpu_backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
from sim.core.hashing import BlockHasher, make_block_hasher
from sim.core.kv_cache_spec import KVGroupSpec, blocks_for_one_sequence, cdiv, resolve_block_sizes
from sim.core.version_profile import VersionProfile, get_profile
from sim.experiment.config import ConfigError, ExperimentConfig
from sim.experiment.offload_tier import chunk_bytes, offload_bandwidth_gb_s, resolve_offload
from sim.experiment.version_keys import hash_unit, none_hash_seed
from sim.timing.fitted_latency import FittedLatency
from sim.timing.roofline import GIB, GPUSpec, ModelSpec, kv_cache_blocks, load_gpu_spec, load_model_spec
from sim.timing.transfer_link import LinkFit


@dataclass(frozen=True)
class EngineDescription:
    """One engine, fully resolved (see the module docstring).

    ``kv_groups`` always lists the groups (one full-attention group of ``block_size`` for a model
    without ``engine.kv_cache_groups``); ``hybrid`` says the config set ``kv_cache_groups``, which
    selects the hybrid KV-cache manager. ``block_size`` is the scheduler block size (hits and
    caching are aligned to it), ``hash_block_size`` the block size of the request hashes.
    ``capacity_tokens`` is the longest prefix, a multiple of ``block_size``, whose blocks of every
    group fit in the pool's ``num_gpu_blocks - 1`` usable blocks at once (vLLM's null block is never
    cacheable): ``(num_gpu_blocks - 1) * block_size`` for one group. ``kv_pool_gib`` is the pool's
    memory (NaN when the model is unknown, or for ``kv_cache_groups``: the model spec does not say
    which layers each group holds).
    """

    kv_groups: tuple[KVGroupSpec, ...]
    hybrid: bool
    block_size: int
    hash_block_size: int
    num_gpu_blocks: int
    max_model_len: int
    capacity_tokens: int
    kv_pool_gib: float
    hash_algo: str
    hash_seed: int | str
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    # the CPU offload tier (None: none): its chunks are cache_config.offload; a transfer moves
    # kv_bytes_per_block bytes per GPU block over a link of offload_bandwidth_gb_s (GB/s per direction)
    kv_bytes_per_block: int = 0
    offload_bandwidth_gb_s: float = 0.0
    # the link's fixed per-transfer latency and where its figures come from (sim.timing.transfer_link:
    # engine.offload_bandwidth_gb_s, else the fitted latency file's host_link, else the GPU spec)
    offload_link_latency_s: float = 0.0
    offload_link_source: str = ""
    # loads and stores on their own lanes (engine.offload_link_duplex, default true), else one shared lane
    offload_link_duplex: bool = True
    # vLLM 0.33.0 num_hash_lookahead_tokens: 1 for EAGLE with prefix caching and no KV connector
    num_hash_lookahead_tokens: int = 0

    @property
    def offload(self) -> OffloadConfig | None:
        """The CPU offload tier (``sim.experiment.offload_tier``), or None."""
        return self.cache_config.offload

    @property
    def cpu_tier_gib(self) -> float:
        """The CPU tier's memory, GiB (its chunks, each page-aligned); 0 without a tier."""
        tier = self.offload
        if tier is None:
            return 0.0
        return tier.num_cpu_chunks * chunk_bytes(self.kv_bytes_per_block, tier.blocks_per_chunk) / GIB

    @property
    def cpu_tier_capacity_tokens(self) -> int:
        """The tokens the CPU tier holds at once (whole chunks); 0 without a tier."""
        tier = self.offload
        return 0 if tier is None else tier.num_cpu_chunks * tier.blocks_per_chunk * self.block_size

    @property
    def single_full_group(self) -> bool:
        """True when the pool holds one full-attention group: the pool model of the Belady and
        sequential-LRU references (``workloads.bounds``)."""
        return len(self.kv_groups) == 1 and self.kv_groups[0].kind == "full"

    @property
    def profile(self) -> VersionProfile:
        """The vLLM version's behaviour profile (``engine.vllm_version``)."""
        return self.scheduler_config.profile

    def block_hasher(self) -> BlockHasher:
        """A new request block hasher (``hash_algo`` at ``hash_block_size``, seeded)."""
        p = self.profile
        return make_block_hasher(self.hash_algo, self.hash_block_size, self.hash_seed, self.num_hash_lookahead_tokens,
                                 p.mm_resume_scan_from_last, p.tagged_extra_keys)


def _spec_name(cfg: ExperimentConfig, name: str) -> str:
    return str(cfg.resolve_path(name)) if name.endswith((".yaml", ".yml")) else name


def model_spec(cfg: ExperimentConfig) -> ModelSpec:
    """The config's model (a built-in name or a YAML path); problems raise ``ConfigError``."""
    try:
        return load_model_spec(_spec_name(cfg, cfg.model))
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{cfg.source}: model: {exc}") from None


def gpu_spec(cfg: ExperimentConfig) -> GPUSpec:
    """The config's GPU (a built-in name or a YAML path); problems raise ``ConfigError``."""
    try:
        return load_gpu_spec(_spec_name(cfg, cfg.gpu))
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{cfg.source}: gpu: {exc}") from None


def _pool_key(cfg: ExperimentConfig) -> str:
    e = cfg.engine
    if e.num_gpu_blocks is not None:
        return "engine.num_gpu_blocks"
    if e.kv_cache_fraction is not None:
        return "engine.kv_cache_fraction"
    return "engine.kv_cache_gib" if e.kv_cache_gib is not None else "gpu"


def _num_gpu_blocks(cfg: ExperimentConfig, model: Callable[[], ModelSpec], block_size: int) -> int:
    """The pool size in blocks (null block included): given, from ``kv_cache_gib``, or from the GPU
    (times ``kv_cache_fraction``, floored, when set: a share of vLLM's profiled pool)."""
    e = cfg.engine
    if e.num_gpu_blocks is not None:
        return e.num_gpu_blocks
    spec = model()
    try:
        gpu = load_gpu_spec(_spec_name(cfg, cfg.gpu))
        blocks = kv_cache_blocks(spec, gpu, block_size, e.gpu_memory_utilization, e.kv_cache_gib,
                                 max_num_batched_tokens=e.max_num_batched_tokens)
    except ValueError as exc:
        raise ConfigError(f"{cfg.source}: {_pool_key(cfg)}: {exc}") from None
    if e.kv_cache_fraction is None:
        return blocks
    scaled = int(blocks * e.kv_cache_fraction)
    if scaled < 2:  # the null block and one usable block, as num_gpu_blocks' own minimum
        raise ConfigError(f"{cfg.source}: engine.kv_cache_fraction: {e.kv_cache_fraction} of {blocks} blocks "
                          f"leaves {scaled}; a pool needs at least 2")
    return scaled


def _capacity_tokens(groups: tuple[KVGroupSpec, ...], block_size: int, num_gpu_blocks: int) -> int:
    """``block_size * k`` for the largest ``k`` with ``k * sum(block_size / g.block_size)`` blocks
    (one scheduler block of tokens in every group) within ``num_gpu_blocks - 1``."""
    per_block = sum(block_size // g.block_size for g in groups)
    return block_size * (max(0, num_gpu_blocks - 1) // per_block)


def _kv_pool_gib(
    cfg: ExperimentConfig, model: Callable[[], ModelSpec], hybrid: bool, num_gpu_blocks: int, block_size: int
) -> float:
    e = cfg.engine
    if e.kv_cache_gib is not None:
        return float(e.kv_cache_gib)
    if hybrid:
        return float("nan")
    try:
        return num_gpu_blocks * model().kv_bytes_per_block(block_size) / GIB
    except ConfigError:  # an unknown model only matters for the pool size given in blocks
        return float("nan")


def _offload_link(cfg: ExperimentConfig) -> tuple[float, float, str]:
    """The tier's link ``(GB/s, latency s, source)``: ``engine.offload_bandwidth_gb_s``, else the
    ``host_link`` of the fitted latency file (``apcsim calibrate``), else the GPU spec's host link."""
    e = cfg.engine
    if e.offload_bandwidth_gb_s is not None:
        return offload_bandwidth_gb_s(e, lambda: 0.0), 0.0, "engine.offload_bandwidth_gb_s"
    lat = cfg.latency
    if lat.kind == "fitted":
        path = cfg.resolve_path(lat.path)
        try:
            fit = LinkFit.from_calibration(FittedLatency.from_file(path).metadata, str(path))
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{cfg.source}: latency.path: {exc}") from None
        if fit is not None:
            return fit.bandwidth_gb_s, fit.latency_s, f"calibration {path.name} ({fit.measured})"
    gpu = gpu_spec(cfg)
    return gpu.host_link_gb_s, 0.0, f"gpu {gpu.name}"


def resolve(cfg: ExperimentConfig) -> EngineDescription:
    """The engine of ``cfg`` (see the module docstring); problems raise ``ConfigError``."""
    e = cfg.engine
    profile = get_profile(e.vllm_version)  # validated by EngineConfig
    # the sliding-window admission cap's in-flight tokens (0.33: 2 batches with async scheduling)
    in_flight = profile.max_in_flight_tokens(e.max_num_batched_tokens, e.async_scheduling)
    model = cache(lambda: model_spec(cfg))  # loaded at most once, and only when a number needs it
    max_model_len = e.max_model_len if e.max_model_len is not None else model().max_model_len
    hybrid = bool(e.kv_cache_groups)
    groups = e.kv_cache_group_specs() if hybrid else (KVGroupSpec("full", e.block_size),)
    if hybrid:  # sliding-window / hybrid: every group holds its own blocks of one max_model_len sequence
        block_size, hash_block_size = resolve_block_sizes(groups, e.enable_prefix_caching, hash_unit(e))
        needed = blocks_for_one_sequence(groups, in_flight, max_model_len)
    else:
        block_size = hash_block_size = e.block_size
        needed = cdiv(max_model_len, block_size)
    num_blocks = _num_gpu_blocks(cfg, model, block_size)
    if num_blocks < needed:  # vLLM's _check_enough_kv_cache_memory (it counts the null block)
        raise ConfigError(
            f"{cfg.source}: {_pool_key(cfg)}: a pool of {num_blocks} blocks of {block_size} tokens cannot hold one "
            f"max_model_len={max_model_len} sequence ({needed} blocks); vLLM refuses to start -- enlarge the "
            f"pool or lower engine.max_model_len"
        )
    if profile.threshold_within_max_model_len and e.long_prefill_token_threshold > max_model_len:
        raise ConfigError(
            f"{cfg.source}: engine.long_prefill_token_threshold: {e.long_prefill_token_threshold} is greater than "
            f"max_model_len {max_model_len}; vLLM {profile.version} rejects this"
        )
    if not e.enable_chunked_prefill and e.max_num_batched_tokens < max_model_len:
        raise ConfigError(
            f"{cfg.source}: engine.max_num_batched_tokens: {e.max_num_batched_tokens} is smaller than "
            f"max_model_len {max_model_len} with chunked prefill off; vLLM rejects this"
        )
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=e.enable_chunked_prefill,
        long_prefill_token_threshold=e.long_prefill_token_threshold,
        policy=e.policy,
        scheduler_reserve_full_isl=e.scheduler_reserve_full_isl,
        watermark=e.watermark,
        async_scheduling=e.async_scheduling,
        profile=profile,
        max_num_active_seqs=e.max_num_active_seqs,
        prefill_schedule_interval=e.prefill_schedule_interval or 1,
    )
    offload = resolve_offload(e, cfg.source, cfg.model, model, block_size)
    # 0.33 VllmConfig.num_hash_lookahead_tokens: EAGLE hashes one token ahead unless caching is off
    # or a KV connector is on; Scheduler.__init__ then turns use_eagle_block_drop off
    lookahead = int(profile.eagle_lookahead_hashes and e.use_eagle and e.enable_prefix_caching and offload is None)
    if lookahead and hybrid:
        raise ConfigError(f"{cfg.source}: engine.use_eagle: vLLM 0.33.0's lookahead block hashes over kv_cache_groups "
                          "are not modelled (one full-attention group only); use engine.vllm_version: 0.25.1")
    cache_config = CacheConfig(block_size, num_blocks, e.enable_prefix_caching, e.use_eagle and not lookahead,
                               kv_groups=groups if hybrid else (), hash_block_size=hash_unit(e),
                               pool_impl=e.pool_impl, offload=offload, num_hash_lookahead_tokens=lookahead)
    link = (0.0, 0.0, "") if offload is None else _offload_link(cfg)
    return EngineDescription(
        kv_groups=groups,
        hybrid=hybrid,
        block_size=block_size,
        hash_block_size=hash_block_size,
        num_gpu_blocks=num_blocks,
        max_model_len=max_model_len,
        capacity_tokens=_capacity_tokens(groups, block_size, num_blocks),
        kv_pool_gib=_kv_pool_gib(cfg, model, hybrid, num_blocks, block_size),
        hash_algo=e.hash_algo,
        hash_seed=none_hash_seed(e),
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        kv_bytes_per_block=0 if offload is None else model().kv_bytes_per_block(block_size),
        offload_bandwidth_gb_s=link[0],
        offload_link_latency_s=link[1],
        offload_link_source=link[2],
        offload_link_duplex=e.offload_link_duplex is not False,
        num_hash_lookahead_tokens=lookahead,
    )
