"""KV-cache manager for sliding-window and hybrid models: several KV-cache groups, possibly with
different block sizes, on one block pool (mirrors vLLM 0.25.1's ``vllm/v1/core/kv_cache_manager.py``
with ``UnitaryKVCacheCoordinator`` / ``HybridKVCacheCoordinator`` /
``KVCacheCoordinatorNoPrefixCache`` of ``vllm/v1/core/kv_cache_coordinator.py``).

:class:`HybridKVCacheManager` has the public interface the scheduler uses on
:class:`sim.core.kv_cache_manager.KVCacheManager`; a model with one full-attention group keeps using
that optimised class. Block lists returned to the scheduler (``allocate_slots``, ``get_blocks``,
``get_block_ids``) are flat: every group's blocks, group 0 first (``*_by_group`` give them per
group). ``req_to_blocks`` is group 0's per-request lists (every group holds the same requests);
per-group state lives in ``managers[g]``.

Behaviour mirrored exactly:

* **Lookup** (``get_computed_blocks``): skipped when caching is off or the request skips reading;
  ``max_cache_hit_length = num_tokens - 1``; stats recorded in tokens for every lookup. One group
  (*unitary*): the group's own search with alignment = its block size. Several groups (*hybrid*):
  groups with equal specs are searched jointly (every group id must hit), full attention first;
  a fixed point over the candidate length, each spec group either keeping or shrinking it (full
  attention is searched once, then only rounds down; an EAGLE group not yet verified at the
  current length searches one block further, capped at the max, and drops its last block; a
  non-EAGLE shrink clears the verifications); one round for exactly {full attention, one other};
  alignment = the scheduler block size (LCM); full-attention hits truncated to the final length.
  Hits are returned untouched: ``()`` when no group hit anything, else one list per group.
* **allocate_slots**, in vLLM's order: full-sequence gate (admission cap applied to SWA groups) ->
  ``remove_skipped_blocks`` in every group (kept even if the call then returns None) -> need
  summed over groups -> capacity check against the free queue (+ watermark) -> touch and attach
  the hits of *every* group before any new block is popped -> new blocks per group -> cache
  ``min(computed + new, num_tokens)`` tokens: unitary as is; hybrid rounded down to the scheduler
  block size, EAGLE groups one group block further (capped at the unrounded count).
* **free**: group by group (group 0 first), each group's blocks last-first in one
  ``free_blocks`` call.

Out of scope (as in the brief): Mamba, chunked-local, cross-attention, R-SWA and sink managers,
KV connectors / external tokens, DCP/PCP, ``cache_partial_block`` (never called in 0.25.1).

This module imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from sim.core.block_pool import BlockPool, KVCacheBlock
from sim.core.kv_cache_manager import PrefixCacheAccounting, PrefixCacheStats
from sim.core.kv_events import EventSink
from sim.core.kv_groups import (
    MANAGER_CLASSES,
    KVGroupSpec,
    SingleTypeManager,
    check_groups,
    hash_view,
)
from sim.core.request import Request, RequestStatus

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.scheduler import CacheConfig, SchedulerConfig

HitBlocks = tuple[list[KVCacheBlock], ...]
"""One list of hit blocks per group, or ``()`` when no group hit anything."""


class _SpecGroup(NamedTuple):
    spec: KVGroupSpec
    group_ids: list[int]
    manager_cls: type[SingleTypeManager]
    use_eagle: bool


class HybridKVCacheManager(PrefixCacheAccounting):
    """Block bookkeeping for one or more KV-cache groups on a shared :class:`BlockPool`."""

    def __init__(
        self,
        groups: Sequence[KVGroupSpec],
        num_gpu_blocks: int,
        max_model_len: int,
        *,
        max_num_batched_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = True,
        watermark: float = 0.0,
        event_sink: EventSink | None = None,
        hash_block_size: int | None = None,
        retention_interval: int | None = None,
    ) -> None:
        groups = tuple(groups)
        if not groups:
            raise ValueError("at least one KV-cache group is required")
        if watermark < 0:
            raise ValueError("watermark must be non-negative")
        self.groups = groups
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.block_size, self.hash_block_size = check_groups(groups, enable_caching, hash_block_size)
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max_model_len
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, event_sink)
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        self.managers: tuple[SingleTypeManager, ...] = tuple(
            MANAGER_CLASSES[g.kind](
                g,
                self.block_pool,
                gid,
                scheduler_block_size=self.block_size,
                hash_block_size=self.hash_block_size,
                enable_caching=enable_caching,
                max_admission_blocks=g.max_admission_blocks_per_request(max_num_batched_tokens, max_model_len),
            )
            for gid, g in enumerate(groups)
        )
        # EAGLE: the flagged groups, or every group when EAGLE is on and none is flagged.
        self.eagle_group_ids = {gid for gid, g in enumerate(groups) if g.is_eagle_group}
        if use_eagle and not self.eagle_group_ids:
            self.eagle_group_ids = set(range(len(groups)))
        if retention_interval is not None:
            if not any(g.kind == "sliding_window" for g in groups):
                raise ValueError("retention_interval only applies to models with a sliding-window group")
            if retention_interval < 0 or retention_interval % self.block_size:
                raise ValueError(
                    f"retention_interval ({retention_interval}) must be a non-negative multiple of the "
                    f"scheduler block size ({self.block_size})"
                )
        self.retention_interval = retention_interval
        self.unitary = len(groups) == 1
        self.spec_groups: list[_SpecGroup] = []
        if not enable_caching:
            return  # vLLM's KVCacheCoordinatorNoPrefixCache: no lookups, no caching, no EAGLE flags
        if self.unitary:
            self.managers[0].use_eagle = 0 in self.eagle_group_ids
            return
        for gid, g in enumerate(groups):
            eagle = gid in self.eagle_group_ids
            for idx, sg in enumerate(self.spec_groups):
                if sg.spec.spec_key == g.spec_key:
                    sg.group_ids.append(gid)
                    if eagle and not sg.use_eagle:
                        self.spec_groups[idx] = sg._replace(use_eagle=True)
                    break
            else:
                self.spec_groups.append(_SpecGroup(g, [gid], MANAGER_CLASSES[g.kind], eagle))
        assert len(self.spec_groups) >= 2  # check_groups
        self.spec_groups.sort(key=lambda sg: sg.spec.kind != "full")  # full attention first (stable)
        for sg in self.spec_groups:
            if sg.use_eagle:
                for gid in sg.group_ids:
                    self.managers[gid].use_eagle = True
        self.num_uncached_common_prefix_tokens = 0

    @classmethod
    def from_configs(
        cls,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        *,
        log_stats: bool = True,
        event_sink: EventSink | None = None,
        retention_interval: int | None = None,
    ) -> HybridKVCacheManager:
        """The manager for ``cache_config.kv_groups``; ``cache_config.block_size`` must be the
        scheduler block size (the LCM of the group sizes)."""
        groups = tuple(cache_config.kv_groups)
        sched_bs, _ = check_groups(groups, cache_config.enable_prefix_caching, cache_config.hash_block_size)
        if cache_config.block_size != sched_bs:
            raise ValueError(
                f"CacheConfig.block_size ({cache_config.block_size}) must be the scheduler block size of "
                f"kv_groups (the LCM of their block sizes: {sched_bs})"
            )
        return cls(
            groups,
            cache_config.num_gpu_blocks,
            scheduler_config.max_model_len,
            max_num_batched_tokens=scheduler_config.max_num_batched_tokens,
            enable_caching=cache_config.enable_prefix_caching,
            use_eagle=cache_config.use_eagle,
            log_stats=log_stats,
            watermark=scheduler_config.watermark,
            event_sink=event_sink,
            hash_block_size=cache_config.hash_block_size,
            retention_interval=retention_interval,
        )

    # -- lookup -------------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[HitBlocks, int]:
        """The cached prefix usable by ``request`` per group, and its length in tokens."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return (), 0
        max_len = request.num_tokens - 1
        if self.unitary:
            blocks, num_hits = self._find_unitary(request.block_hashes, max_len)
        else:
            blocks, num_hits = self._find_hybrid(request.block_hashes, max_len)
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)
        return (blocks if any(blocks) else ()), num_hits

    def _find_unitary(self, block_hashes: Sequence[bytes], max_len: int) -> tuple[HitBlocks, int]:
        m = self.managers[0]
        blocks = m.find_longest_cache_hit(
            block_hashes, max_len, [0], self.block_pool, m.spec, 0 in self.eagle_group_ids, m.block_size
        )
        return blocks, len(blocks[0]) * m.block_size

    def _find_hybrid(self, block_hashes: Sequence[bytes], max_len: int) -> tuple[HitBlocks, int]:
        hit_length = max_len
        longest = 0
        by_group: list[list[KVCacheBlock] | None] = [None] * len(self.groups)
        simple = len(self.spec_groups) == 2 and self.spec_groups[0].spec.kind == "full"
        eagle_verified: set[int] = set()  # spec groups whose EAGLE drop holds at the current length
        while True:
            curr = hit_length
            for idx, (spec, gids, mcls, eagle) in enumerate(self.spec_groups):
                if spec.kind == "full" and by_group[gids[0]] is not None:
                    curr = curr // spec.block_size * spec.block_size  # downward-closed: no new search
                    continue
                drop = eagle and idx not in eagle_verified
                length = min(curr + spec.block_size, max_len) if drop else curr
                hits = mcls.find_longest_cache_hit(
                    hash_view(block_hashes, self.hash_block_size, spec.block_size),
                    length,
                    gids,
                    self.block_pool,
                    spec,
                    drop,
                    self.block_size,
                )
                new_len = len(hits[0]) * spec.block_size
                if drop:
                    eagle_verified.add(idx)
                elif new_len < curr:
                    eagle_verified.clear()
                curr = new_len
                for gid, blocks in zip(gids, hits):
                    by_group[gid] = blocks
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        first = self.spec_groups[0]
        if first.spec.kind == "full":
            n = hit_length // first.spec.block_size
            for gid in first.group_ids:
                blks = by_group[gid]
                if blks is not None:
                    del blks[n:]
        self.num_uncached_common_prefix_tokens = longest - hit_length
        return tuple(b if b is not None else [] for b in by_group), hit_length

    # -- allocation ---------------------------------------------------------------------------
    def _num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, hits: HitBlocks, total_computed: int, cap: bool
    ) -> int:
        n = 0
        for gid, m in enumerate(self.managers):
            n += m.get_num_blocks_to_allocate(request_id, num_tokens, hits[gid] if hits else (), total_computed, cap)
        return n

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: HitBlocks | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        has_scheduled_reqs: bool = True,
    ) -> list[KVCacheBlock] | None:
        """Reserve slots for ``num_new_tokens`` more tokens; the new blocks (all groups, group 0
        first), or None -- then only the sliding-window skip removal has happened."""
        if num_new_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        rid = request.request_id
        hits = new_computed_blocks or ()
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total = min(num_local, self.max_model_len)
        watermark = 0
        if has_scheduled_reqs and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            watermark = self.watermark_blocks
        free = self.block_pool.free_block_queue
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self._num_blocks_to_allocate(rid, full, hits, total, True) + watermark > free.num_free_blocks:
                return None
        num_need_slot = min(total + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        for m in self.managers:
            m.remove_skipped_blocks(rid, total)
        if self._num_blocks_to_allocate(rid, num_need_slot, hits, num_local, False) + watermark > free.num_free_blocks:
            return None
        if hits:
            if any(rid in m.num_cached_block for m in self.managers):
                raise AssertionError(f"{rid}: a running request cannot get new prefix hits")
            for gid, m in enumerate(self.managers):  # touch every group's hits before popping any
                m.add_local_computed_blocks(rid, hits[gid], num_local)
        new_blocks: list[KVCacheBlock] = []
        for m in self.managers:
            new_blocks.extend(m.allocate_new_blocks(rid, num_need_slot))
        if self.enable_caching:
            self.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache every group's blocks that are full within the first ``num_tokens`` tokens
        (hybrid: rounded down to the scheduler block size; EAGLE groups one block further)."""
        if self.unitary:
            self.managers[0].cache_blocks(request, num_tokens, self.retention_interval)
            return
        aligned = num_tokens // self.block_size * self.block_size
        for m in self.managers:
            n = aligned
            if m.use_eagle and aligned > 0:
                n = min(num_tokens, aligned + m.block_size)
            m.cache_blocks(request, n, self.retention_interval)

    def free(self, request: Request) -> None:
        """Release the request's blocks, group by group, each group last block first."""
        for m in self.managers:
            m.free(request.request_id)

    # -- misc ---------------------------------------------------------------------------------
    @property
    def req_to_blocks(self) -> dict[str, list[KVCacheBlock]]:
        """Group 0's request -> blocks map (the same requests hold blocks in every group)."""
        return self.managers[0].req_to_blocks

    def get_blocks_by_group(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m.req_to_blocks.get(request_id, []) for m in self.managers)

    def get_block_ids_by_group(self, request_id: str) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in blocks] for blocks in self.get_blocks_by_group(request_id))

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """Every group's blocks of the request, flattened (group 0 first; null blocks included)."""
        out: list[KVCacheBlock] = []
        for blocks in self.get_blocks_by_group(request_id):
            out.extend(blocks)
        return out

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.get_blocks(request_id)]

    def describe(self) -> dict[str, Any]:
        return {
            "groups": [g.spec_key for g in self.groups],
            "scheduler_block_size": self.block_size,
            "hash_block_size": self.hash_block_size,
        }

    def check_integrity(self) -> None:
        """Pool invariants plus, over all groups: each block's ref count equals the number of
        (group, request) lists holding it, a block is held by one group only, cached blocks held
        by a group carry that group's key, full-attention lists hold no null block, SWA lists hold
        nulls only as a prefix, every group holds the same requests, and every non-null block
        counted cached that can serve a hit has a hash."""
        pool = self.block_pool
        pool.check_integrity()
        null = pool.null_block
        refs: dict[int, int] = {}
        owner: dict[int, int] = {}
        holders = set(self.managers[0].req_to_blocks)
        for gid, m in enumerate(self.managers):
            assert set(m.req_to_blocks) == holders, f"group {gid} holds other requests than group 0"
            assert set(m.num_cached_block) <= holders, f"group {gid}: num_cached_block for a non-holder"
            for rid, blocks in m.req_to_blocks.items():
                real = [b for b in blocks if b is not null]
                assert len({b.block_id for b in real}) == len(real), f"{rid} holds a block twice in group {gid}"
                if m.kind == "full":
                    assert len(real) == len(blocks), f"{rid}: null block in full-attention group {gid}"
                else:
                    n_null = len(blocks) - len(real)
                    assert all(b is null for b in blocks[:n_null]), f"{rid}: null blocks not a prefix in group {gid}"
                for b in real:
                    refs[b.block_id] = refs.get(b.block_id, 0) + 1
                    prev = owner.setdefault(b.block_id, gid)
                    assert prev == gid, f"block {b.block_id} held by groups {prev} and {gid}"
                    if b.block_hash is not None:
                        assert b.group_id == gid, f"block {b.block_id} cached for group {b.group_id}, held by {gid}"
                n_cached = m.num_cached_block.get(rid, 0)
                assert n_cached <= len(blocks), f"{rid}: num_cached_block {n_cached} > {len(blocks)} blocks"
                if self.enable_caching and self.retention_interval is None and n_cached:
                    mask = m.reachable_block_mask(0, n_cached, m.scheduler_block_size, m.spec, m.use_eagle)
                    for i, b in enumerate(blocks[:n_cached]):
                        if b is not null and (mask is None or mask[i]):
                            assert b.block_hash is not None, (
                                f"{rid}: block {b.block_id} (group {gid}, index {i}) counted cached but has no hash"
                            )
        for b in pool.blocks[1:]:
            assert b.ref_cnt == refs.get(b.block_id, 0), (
                f"block {b.block_id}: ref_cnt {b.ref_cnt} != holders {refs.get(b.block_id, 0)}"
            )
