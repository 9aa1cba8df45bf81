"""The KV block pool (mirrors ``vllm/v1/core/block_pool.py`` of vLLM 0.25.1).

Invariants (checked by ``check_integrity``):

* block 0 is the null block: popped off the free queue at construction, never freed, touched
  back into the queue or cached; usable blocks are ``num_gpu_blocks - 1``;
* a block is in the free queue iff its ``ref_cnt == 0`` (null block excepted);
* a block is *cached* iff it has a hash key, and then it is in the hash map under that key; a
  cached block can be free -- an eviction candidate that can still be hit;
* **free is not evict**: a cached block loses its hash only when ``get_new_blocks`` hands it out
  again (or on reset / ``evict_blocks``);
* **no de-duplication** (:mod:`sim.core.block_hash_map`): identical content cached twice stays
  twice under one key; lookups return the first-inserted block still present;
* free order: ``free_blocks`` puts blocks that reach ``ref_cnt == 0`` without a hash at the head
  (reused first) and hashed ones at the tail, each list in the given order; callers free a
  request's blocks in reverse, so its chain tail is evicted before its head;
* the pool grows with the blocks it touches: ``blocks`` holds the blocks ever handed out (ids
  ``0 .. len(blocks) - 1``, block 0 the null block); a block never handed out has no object yet
  and sits, free, uncached and unreferenced, in the queue's run of never-used ids
  (:mod:`sim.core.free_block_queue`), which keeps vLLM's order exactly.

An optional ``observer`` (:mod:`sim.core.cache_observer`, set after construction like
``event_sink``) is told about every caching and every dropped key; it changes nothing.

Cost: every operation is O(blocks it touches); the one-group caching and the no-event allocation
have a fast path (one map call, no per-block method call); without an observer one None check per
call. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from sim.core.block_hash_map import BlockHashToBlockMap
from sim.core.cache_observer import EVICT_EXPLICIT, EVICT_RESET, EVICT_REUSED
from sim.core.free_block_queue import FreeKVCacheBlockQueue
from sim.core.hashing import block_extra_keys, external_block_hash
from sim.core.kv_cache_block import KVCacheBlock, make_block_key
from sim.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventSink

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.cache_observer import CacheObserver
    from sim.core.request import Request


class BlockPool:
    """Owns all blocks, the free queue and the hash map; emits KV events to an optional sink.

    Queries say so; every other method changes state. ``event_sink`` and ``observer`` may be set
    after construction (the replay loop records events and attributes misses that way)."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        event_sink: EventSink | None = None,
    ) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is the null block), got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        # made as they are first handed out (the free queue appends them): ids 0 .. len - 1
        self.blocks: list[KVCacheBlock] = []
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks, num_gpu_blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.event_sink = event_sink
        self.observer: CacheObserver | None = None  # sim.core.cache_observer: told, never consulted
        self.num_cached_blocks = 0  # blocks holding a hash (for per-step metrics)
        self._grouped = False  # set once a group other than 0 caches (hybrid models)
        self.num_evictions = 0  # cached blocks whose hash was dropped on reuse

    # -- lookup -------------------------------------------------------------------------------
    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """Query: the first-inserted cached block for ``block_hash`` in every group, or None on
        any miss."""
        out = []
        for gid in group_ids:
            block = self.cached_block_hash_to_block.get_one_block(make_block_key(block_hash, gid))
            if block is None:
                return None
            out.append(block)
        return out

    def longest_cached_prefix(self, block_hashes: Sequence[bytes], max_blocks: int) -> list[KVCacheBlock]:
        """Query: the first-inserted block of each of the first ``max_blocks`` keys, stopping at the
        first key not cached (the one-group full-attention hit search); O(hits)."""
        return self.cached_block_hash_to_block.longest_cached_prefix(islice(block_hashes, max_blocks))

    # -- caching ------------------------------------------------------------------------------
    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int = 0,
        *,
        block_hashes: Sequence[bytes] | None = None,
        mask: Sequence[bool] | None = None,
        spec_kind: str | None = None,
        sliding_window: int | None = None,
    ) -> None:
        """Give ``blocks[num_cached_blocks:num_full_blocks]`` their hashes and insert them.

        Null blocks, and blocks whose ``mask`` entry is False (SWA blocks that can never serve a
        hit), are skipped. ``block_hashes`` is the request's hash list as seen at this group's
        block size (default: ``request.block_hashes``). With an event sink, one ``BlockStored`` is
        emitted per call -- also when every block was skipped, as vLLM does.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes if block_hashes is None else block_hashes
        if len(hashes) < num_full_blocks:
            raise AssertionError(
                f"{request.request_id}: caching {num_full_blocks} blocks but only {len(hashes)} hashed"
            )
        cmap = self.cached_block_hash_to_block
        if block_hashes is None and group_id == 0 and mask is None and not self._grouped and self.event_sink is None:
            # hot path (one full-attention group, so no null blocks and group ids all 0), no events
            cmap.insert_blocks(blocks[num_cached_blocks:num_full_blocks], hashes[num_cached_blocks:num_full_blocks])
            self.num_cached_blocks += num_full_blocks - num_cached_blocks
            if self.observer is not None:
                self.observer.on_cache(request, blocks, num_cached_blocks, num_full_blocks, 0)
            return
        if group_id:
            self._grouped = True
        stored: list[int] = []
        kept: list[int] = []
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.is_null or (mask is not None and not mask[i - num_cached_blocks]):
                continue
            if blk.block_hash is not None:
                raise AssertionError(f"block {blk.block_id} already cached")
            key = hashes[i] if group_id == 0 else make_block_key(hashes[i], group_id)
            blk.block_hash = key
            blk.group_id = group_id
            cmap.insert(key, blk)
            self.num_cached_blocks += 1
            if self.event_sink is not None:
                stored.append(external_block_hash(hashes[i]))
                kept.append(i)
        if self.event_sink is not None:
            emit_stored(self.event_sink, request, hashes, stored, kept, num_cached_blocks, num_full_blocks,
                        block_size, group_id, spec_kind, sliding_window)
        if self.observer is not None:
            self.observer.on_cache(request, blocks, num_cached_blocks, num_full_blocks, group_id)

    # -- allocation ---------------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the head with ``ref_cnt = 1``, evicting their hashes now ("free
        is not evict"). Raises ValueError if the queue is shorter."""
        ret = self.free_block_queue.popleft_n(num_blocks)
        if self.enable_caching:
            if self.event_sink is not None:
                for block in ret:
                    if block.block_hash is not None:
                        self._evict(block)
            else:
                if self.observer is not None:
                    self.observer.on_evict(ret, EVICT_REUSED)
                n_evicted = self.cached_block_hash_to_block.evict_blocks(ret)
                self.num_cached_blocks -= n_evicted
                self.num_evictions += n_evicted
        for block in ret:
            block.ref_cnt = 1
        return ret

    def _evict(self, block: KVCacheBlock, reason: str = EVICT_REUSED) -> None:
        """Drop a cached block's hash, emitting ``BlockRemoved`` if it was in the map."""
        key = block.block_hash
        assert key is not None
        if self.observer is not None:
            self.observer.on_evict((block,), reason)
        if self.cached_block_hash_to_block.pop(key, block.block_id) is not None:
            self.num_evictions += 1
            if self.event_sink is not None:
                raw = key if block.group_id == 0 else key[:-4]
                self.event_sink(BlockRemoved(block_hashes=[external_block_hash(raw)], group_idx=block.group_id))
        block.block_hash = None
        self.num_cached_blocks -= 1

    def num_evictable(self, blocks: Iterable[KVCacheBlock]) -> int:
        """Query: how many of the hit ``blocks`` touching would take from the free queue (``ref_cnt``
        0, not the null block): vLLM's ``num_evictable_computed_blocks`` in
        ``SingleTypeKVCacheManager.get_num_blocks_to_allocate``."""
        n = 0
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                n += 1
        return n

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on hit blocks, unlinking free ones from the queue (they keep their hash)."""
        remove = self.free_block_queue.remove
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; unhashed blocks reaching 0 go to the head, hashed to the tail."""
        with_hash: list[KVCacheBlock] = []
        without_hash: list[KVCacheBlock] = []
        for block in ordered_blocks:
            rc = block.ref_cnt - 1
            block.ref_cnt = rc
            if rc == 0 and not block.is_null:
                if block.block_hash is None:
                    without_hash.append(block)
                else:
                    with_hash.append(block)
        if without_hash:
            self.free_block_queue.prepend_n(without_hash)
        if with_hash:
            self.free_block_queue.append_n(with_hash)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the hashes of the given blocks, even in-use ones, without freeing them (a block
        never handed out has none); IndexError for an id outside ``0 .. num_gpu_blocks - 1``."""
        blocks = self.blocks
        for bid in block_ids:
            if not 0 <= bid < self.num_gpu_blocks:
                raise IndexError(f"block id {bid} is not in a pool of {self.num_gpu_blocks} blocks")
            if bid < len(blocks):
                block = blocks[bid]
                if block.block_hash is not None:
                    self._evict(block, EVICT_EXPLICIT)

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; only allowed when no block is in use (the null block aside)."""
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:
            return False
        if self.observer is not None:
            self.observer.on_evict([b for b in self.blocks if b.block_hash is not None], EVICT_RESET)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.block_hash = None
        self.num_cached_blocks = 0
        if self.event_sink is not None:
            self.event_sink(AllBlocksCleared())
        return True

    # -- state --------------------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        """Query: blocks in the free queue (cached ones included)."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Query: vLLM's KV usage metric, ``1 - free / (num_gpu_blocks - 1)``."""
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)

    def free_block_ids(self) -> list[int]:
        """Query: free block ids, head (next reused) first."""
        return self.free_block_queue.block_ids()

    def check_integrity(self) -> None:
        """Assert every pool invariant; O(blocks handed out). Used after each step in tests."""
        assert self.null_block.block_id == 0 and self.null_block.block_hash is None
        assert self.null_block not in self.free_block_queue, "null block in free queue"
        self.free_block_queue.check_integrity()
        n_cached = 0
        for block in self.blocks[1:]:
            assert block.ref_cnt >= 0, f"block {block.block_id} ref_cnt {block.ref_cnt} < 0"
            in_queue = block in self.free_block_queue
            assert in_queue == (block.ref_cnt == 0), (
                f"block {block.block_id}: ref_cnt={block.ref_cnt} but in_free_queue={in_queue}"
            )
            if block.block_hash is not None:
                n_cached += 1
                assert block.block_id in self.cached_block_hash_to_block.block_ids(block.block_hash), (
                    f"block {block.block_id} has a hash but is not in the map under it"
                )
        n_mapped = 0
        for key, blocks in self.cached_block_hash_to_block.items():
            assert blocks, f"empty entry for key {key!r}"
            for b in blocks:
                assert b.block_hash == key, f"map entry for block {b.block_id} disagrees with its hash"
                n_mapped += 1
        assert n_mapped == n_cached == self.num_cached_blocks, (n_mapped, n_cached, self.num_cached_blocks)


