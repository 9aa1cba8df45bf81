"""The CPU offload tier's engine keys, checked and resolved once (mirrors vLLM 0.33.0's native
offloading set-up: ``CacheConfig.kv_offloading_size`` in ``vllm/config/cache.py``,
``VllmConfig._post_init_kv_transfer_config`` in ``vllm/config/vllm.py``, ``build_offloading_config``
in ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py`` and
``CPUOffloadingSpec.__init__`` in ``vllm/v1/kv_offload/cpu/spec.py``).

The keys, each named after the vLLM flag or extra-config key it mirrors:

* ``engine.kv_offloading_size`` -- GiB of CPU memory (``--kv-offloading-size``); the tier holds
  ``floor(GiB * 2**30 / round_up(kv_bytes_per_chunk, 4096))`` chunks, where a chunk is
  ``blocks_per_chunk`` GPU blocks of the model's KV over all layers (vLLM's ``num_chunks``; the
  4096 is ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``, the page size);
* ``engine.num_cpu_blocks`` -- the capacity as a chunk count, like ``engine.num_gpu_blocks`` (one of
  the two);
* ``engine.kv_offloading_policy`` -- ``lru`` or ``arc`` (the extra-config ``eviction_policy``);
* ``engine.kv_offloading_block_size`` -- tokens per chunk, a multiple of the block size (the
  extra-config ``block_size``; default one GPU block);
* ``engine.offload_prompt_only`` (default true) and ``engine.store_threshold`` (default 0, off);
* ``engine.offload_bandwidth_gb_s`` -- the GPU<->CPU link (GB/s per direction; default the GPU
  spec's ``host_link_gb_s``);
* ``engine.offload_link_duplex`` (default true) -- loads and stores each have their own FIFO lane
  with the full bandwidth, as vLLM's worker copies with one stream chain per direction over a
  full-duplex PCIe / NVLink-C2C link; false puts both directions in one FIFO lane (the conservative
  reading for hosts whose directions share copy engines or memory bandwidth;
  ``sim.timing.transfer_link``);
* ``engine.self_describing_kv_events`` (default false) -- the extra-config key that makes the tier's
  KV events carry the chunk's blocks and tokens (``sim.core.offload.events``).

Invariants: with none of these keys set there is no tier (``resolve_offload`` returns None) and the
engine is the untiered one; every problem is one ``ConfigError`` line naming the key. Imports
neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

from sim.core.config import OffloadConfig
from sim.experiment.config_error import ConfigError
from sim.timing.roofline import GIB, ModelSpec


class TierKeys(Protocol):
    """The engine keys read here (``sim.experiment.config.EngineConfig`` has them; a protocol, so that
    this module does not import the config models that import it)."""

    @property
    def vllm_version(self) -> str: ...
    @property
    def block_size(self) -> int: ...
    @property
    def enable_prefix_caching(self) -> bool: ...
    @property
    def kv_cache_groups(self) -> object: ...
    @property
    def kv_offloading_size(self) -> float | None: ...
    @property
    def num_cpu_blocks(self) -> int | None: ...
    @property
    def kv_offloading_policy(self) -> Literal["lru", "arc"] | None: ...
    @property
    def kv_offloading_block_size(self) -> int | None: ...
    @property
    def offload_prompt_only(self) -> bool | None: ...
    @property
    def store_threshold(self) -> int | None: ...
    @property
    def offload_bandwidth_gb_s(self) -> float | None: ...
    @property
    def offload_link_duplex(self) -> bool | None: ...
    @property
    def self_describing_kv_events(self) -> bool | None: ...

PAGE_ALIGNMENT = 4096
"""vLLM's ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT`` (``mmap.PAGESIZE``): each chunk's bytes are
rounded up to it."""

TIER_KEYS = ("kv_offloading_size", "num_cpu_blocks", "kv_offloading_policy", "kv_offloading_block_size",
             "offload_prompt_only", "store_threshold", "offload_bandwidth_gb_s", "self_describing_kv_events",
             "offload_link_duplex")
"""The engine keys of the tier; any of them set without a size is a problem."""


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (vLLM's ``vllm.utils.math_utils.round_up``)."""
    return -(-n // multiple) * multiple


def check_offload_keys(e: TierKeys) -> None:
    """The tier's cross-key rules, as vLLM applies them at start-up; raises ValueError naming the key
    (pydantic turns it into the ``file: engine.key: problem`` line)."""
    sized = e.kv_offloading_size is not None or e.num_cpu_blocks is not None
    if e.kv_offloading_size is not None and e.num_cpu_blocks is not None:
        raise ValueError("set kv_offloading_size (GiB) or num_cpu_blocks (chunks), not both")
    if not sized:
        extra = [k for k in TIER_KEYS[2:] if getattr(e, k) is not None]
        if extra:
            raise ValueError(f"{extra[0]} needs a CPU offload tier: set kv_offloading_size (GiB) "
                             "or num_cpu_blocks (chunks)")
        return
    if e.vllm_version != "0.33.0":
        raise ValueError(f"kv_offloading_size / num_cpu_blocks: the CPU offload tier is vLLM 0.33.0's native "
                         f"offloading; engine.vllm_version {e.vllm_version} has none (use 0.33.0)")
    if not e.enable_prefix_caching:
        raise ValueError("kv_offloading_size / num_cpu_blocks: CPU offload needs prefix caching "
                         "(enable_prefix_caching: true); the connector keys chunks by block hash")
    if e.kv_cache_groups:
        raise ValueError("kv_offloading_size / num_cpu_blocks: the CPU tier is modelled for one "
                         "full-attention group only, not with kv_cache_groups")
    chunk = e.kv_offloading_block_size
    if chunk is not None and chunk % e.block_size:
        raise ValueError(f"kv_offloading_block_size: {chunk} tokens is not a multiple of the block size "
                         f"{e.block_size}, as vLLM requires of the offload block_size")


def check_offload_size(value: float | None) -> float | None:
    """``engine.kv_offloading_size``: vLLM refuses 0 (``CPUOffloadingSpec``: cpu_bytes_to_use must be
    set); negative or non-finite sizes are refused too."""
    if value is not None and not value > 0:
        raise ValueError(f"{value} GiB: vLLM rejects a CPU offload size that is not > 0 "
                         "(leave it unset for no offload)")
    return value


def chunk_bytes(kv_bytes_per_block: int, blocks_per_chunk: int) -> int:
    """The CPU memory of one chunk: its blocks' KV bytes rounded up to the page (vLLM's
    ``CPUOffloadingSpec.kv_bytes_per_chunk``, world size 1: the model spec's KV bytes per block are
    those of all its layers)."""
    return round_up(kv_bytes_per_block * blocks_per_chunk, PAGE_ALIGNMENT)


def num_cpu_chunks(size_gib: float, kv_bytes_per_block: int, blocks_per_chunk: int) -> int:
    """vLLM's ``CPUOffloadingSpec.num_chunks`` for one engine: ``int(GiB * 2**30) // chunk_bytes``."""
    return int(size_gib * GIB) // chunk_bytes(kv_bytes_per_block, blocks_per_chunk)


def resolve_offload(
    e: TierKeys, source: str, model_name: str, model: Callable[[], ModelSpec], block_size: int
) -> OffloadConfig | None:
    """The tier of the engine keys ``e`` of config ``source`` (None: no tier); a tier that holds no
    chunk raises ``ConfigError``."""
    if e.kv_offloading_size is None and e.num_cpu_blocks is None:
        return None
    chunk_tokens = e.kv_offloading_block_size or block_size
    blocks_per_chunk = chunk_tokens // block_size
    if e.num_cpu_blocks is not None:
        chunks, key = e.num_cpu_blocks, "engine.num_cpu_blocks"
    else:
        assert e.kv_offloading_size is not None
        key = "engine.kv_offloading_size"
        per_block = model().kv_bytes_per_block(block_size)
        chunks = num_cpu_chunks(e.kv_offloading_size, per_block, blocks_per_chunk)
        if chunks < 1:
            raise ConfigError(
                f"{source}: {key}: {e.kv_offloading_size} GiB holds no chunk of {chunk_tokens} tokens "
                f"({chunk_bytes(per_block, blocks_per_chunk) / 2**20:.2f} MiB each for {model_name}); "
                "the tier must hold at least one chunk"
            )
    return OffloadConfig(
        num_cpu_chunks=chunks,
        blocks_per_chunk=blocks_per_chunk,
        policy=e.kv_offloading_policy or "lru",
        offload_prompt_only=True if e.offload_prompt_only is None else e.offload_prompt_only,
        store_threshold=e.store_threshold or 0,
        self_describing_kv_events=bool(e.self_describing_kv_events),
    )


def offload_bandwidth_gb_s(e: TierKeys, host_link_gb_s: Callable[[], float]) -> float:
    """The GPU<->CPU link of the tier in GB/s: ``engine.offload_bandwidth_gb_s``, else the GPU spec's."""
    bw = e.offload_bandwidth_gb_s
    return float(bw) if bw is not None else host_link_gb_s()
