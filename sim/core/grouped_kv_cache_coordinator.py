"""Coordinators over one per-attention-type manager per KV-cache group (mirrors the generic
``KVCacheCoordinator`` of vLLM 0.25.1's ``vllm/v1/core/kv_cache_coordinator.py`` with its
``KVCacheCoordinatorNoPrefixCache`` and ``UnitaryKVCacheCoordinator``; the hybrid one is in
:mod:`sim.core.hybrid_kv_cache_coordinator`).

Behaviour mirrored exactly:

* **allocate_slots**, in vLLM's order: full-sequence gate (admission cap applied to SWA groups) ->
  ``remove_skipped_blocks`` in every group (kept even if the call then returns None) -> need
  summed over groups -> capacity check against the free queue (+ watermark) -> touch and attach
  the hits of *every* group before any new block is popped (so one group's allocation cannot
  evict another group's untouched hits) -> new blocks per group -> with caching on, cache
  ``min(computed + new, num_tokens)`` tokens.
* **cache_blocks**: every group caches the tokens rounded down to the scheduler block size (for
  one group that is its own block size, so no rounding).
* **free**: group by group (group 0 first), each group's blocks last-first in one ``free_blocks``.
* **No prefix cache**: lookups find nothing, no group is flagged EAGLE.
* **Unitary** (one group): the group's own search with alignment = its block size; EAGLE drops
  the last hit block.

Invariants (``check_integrity``): each block's ref count equals the number of (group, request)
lists holding it; a block is held by one group only; cached blocks held by a group carry that
group's key; full-attention lists hold no null block, SWA lists hold nulls only as a prefix; every
group holds the same requests. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import KeysView, Sequence
from typing import Any

from sim.core.full_attention_manager import FullAttentionManager
from sim.core.hashing import BlockHash
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_coordinator import NO_HITS, HitBlocks, KVCacheCoordinator
from sim.core.kv_cache_spec import KVGroupSpec
from sim.core.kv_events import EventSink
from sim.core.pool_impl import DEFAULT_POOL_IMPL, make_block_pool
from sim.core.request import Request
from sim.core.single_type_kv_cache_manager import SingleTypeKVCacheManager
from sim.core.sliding_window_manager import SlidingWindowManager

MANAGER_CLASSES: dict[str, type[SingleTypeKVCacheManager]] = {
    "full": FullAttentionManager,
    "sliding_window": SlidingWindowManager,
}
"""The per-group manager of each attention kind (vLLM's ``spec_manager_map``)."""


class GroupedKVCacheCoordinator(KVCacheCoordinator):
    """The shared allocation, caching and freeing over ``single_type_managers`` (one per group).

    Subclasses define the lookup (``find_longest_cache_hit``) and may refine ``cache_blocks``."""

    def __init__(
        self,
        groups: Sequence[KVGroupSpec],
        num_gpu_blocks: int,
        max_model_len: int,
        *,
        block_size: int,
        hash_block_size: int,
        max_num_batched_tokens: int,
        enable_caching: bool = True,
        use_eagle: bool = False,
        watermark_blocks: int = 0,
        event_sink: EventSink | None = None,
        retention_interval: int | None = None,
        pool_impl: str = DEFAULT_POOL_IMPL,
    ) -> None:
        self.groups = tuple(groups)
        self.block_pool = make_block_pool(num_gpu_blocks, enable_caching, event_sink, pool_impl)
        self.block_size = block_size
        self.hash_block_size = hash_block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.watermark_blocks = watermark_blocks
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            MANAGER_CLASSES[g.kind](
                g,
                self.block_pool,
                gid,
                scheduler_block_size=block_size,
                hash_block_size=hash_block_size,
                enable_caching=enable_caching,
                max_admission_blocks=g.max_admission_blocks_per_request(max_num_batched_tokens, max_model_len),
            )
            for gid, g in enumerate(self.groups)
        )
        # EAGLE: the flagged groups, or every group when EAGLE is on and none is flagged.
        self.eagle_group_ids = {gid for gid, g in enumerate(self.groups) if g.is_eagle_group}
        if use_eagle and not self.eagle_group_ids:
            self.eagle_group_ids = set(range(len(self.groups)))
        if retention_interval is not None:
            if not any(g.kind == "sliding_window" for g in self.groups):
                raise ValueError("retention_interval only applies to models with a sliding-window group")
            if retention_interval < 0 or retention_interval % block_size:
                raise ValueError(
                    f"retention_interval ({retention_interval}) must be a non-negative multiple of the "
                    f"scheduler block size ({block_size})"
                )
        self.retention_interval = retention_interval

    # -- allocation ---------------------------------------------------------------------------
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: HitBlocks,
        total_computed_tokens: int,
        apply_admission_cap: bool,
    ) -> int:
        n = 0
        for gid, m in enumerate(self.single_type_managers):
            hits = new_computed_blocks[gid] if new_computed_blocks else ()
            n += m.get_num_blocks_to_allocate(request_id, num_tokens, hits, total_computed_tokens, apply_admission_cap)
        return n

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: HitBlocks,
        num_lookahead_tokens: int,
        full_sequence_must_fit: bool,
        has_scheduled_reqs: bool,
    ) -> list[KVCacheBlock] | None:
        rid = request.request_id
        watermark_blocks = self.watermark_for(request, has_scheduled_reqs)
        hits = new_computed_blocks
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total = min(num_local, self.max_model_len)
        pool = self.block_pool
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            need_full = self.get_num_blocks_to_allocate(rid, full, hits, total, True)
            if need_full + watermark_blocks > pool.get_num_free_blocks():
                return None
        num_need_slot = min(total + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        # vLLM 0.33 frees on the processed-token basis (total - num_in_flight_tokens: an in-flight
        # step's window still reads below it); num_in_flight_tokens is tracked only under 0.33 with
        # async scheduling (sim.core.scheduler), else 0 here: 0.25.1's total
        processed = max(0, total - request.num_in_flight_tokens)
        for m in self.single_type_managers:
            m.remove_skipped_blocks(rid, processed)
        need = self.get_num_blocks_to_allocate(rid, num_need_slot, hits, num_local, False)
        if need + watermark_blocks > pool.get_num_free_blocks():
            return None
        if pool.observer is not None:  # sim.core.cache_observer: the allocation succeeds, nothing changed yet
            pool.observer.on_allocate(request, num_new_computed_tokens)
        if hits:
            if any(rid in m.num_cached_block for m in self.single_type_managers):
                raise AssertionError(f"{rid}: a running request cannot get new prefix hits")
            for gid, m in enumerate(self.single_type_managers):  # touch every group's hits first
                m.add_local_computed_blocks(rid, hits[gid], num_local)
        new_blocks = self.allocate_new_blocks(rid, num_need_slot)
        if self.enable_caching:
            self.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
        return new_blocks

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        if self.block_pool.observer is not None:
            self.block_pool.observer.on_allocate_new_blocks(request_id)
        new_blocks: list[KVCacheBlock] = []
        for m in self.single_type_managers:
            new_blocks.extend(m.allocate_new_blocks(request_id, num_tokens))
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        aligned = num_tokens // self.block_size * self.block_size
        for m in self.single_type_managers:
            m.cache_blocks(request, aligned, self.retention_interval)

    def free(self, request_id: str) -> None:
        for m in self.single_type_managers:
            m.free(request_id)

    # -- queries ------------------------------------------------------------------------------
    def get_blocks_by_group(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m.req_to_blocks.get(request_id, []) for m in self.single_type_managers)

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        for blocks in self.get_blocks_by_group(request_id):
            out.extend(blocks)
        return out

    def get_num_cached_blocks(self, request_id: str, group_id: int) -> int:
        return self.single_type_managers[group_id].num_cached_block.get(request_id, 0)

    def request_ids(self) -> KeysView[str]:
        return self.single_type_managers[0].req_to_blocks.keys()  # every group holds the same requests

    def check_integrity(self) -> None:
        """Pool invariants plus the per-group invariants of the module docstring, and: every
        non-null block counted cached that can serve a hit has a hash."""
        pool = self.block_pool
        pool.check_integrity()
        null = pool.null_block
        refs: dict[int, int] = {}
        owner: dict[int, int] = {}
        holders = set(self.request_ids())
        for gid, m in enumerate(self.single_type_managers):
            assert set(m.req_to_blocks) == holders, f"group {gid} holds other requests than group 0"
            assert set(m.num_cached_block) <= holders, f"group {gid}: num_cached_block for a non-holder"
            for rid, blocks in m.req_to_blocks.items():
                real = [b for b in blocks if b is not null]
                assert len({b.block_id for b in real}) == len(real), f"{rid} holds a block twice in group {gid}"
                if m.kind == "full":
                    assert len(real) == len(blocks), f"{rid}: null block in full-attention group {gid}"
                else:
                    n_null = len(blocks) - len(real)
                    assert all(b is null for b in blocks[:n_null]), (
                        f"{rid}: null blocks not a prefix in group {gid}"
                    )
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


class KVCacheCoordinatorNoPrefixCache(GroupedKVCacheCoordinator):
    """Prefix caching off: any group layout, no lookups, no EAGLE flags (vLLM's namesake)."""

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[HitBlocks, int]:
        return NO_HITS, 0


class UnitaryKVCacheCoordinator(GroupedKVCacheCoordinator):
    """One group of any attention kind, searched on its own (vLLM's namesake)."""

    def __init__(
        self, groups: Sequence[KVGroupSpec], num_gpu_blocks: int, max_model_len: int, **kwargs: Any
    ) -> None:
        super().__init__(groups, num_gpu_blocks, max_model_len, **kwargs)
        if len(self.groups) != 1:
            raise ValueError(f"the unitary coordinator takes one KV-cache group, got {len(self.groups)}")
        self.single_type_managers[0].use_eagle = 0 in self.eagle_group_ids

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[HitBlocks, int]:
        m = self.single_type_managers[0]
        blocks = m.find_longest_cache_hit(
            block_hashes, max_cache_hit_length, [0], self.block_pool, m.spec, m.use_eagle, m.block_size
        )
        return (blocks if blocks[0] else NO_HITS), len(blocks[0]) * m.block_size