def emit_stored(
    sink: EventSink,
    request: Request,
    hashes: Sequence[bytes],
    stored: list[int],
    kept: list[int],
    num_cached_blocks: int,
    num_full_blocks: int,
    block_size: int,
    group_id: int,
    spec_kind: str | None,
    sliding_window: int | None,
) -> None:
    """One ``BlockStored`` for a ``cache_full_blocks`` call (the masked blocks' tokens included);
    shared by this pool and the compiled one (``sim.core.compiled_pool``)."""
    extra_list: list[tuple[Any, ...] | None]
    if request.lora_name is None and not request.cache_salt and not request.mm_features:
        extra_list = [None] * len(kept)  # what block_extra_keys gives every block of such a request
    else:
        extra_list = []
        mm_idx = 0
        for i in kept:
            extra, mm_idx = block_extra_keys(request, i * block_size, (i + 1) * block_size, mm_idx)
            extra_list.append(extra)
    sink(
        BlockStored(
            block_hashes=stored,
            parent_block_hash=external_block_hash(hashes[num_cached_blocks - 1]) if num_cached_blocks else None,
            token_ids=request.token_span(num_cached_blocks * block_size, num_full_blocks * block_size),
            block_size=block_size,
            lora_id=request.lora_int_id if request.lora_name is not None else None,
            lora_name=request.lora_name,
            extra_keys=extra_list or None,
            group_idx=group_id,
            kv_cache_spec_kind=spec_kind,
            kv_cache_spec_sliding_window=sliding_window,
        )
    )
