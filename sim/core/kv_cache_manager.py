"""The KV cache manager the scheduler sees (mirrors ``KVCacheManager`` of vLLM 0.25.1's
``vllm/v1/core/kv_cache_manager.py``), over a coordinator chosen at construction
(:mod:`sim.core.kv_cache_coordinator`).

Behaviour mirrored exactly:

* ``get_computed_blocks``: skipped (no stats) when caching is off or the request skips reading the
  prefix cache (``prompt_logprobs``); otherwise the coordinator's longest hit within
  ``num_tokens - 1`` tokens. Hits are returned untouched. The lookup is recorded in
  ``PrefixCacheStats`` in *tokens* (``queries = num_tokens``; resumed requests counted apart):
  by the lookup itself (0.25.1 ``get_computed_blocks``: every lookup, a blocked head's included),
  or with ``stats_at_admission`` only through ``record_prefix_cache_stats``, which the scheduler
  calls once ``allocate_slots`` has admitted the request (0.33 ``KVCacheManager.
  record_prefix_cache_stats``, same guards as the lookup).
* ``allocate_slots``: the coordinator's, in vLLM's order -- watermark (only for WAITING/PREEMPTED
  requests while something is running), full-sequence gate, capacity check, touching, popping and
  caching at schedule time.
* ``reset_prefix_cache``: only with no block in use; flags the stats as reset.

The coordinator is picked when the manager is built (``from_configs`` is the scheduler's factory):
no ``kv_groups`` -> one full-attention group of ``block_size``, the optimised
:class:`~sim.core.full_attention_coordinator.UnitaryFullAttentionCoordinator` (caching on or off);
explicit groups ->
:class:`~sim.core.grouped_kv_cache_coordinator.KVCacheCoordinatorNoPrefixCache` with caching off,
:class:`~sim.core.grouped_kv_cache_coordinator.UnitaryKVCacheCoordinator` for one group,
:class:`~sim.core.hybrid_kv_cache_coordinator.HybridKVCacheCoordinator` for several.

Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Iterable, KeysView, Sequence

from sim.core.block_pool import BlockPool
from sim.core.config import CacheConfig, SchedulerConfig
from sim.core.full_attention_coordinator import UnitaryFullAttentionCoordinator
from sim.core.grouped_kv_cache_coordinator import (
    GroupedKVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
)
from sim.core.hybrid_kv_cache_coordinator import HybridKVCacheCoordinator
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_coordinator import NO_HITS, HitBlocks, KVCacheCoordinator
from sim.core.kv_cache_spec import KVGroupSpec, check_groups
from sim.core.kv_events import EventSink
from sim.core.pool_impl import DEFAULT_POOL_IMPL
from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.core.request import Request


def _make_coordinator(
    num_gpu_blocks: int,
    block_size: int,
    max_model_len: int,
    kv_groups: Sequence[KVGroupSpec],
    hash_block_size: int | None,
    max_num_batched_tokens: int | None,
    enable_caching: bool,
    use_eagle: bool,
    watermark_blocks: int,
    event_sink: EventSink | None,
    retention_interval: int | None,
    pool_impl: str,
    num_hash_lookahead_tokens: int,
) -> KVCacheCoordinator:
    """The coordinator for a group layout (vLLM ``get_kv_cache_coordinator``, plus the fast path)."""
    if not kv_groups:
        if retention_interval is not None:
            raise ValueError("retention_interval only applies to models with a sliding-window group")
        return UnitaryFullAttentionCoordinator(
            num_gpu_blocks, block_size, max_model_len,
            enable_caching=enable_caching, use_eagle=use_eagle, watermark_blocks=watermark_blocks,
            event_sink=event_sink, pool_impl=pool_impl, num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        )
    if num_hash_lookahead_tokens:
        raise ValueError("lookahead block hashes (vLLM 0.33.0 EAGLE) are modelled for one full-attention group only")
    groups = tuple(kv_groups)
    sched_bs, hash_bs = check_groups(groups, enable_caching, hash_block_size)
    if block_size != sched_bs:
        raise ValueError(
            f"CacheConfig.block_size ({block_size}) must be the scheduler block size of "
            f"kv_groups (the LCM of their block sizes: {sched_bs})"
        )
    cls: type[GroupedKVCacheCoordinator]
    if not enable_caching:
        cls = KVCacheCoordinatorNoPrefixCache
    elif len(groups) == 1:
        cls = UnitaryKVCacheCoordinator
    else:
        cls = HybridKVCacheCoordinator
    return cls(
        groups, num_gpu_blocks, max_model_len,
        block_size=sched_bs, hash_block_size=hash_bs,
        max_num_batched_tokens=max_model_len if max_num_batched_tokens is None else max_num_batched_tokens,
        enable_caching=enable_caching, use_eagle=use_eagle, watermark_blocks=watermark_blocks,
        event_sink=event_sink, retention_interval=retention_interval, pool_impl=pool_impl,
    )


class KVCacheManager:
    """Block bookkeeping per request, prefix-cache lookups and their stats.

    ``block_size`` is the scheduler block size: with ``kv_groups`` it must be their LCM (the hash
    block size is then their GCD, or ``hash_block_size``). Every method says whether it changes
    state; lookups never take references.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        max_model_len: int,
        *,
        kv_groups: Sequence[KVGroupSpec] = (),
        hash_block_size: int | None = None,
        max_num_batched_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = True,
        watermark: float = 0.0,
        event_sink: EventSink | None = None,
        retention_interval: int | None = None,
        pool_impl: str = DEFAULT_POOL_IMPL,
        stats_at_admission: bool = False,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        if watermark < 0:
            raise ValueError("watermark must be non-negative")
        self.coordinator: KVCacheCoordinator = _make_coordinator(
            num_gpu_blocks, block_size, max_model_len, kv_groups, hash_block_size, max_num_batched_tokens,
            enable_caching, use_eagle, int(watermark * num_gpu_blocks), event_sink, retention_interval,
            pool_impl, num_hash_lookahead_tokens,
        )
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.block_pool: BlockPool = self.coordinator.block_pool
        self.kv_groups: tuple[KVGroupSpec, ...] = self.coordinator.groups
        self.block_size = block_size
        self.hash_block_size = self.coordinator.hash_block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self._allocate_slots = self.coordinator.allocate_slots  # bound once: the decode hot path
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        # vLLM 0.33: lookups record nothing; the scheduler records each admission (see the docstring)
        self.stats_at_admission = stats_at_admission

    @classmethod
    def from_configs(
        cls,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        *,
        log_stats: bool = True,
        event_sink: EventSink | None = None,
    ) -> KVCacheManager:
        """The manager a scheduler with these configs uses (the one factory the scheduler calls).
        The sliding-window admission cap reserves for ``profile.max_in_flight_tokens`` (vLLM 0.33
        ``KVCacheManager(max_in_flight_tokens=...)``: twice the budget with async scheduling)."""
        profile = scheduler_config.profile
        return cls(
            cache_config.num_gpu_blocks,
            cache_config.block_size,
            scheduler_config.max_model_len,
            kv_groups=cache_config.kv_groups,
            hash_block_size=cache_config.hash_block_size,
            max_num_batched_tokens=profile.max_in_flight_tokens(
                scheduler_config.max_num_batched_tokens, scheduler_config.async_scheduling),
            enable_caching=cache_config.enable_prefix_caching,
            use_eagle=cache_config.use_eagle,
            log_stats=log_stats,
            watermark=scheduler_config.watermark,
            event_sink=event_sink,
            pool_impl=cache_config.pool_impl,
            stats_at_admission=profile.stats_at_admission,
            num_hash_lookahead_tokens=cache_config.num_hash_lookahead_tokens,
        )

    @property
    def watermark_blocks(self) -> int:
        """Query: ``int(watermark * num_gpu_blocks)``, the blocks an admission must leave free."""
        return self.coordinator.watermark_blocks

    @property
    def is_unitary_full_attention(self) -> bool:
        """Query: whether the optimised one-full-attention-group coordinator is in use (the decode
        fast-forward of ``sim.replay`` relies on its single-group block arithmetic)."""
        return type(self.coordinator) is UnitaryFullAttentionCoordinator

    # -- lookup -------------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[HitBlocks, int]:
        """Lookup; records stats (unless ``stats_at_admission``), touches no ref counts: the cached
        prefix usable by ``request`` (one list per group, ``()`` for none) and its length in tokens."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return NO_HITS, 0
        blocks, num_hits = self.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        if self.prefix_cache_stats is not None and not self.stats_at_admission:
            self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)
        return blocks, num_hits

    def peek_computed_blocks(self, request: Request) -> tuple[HitBlocks, int]:
        """Lookup; records no stats, changes no state: what ``get_computed_blocks`` would return."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return NO_HITS, 0
        return self.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)

    def repeat_lookup(self, request: Request, num_hits: int) -> None:
        """Records stats only: one lookup known to return ``num_hits`` again (the stats effect of
        ``get_computed_blocks``: nothing with ``stats_at_admission``, vLLM 0.33 records no refused
        lookup)."""
        if (
            self.enable_caching and not request.skip_reading_prefix_cache and self.prefix_cache_stats is not None
            and not self.stats_at_admission
        ):
            self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Records stats only, with ``stats_at_admission``: the admission of ``request`` with
        ``num_hits`` hit tokens (vLLM 0.33 ``KVCacheManager.record_prefix_cache_stats``, called
        after ``allocate_slots`` succeeds; a request that skipped the lookup -- caching off,
        ``prompt_logprobs`` -- is not counted; a resumed one goes to ``preempted_*``)."""
        if (
            self.stats_at_admission and self.prefix_cache_stats is not None and self.enable_caching
            and not request.skip_reading_prefix_cache
        ):
            self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    # -- allocation ---------------------------------------------------------------------------
    def get_num_blocks_to_allocate(
        self,
        request: Request,
        num_tokens: int,
        new_computed_blocks: HitBlocks = NO_HITS,
        num_computed_tokens: int = 0,
        *,
        apply_admission_cap: bool = False,
    ) -> int:
        """Query: free-queue blocks ``allocate_slots`` needs for the request to hold ``num_tokens``
        tokens with these hits after ``num_computed_tokens`` computed ones (free hits count,
        touching takes them off the queue; the watermark is not included)."""
        return self.coordinator.get_num_blocks_to_allocate(
            request.request_id, num_tokens, new_computed_blocks, num_computed_tokens, apply_admission_cap
        )

    def full_sequence_fits(
        self,
        request: Request,
        new_computed_blocks: HitBlocks = NO_HITS,
        num_new_computed_tokens: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> bool:
        """Query: whether ``allocate_slots``' full-sequence gate would pass now (the whole current
        sequence, with these hits, plus the watermark, fits the free queue)."""
        total = min(request.num_computed_tokens + num_new_computed_tokens, self.max_model_len)
        need = self.coordinator.get_num_blocks_to_allocate(
            request.request_id, min(request.num_tokens, self.max_model_len), new_computed_blocks, total, True
        )
        watermark = self.coordinator.watermark_for(request, has_scheduled_reqs)
        return need + watermark <= self.block_pool.get_num_free_blocks()

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: HitBlocks = NO_HITS,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        has_scheduled_reqs: bool = True,
    ) -> list[KVCacheBlock] | None:
        """Changes state: reserve slots for ``num_new_tokens`` more tokens (attaching the hits
        first); the new blocks, every group, group 0 first -- or None if they do not fit, and then
        nothing was touched, allocated or cached (a sliding-window skip removal aside)."""
        if num_new_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        return self._allocate_slots(
            request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
            full_sequence_must_fit, has_scheduled_reqs,
        )

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Changes state: pop what every group needs to hold ``num_tokens`` tokens of a running
        request, with no capacity, watermark or window check (for callers that know they fit: the
        decode fast-forward); the new blocks, group 0 first. Caches nothing."""
        return self.coordinator.allocate_new_blocks(request_id, num_tokens)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Changes state: cache the request's blocks that are full within its first ``num_tokens``
        tokens (the async scheduler's deferred caching; the decode fast-forward). Nothing when
        prefix caching is off, as vLLM's ``KVCacheManager.cache_blocks`` (its ``enable_caching``
        guard): an uncached pool never hashes a block, so freed blocks return to the queue head."""
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_tokens)

    def free(self, request: Request) -> None:
        """Changes state: release the request's blocks, each group last block first (its chain tail
        is evicted first). A request without blocks is a no-op."""
        self.coordinator.free(request.request_id)

    # -- prefix cache -------------------------------------------------------------------------
    def reset_prefix_cache(self) -> bool:
        """Changes state: vLLM's reset -- only with no block in use; flags the stats as reset."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Changes state: take the stats gathered since the last call (vLLM drains them every
        step); None when stats are off."""
        if self.prefix_cache_stats is None:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    # -- queries ------------------------------------------------------------------------------
    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """Query: the request's blocks, every group, group 0 first (null blocks included); do not
        mutate the list."""
        return self.coordinator.get_blocks(request_id)

    def get_block_ids(self, request_id: str) -> list[int]:
        """Query: ids of ``get_blocks``."""
        return [b.block_id for b in self.coordinator.get_blocks(request_id)]

    def get_blocks_by_group(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        """Query: the request's blocks, one list per group."""
        return self.coordinator.get_blocks_by_group(request_id)

    def get_block_ids_by_group(self, request_id: str) -> tuple[list[int], ...]:
        """Query: ids of ``get_blocks_by_group``."""
        return tuple([b.block_id for b in blocks] for blocks in self.coordinator.get_blocks_by_group(request_id))

    def num_blocks_held(self, requests: Iterable[Request]) -> list[int]:
        """Query: how many blocks each request holds, in order (group 0's count; 0 if none). One
        call for a whole batch: the decode fast-forward reads it for every running request."""
        return self.coordinator.num_blocks_held([r.request_id for r in requests])

    def num_cached_blocks_held(self, requests: Iterable[Request]) -> list[int]:
        """Query: ``get_num_cached_blocks`` of each request, in order (group 0), in one call."""
        return self.coordinator.num_cached_blocks_held([r.request_id for r in requests])

    def num_ready_decodes(self, running: Sequence[Request], start: int, limit: int, max_model_len: int) -> int:
        """Query: how many of ``running[start:start + limit]``, in order, are *ready decodes*: one
        token left to compute and none in flight (so ``schedule()`` asks for exactly one while
        ``max_model_len`` leaves room), its slot already allocated and its block not becoming full
        -- ``allocate_slots(r, 1)`` would return ``[]`` and change nothing, not even the cache
        observer. The scheduler schedules them in one go; 0 where the coordinator has no such path."""
        return self.coordinator.num_ready_decodes(running, start, limit, max_model_len)

    def get_num_cached_blocks(self, request_id: str, group_id: int = 0) -> int:
        """Query: how many of the request's blocks in ``group_id`` are counted cached (0 if none)."""
        return self.coordinator.get_num_cached_blocks(request_id, group_id)

    def request_ids(self) -> KeysView[str]:
        """Query: the requests holding blocks (a live view)."""
        return self.coordinator.request_ids()

    def check_integrity(self) -> None:
        """Query: assert the pool's and every request's block invariants (after each step in tests)."""
        self.coordinator.check_integrity()
