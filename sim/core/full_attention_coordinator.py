"""The single full-attention group's coordinator: the optimised path (mirrors vLLM 0.25.1's
``UnitaryKVCacheCoordinator`` over one ``FullAttentionManager``, ``vllm/v1/core/kv_cache_coordinator.py``
and ``single_type_kv_cache_manager.py``, fused into one class).

Behaviour mirrored exactly:

* lookup: the longest contiguous run of cached block hashes within ``max_cache_hit_length`` tokens
  (so a fully cached prompt of k full blocks hits k-1 of them), minus the last block with EAGLE;
* ``allocate_slots``: the full-sequence gate checks the whole current sequence; a hit block with
  ``ref_cnt == 0`` costs one free block (touching removes it from the free queue); on None nothing
  was touched, allocated or cached. Otherwise hits are touched first, then new blocks are popped,
  then newly full blocks are cached up to ``min(computed + new, request.num_tokens)`` tokens -- at
  schedule time, before compute;
* with prefix caching off it is vLLM's ``KVCacheCoordinatorNoPrefixCache`` over this group: hits
  never reach it, and ``allocate_slots`` caches nothing;
* ``free``: a request's blocks in reverse order.

Cost: lookups O(hit blocks) in one hash-map call; a decode token whose slot is already allocated
returns before any block work. Its oracle is the generic
:class:`~sim.core.grouped_kv_cache_coordinator.UnitaryKVCacheCoordinator` (equality is a test).
Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import KeysView, Sequence

from sim.core.block_pool import BlockPool
from sim.core.hashing import BlockHash
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_coordinator import NO_HITS, HitBlocks, KVCacheCoordinator
from sim.core.kv_cache_spec import KVGroupSpec, cdiv
from sim.core.kv_events import EventSink
from sim.core.pool_impl import DEFAULT_POOL_IMPL, make_block_pool
from sim.core.request import PREEMPTED, RUNNING, WAITING, Request

_NO_BLOCKS: list[KVCacheBlock] = []  # never mutated


class UnitaryFullAttentionCoordinator(KVCacheCoordinator):
    """One full-attention group of ``block_size`` on its own pool (request -> blocks, cached count)."""

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        max_model_len: int,
        *,
        enable_caching: bool = True,
        use_eagle: bool = False,
        watermark_blocks: int = 0,
        event_sink: EventSink | None = None,
        pool_impl: str = DEFAULT_POOL_IMPL,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        # vLLM 0.33 lookahead hashes (EAGLE): a full block is cached only once its hash exists
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.block_pool: BlockPool = make_block_pool(num_gpu_blocks, enable_caching, event_sink, pool_impl)
        self.groups = (KVGroupSpec("full", block_size),)
        self.block_size = self.hash_block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.watermark_blocks = watermark_blocks
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}

    # -- lookup -------------------------------------------------------------------------------
    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[HitBlocks, int]:
        blocks = self.block_pool.longest_cached_prefix(block_hashes, max_cache_hit_length // self.block_size)
        if not blocks:
            return NO_HITS, 0
        if self.use_eagle:
            blocks.pop()
            if not blocks:
                return NO_HITS, 0
        return (blocks,), len(blocks) * self.block_size

    # -- allocation ---------------------------------------------------------------------------
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: HitBlocks,
        total_computed_tokens: int = 0,
        apply_admission_cap: bool = False,
    ) -> int:
        # full attention skips no token and has no admission cap: the last two do not matter
        hits = new_computed_blocks[0] if new_computed_blocks else _NO_BLOCKS
        return self._num_blocks_to_allocate(request_id, num_tokens, hits)

    def _num_blocks_to_allocate(self, request_id: str, num_tokens: int, hits: list[KVCacheBlock]) -> int:
        required = cdiv(num_tokens, self.block_size)
        req_blocks = self.req_to_blocks.get(request_id, _NO_BLOCKS)
        if request_id in self.num_cached_block:  # running: no new hits
            return max(required - len(req_blocks), 0)
        new = max(required - len(hits) - len(req_blocks), 0)
        # hit blocks with ref_cnt 0 each cost a free block when touched: counted by the pool in one
        # call (compiled, the coordinator would read two attributes a block through the generic API)
        return new + self.block_pool.num_evictable(hits) if hits else new

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
        if num_new_tokens == 1 and not new_computed_blocks and not num_lookahead_tokens:
            # Hot path, same outcome as the general path below: a running request's next token
            # whose slot is already allocated and whose block does not become full needs no new
            # block (so no capacity check can fail: a running request has no watermark) and
            # caches nothing.
            req_blocks = self.req_to_blocks.get(rid)
            if req_blocks is not None and request.status == RUNNING:
                n = request.num_computed_tokens + num_new_computed_tokens + 1
                if (
                    n <= len(req_blocks) * self.block_size
                    and n // self.block_size <= self.num_cached_block.get(rid, 0)
                    and n <= self.max_model_len
                ):
                    return []
        hits = new_computed_blocks[0] if new_computed_blocks else _NO_BLOCKS
        # KVCacheCoordinator.watermark_for, inlined
        watermark_blocks = 0
        if has_scheduled_reqs and (
            request.status == WAITING or request.status == PREEMPTED
        ):
            watermark_blocks = self.watermark_blocks
        total_computed = min(request.num_computed_tokens + num_new_computed_tokens, self.max_model_len)
        num_free = self.block_pool.get_num_free_blocks()
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self._num_blocks_to_allocate(rid, full, hits) + watermark_blocks > num_free:
                return None
        num_need_slot = min(total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if self._num_blocks_to_allocate(rid, num_need_slot, hits) + watermark_blocks > num_free:
            return None
        obs = self.block_pool.observer
        if obs is not None:  # sim.core.cache_observer: the allocation succeeds, nothing changed yet
            obs.on_allocate(request, num_new_computed_tokens)

        req_blocks = self.req_to_blocks.get(rid)
        if req_blocks is None:
            req_blocks = self.req_to_blocks[rid] = []
        if hits:
            if rid in self.num_cached_block:
                raise AssertionError(f"{rid}: a running request cannot get new prefix hits")
            if self.enable_caching:
                self.block_pool.touch(hits)
            req_blocks.extend(hits)
            self.num_cached_block[rid] = len(req_blocks)

        num_new_blocks = cdiv(num_need_slot, self.block_size) - len(req_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        if new_blocks:
            req_blocks.extend(new_blocks)
        if self.enable_caching:
            self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def allocate_for_load(
        self,
        request: Request,
        num_local_computed_tokens: int,
        new_computed_blocks: HitBlocks,
        num_external_computed_tokens: int,
        full_sequence_must_fit: bool,
        reserved_blocks: int,
        has_scheduled_reqs: bool,
    ) -> bool:
        """Changes state: vLLM 0.33.0's ``allocate_slots(request, 0, local, hits,
        num_external_computed_tokens=ext, delay_cache_blocks=True, reserved_blocks=...)`` for a
        waiting request whose CPU hit loads asynchronously: the hits are touched and appended, then
        fresh blocks for the external tokens are popped, and nothing is cached (the caller caches
        them once the load lands). The allocation must leave ``reserved_blocks`` free (the
        remaining blocks of in-flight prefills). False (nothing touched) if it does not fit."""
        rid = request.request_id
        hits = new_computed_blocks[0] if new_computed_blocks else _NO_BLOCKS
        watermark_blocks = 0
        if has_scheduled_reqs and (request.status == WAITING or request.status == PREEMPTED):
            watermark_blocks = self.watermark_blocks
        num_total = num_local_computed_tokens + num_external_computed_tokens
        num_need_slot = min(request.num_computed_tokens + num_total, self.max_model_len)
        num_free = self.block_pool.get_num_free_blocks()
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self._num_blocks_to_allocate(rid, full, hits) + watermark_blocks > num_free:
                return False
        if self._num_blocks_to_allocate(rid, num_need_slot, hits) + watermark_blocks > num_free - reserved_blocks:
            return False
        obs = self.block_pool.observer
        if obs is not None:
            obs.on_allocate(request, num_local_computed_tokens)
        req_blocks = self.req_to_blocks.setdefault(rid, [])
        if self.enable_caching and hits:
            self.block_pool.touch(hits)
        req_blocks.extend(hits)
        self.num_cached_block[rid] = len(req_blocks)
        # vLLM allocate_external_computed_blocks, then allocate_new_blocks (nothing left for a
        # load: the external blocks cover every computed token)
        n = max(cdiv(num_total, self.block_size), cdiv(num_need_slot, self.block_size)) - len(req_blocks)
        if n > 0:
            req_blocks.extend(self.block_pool.get_new_blocks(n))
        return True

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """Changes state: forget the request's blocks without returning them to the pool (vLLM
        0.33.0 ``pop_blocks_for_free``, async scheduling's deferred free); the caller frees them
        later in reverse order. The blocks in allocation order."""
        self.num_cached_block.pop(request_id, None)
        return self.req_to_blocks.pop(request_id, [])

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        n = -(-num_tokens // self.block_size) - len(req_blocks)  # cdiv, inlined (decode fast-forward)
        if n <= 0:
            return []
        if self.block_pool.observer is not None:
            self.block_pool.observer.on_allocate_new_blocks(request_id)
        new_blocks = self.block_pool.get_new_blocks(n)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        if self.num_hash_lookahead_tokens:
            # 0.33 SingleTypeKVCacheManager.cache_blocks: min(num_tokens, num_hashed_tokens)
            num_tokens = min(num_tokens, len(request.block_hashes) * self.block_size)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        # vLLM's KVCacheManager annotates every BlockStored with its group's spec kind: one full-
        # attention group here (the per-group managers pass KVGroupSpec.event_kind, the same value)
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[rid], num_cached, num_full, self.block_size,
                                          spec_kind="full_attention")
        self.num_cached_block[rid] = num_full

    def free(self, request_id: str) -> None:
        # reverse order, as vLLM's SingleTypeKVCacheManager.free: the chain tail is evicted first
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if blocks:
            self.block_pool.free_blocks(blocks[::-1])

    # -- queries ------------------------------------------------------------------------------
    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """Query: the live block list (do not mutate it), or an empty list."""
        return self.req_to_blocks.get(request_id, [])

    def get_blocks_by_group(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return (self.get_blocks(request_id),)

    def num_blocks_held(self, request_ids: Sequence[str]) -> list[int]:
        get = self.req_to_blocks.get
        return [len(get(rid, ())) for rid in request_ids]

    def num_cached_blocks_held(self, request_ids: Sequence[str]) -> list[int]:
        get = self.num_cached_block.get
        return [get(rid, 0) for rid in request_ids]

    def num_ready_decodes(self, running: Sequence[Request], start: int, limit: int, max_model_len: int) -> int:
        # the conditions of allocate_slots' hot path (above) for num_new_tokens 1, plus those under
        # which the scheduler asks for exactly one token: one token left to compute, none in flight,
        # room before max_model_len
        bs = self.block_size
        cap = min(max_model_len - 1, self.max_model_len)
        get_blocks = self.req_to_blocks.get
        get_cached = self.num_cached_block.get
        stop = min(len(running), start + limit)
        i = start
        while i < stop:
            r = running[i]
            n = r.num_computed_tokens + 1
            if r.num_tokens != n or r.num_output_placeholders or n > cap or r.status != RUNNING:
                break
            rid = r.request_id
            blocks = get_blocks(rid)
            if blocks is None or n > len(blocks) * bs or n // bs > get_cached(rid, 0):
                break
            i += 1
        return i - start

    def get_num_cached_blocks(self, request_id: str, group_id: int = 0) -> int:
        if group_id:
            raise IndexError(f"group {group_id}: this coordinator has one group")
        return self.num_cached_block.get(request_id, 0)

    def request_ids(self) -> KeysView[str]:
        return self.req_to_blocks.keys()

    def check_integrity(self, deferred: Sequence[KVCacheBlock] = ()) -> None:
        """Pool invariants plus: ref counts equal the number of requests holding each block, counting
        ``deferred`` (blocks whose free is deferred, async scheduling with a KV connector) as held."""
        self.block_pool.check_integrity()
        refs: dict[int, int] = {}
        for b in deferred:
            refs[b.block_id] = refs.get(b.block_id, 0) + 1
        for rid, blocks in self.req_to_blocks.items():
            assert len({b.block_id for b in blocks}) == len(blocks), f"{rid} holds a block twice"
            for b in blocks:
                refs[b.block_id] = refs.get(b.block_id, 0) + 1
            n_cached = self.num_cached_block.get(rid, 0)
            assert n_cached <= len(blocks), f"{rid}: num_cached_block {n_cached} > {len(blocks)} blocks"
            for b in blocks[:n_cached]:
                assert b.block_hash is not None, f"{rid}: block {b.block_id} counted cached but has no hash"
        for b in self.block_pool.blocks[1:]:
            assert b.ref_cnt == refs.get(b.block_id, 0), (
                f"block {b.block_id}: ref_cnt {b.ref_cnt} != holders {refs.get(b.block_id, 0)}"
            )
