"""The KV block pool (mirrors ``vllm/v1/core/block_pool.py`` and the block/queue types of
``vllm/v1/core/kv_cache_utils.py``, vLLM 0.25.1).

Invariants (checked by ``check_integrity``):

* block 0 is the null block: popped off the free queue at construction, never freed, touched
  back into the queue or cached; usable blocks are ``num_gpu_blocks - 1``;
* a block is in the free queue iff its ``ref_cnt == 0`` (null block excepted);
* a block is *cached* iff it has a hash key, and then it is in the hash map under that key; a
  cached block can be free -- an eviction candidate that can still be hit;
* **free is not evict**: a cached block loses its hash only when ``get_new_blocks`` hands it out
  again (or on reset / ``evict_blocks``);
* **no de-duplication**: identical content cached twice stays twice under one key; lookups return
  the first-inserted block still present;
* free order: ``free_blocks`` puts blocks that reach ``ref_cnt == 0`` without a hash at the head
  (reused first) and hashed ones at the tail, each list in the given order; callers free a
  request's blocks in reverse, so its chain tail is evicted before its head.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING

from sim.core.hashing import block_extra_keys, external_block_hash
from sim.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventSink

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.request import Request

BlockKey = bytes
"""A map key: the block hash, plus the 4-byte big-endian group id for groups other than 0."""


def make_block_key(block_hash: bytes, group_id: int) -> BlockKey:
    """vLLM keys are ``hash || group_id (4 bytes)``; group 0 keeps the bare hash (same equality)."""
    return block_hash if group_id == 0 else block_hash + group_id.to_bytes(4, "big")


class KVCacheBlock:
    """Metadata of one physical KV block."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "group_id", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockKey | None = None  # the map key while cached
        self.group_id = 0
        self.is_null = False

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeKVCacheBlockQueue:
    """The free list in eviction order (head evicted first), O(1) everywhere.

    vLLM threads a doubly-linked list through the blocks; here the list is an ``OrderedDict``
    (CPython's C doubly-linked list), which gives the same operations and order.
    """

    __slots__ = ("_q",)

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._q: OrderedDict[KVCacheBlock, None] = OrderedDict.fromkeys(blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._q)

    def popleft(self) -> KVCacheBlock:
        if not self._q:
            raise ValueError("No free blocks available")
        return self._q.popitem(last=False)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > len(self._q):
            raise ValueError(f"cannot pop {n} of {len(self._q)} free blocks")
        pop = self._q.popitem
        return [pop(last=False)[0] for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        del self._q[block]

    def append(self, block: KVCacheBlock) -> None:
        self._q[block] = None

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._q.update(zip(blocks, repeat(None)))

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, keeping their order."""
        q = self._q
        move = q.move_to_end
        for b in reversed(blocks):
            q[b] = None
            move(b, last=False)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block in self._q

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        return list(self._q)

    def block_ids(self) -> list[int]:
        """Free block ids, head (next evicted) first."""
        return [b.block_id for b in self._q]


class BlockHashToBlockMap:
    """key -> block, or ``{block_id: block}`` when several blocks hold the same content."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[BlockKey, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockKey) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None or type(blocks) is KVCacheBlock:
            return blocks  # type: ignore[return-value]
        return next(iter(blocks.values()))  # type: ignore[union-attr]

    def insert(self, key: BlockKey, block: KVCacheBlock) -> None:
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif type(blocks) is KVCacheBlock:
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}  # type: ignore[union-attr]
        else:
            blocks[block.block_id] = block  # type: ignore[index]

    def pop(self, key: BlockKey, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.pop(key, None)
        if blocks is None:
            return None
        if type(blocks) is KVCacheBlock:
            if blocks.block_id == block_id:  # type: ignore[union-attr]
                return blocks  # type: ignore[return-value]
            self._cache[key] = blocks
            return None
        block = blocks.pop(block_id, None)  # type: ignore[union-attr]
        if blocks:
            self._cache[key] = blocks
        return block

    def block_ids(self, key: BlockKey) -> list[int]:
        """All block ids cached under ``key``, first-inserted first."""
        blocks = self._cache.get(key)
        if blocks is None:
            return []
        if type(blocks) is KVCacheBlock:
            return [blocks.block_id]  # type: ignore[union-attr]
        return list(blocks)  # type: ignore[arg-type]

    def items(self) -> Iterable[tuple[BlockKey, list[KVCacheBlock]]]:
        for key, blocks in self._cache.items():
            yield key, ([blocks] if type(blocks) is KVCacheBlock else list(blocks.values()))  # type: ignore[union-attr]

    def __len__(self) -> int:
        return len(self._cache)


class BlockPool:
    """Owns all blocks, the free queue and the hash map; emits KV events to an optional sink."""

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
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.event_sink = event_sink
        self.num_cached_blocks = 0  # blocks holding a hash (for per-step metrics)
        self._grouped = False  # set once a group other than 0 caches (hybrid models)
        self.num_evictions = 0  # cached blocks whose hash was dropped on reuse

    # -- lookup -------------------------------------------------------------------------------
    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """The first-inserted cached block for ``block_hash`` in every group, or None on any miss."""
        out = []
        for gid in group_ids:
            block = self.cached_block_hash_to_block.get_one_block(make_block_key(block_hash, gid))
            if block is None:
                return None
            out.append(block)
        return out

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
        setdefault = self.cached_block_hash_to_block._cache.setdefault
        if block_hashes is None and group_id == 0 and mask is None and not self._grouped and self.event_sink is None:
            # hot path (KVCacheManager: one full-attention group, so no null blocks and group ids
            # all 0), no events
            for blk, key in zip(blocks[num_cached_blocks:num_full_blocks], hashes[num_cached_blocks:num_full_blocks]):
                blk.block_hash = key
                entry = setdefault(key, blk)  # BlockHashToBlockMap.insert: no de-duplication
                if entry is not blk:
                    self._insert_duplicate(key, entry, blk)
            self.num_cached_blocks += num_full_blocks - num_cached_blocks
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
            entry = setdefault(key, blk)
            if entry is not blk:
                self._insert_duplicate(key, entry, blk)
            self.num_cached_blocks += 1
            if self.event_sink is not None:
                stored.append(external_block_hash(hashes[i]))
                kept.append(i)
        if self.event_sink is None:
            return
        extra_list = []
        mm_idx = 0
        for i in kept:
            extra, mm_idx = block_extra_keys(request, i * block_size, (i + 1) * block_size, mm_idx)
            extra_list.append(extra)
        self.event_sink(
            BlockStored(
                block_hashes=stored,
                parent_block_hash=external_block_hash(hashes[num_cached_blocks - 1]) if num_cached_blocks else None,
                token_ids=request.token_slice(num_cached_blocks * block_size, num_full_blocks * block_size).tolist(),
                block_size=block_size,
                lora_id=request.lora_int_id if request.lora_name is not None else None,
                lora_name=request.lora_name,
                extra_keys=extra_list or None,
                group_idx=group_id,
                kv_cache_spec_kind=spec_kind,
                kv_cache_spec_sliding_window=sliding_window,
            )
        )

    def _insert_duplicate(self, key: BlockKey, entry: KVCacheBlock | dict[int, KVCacheBlock], blk: KVCacheBlock) -> None:
        """A second block with already-cached content: both stay (first-inserted is looked up)."""
        if type(entry) is KVCacheBlock:
            self.cached_block_hash_to_block._cache[key] = {entry.block_id: entry, blk.block_id: blk}  # type: ignore[union-attr]
        else:
            entry[blk.block_id] = blk  # type: ignore[index]

    # -- allocation ---------------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the head, evicting their hashes now ("free is not evict")."""
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = [b for b, _ in map(self.free_block_queue._q.popitem, repeat(False, num_blocks))]
        if not self.enable_caching:
            for block in ret:
                block.ref_cnt = 1
            return ret
        if self.event_sink is not None:
            for block in ret:
                if block.block_hash is not None:
                    self._evict(block)
                block.ref_cnt = 1
            return ret
        # hot path (no event sink): _evict inlined
        cpop = self.cached_block_hash_to_block._cache.pop
        n_evicted = 0
        for block in ret:
            key = block.block_hash
            if key is not None:
                entry = cpop(key)
                if entry is not block:  # several blocks hold this content: keep the others
                    self._restore_duplicates(key, entry, block)
                block.block_hash = None
                n_evicted += 1
            block.ref_cnt = 1
        self.num_cached_blocks -= n_evicted
        self.num_evictions += n_evicted
        return ret

    def _restore_duplicates(self, key: BlockKey, entry: KVCacheBlock | dict[int, KVCacheBlock], block: KVCacheBlock) -> None:
        """Undo the pop of ``key`` for every block but ``block`` (no de-duplication)."""
        assert type(entry) is dict, f"block {block.block_id} is cached but not under its key"
        del entry[block.block_id]
        if entry:
            self.cached_block_hash_to_block._cache[key] = entry

    def _evict(self, block: KVCacheBlock) -> None:
        """Drop a reused block's hash (BlockHashToBlockMap.pop inlined)."""
        key = block.block_hash
        assert key is not None
        cmap = self.cached_block_hash_to_block._cache
        entry = cmap.pop(key, None)
        removed = False
        if entry is block:
            removed = True
        elif entry is not None:
            if type(entry) is KVCacheBlock:
                cmap[key] = entry
            else:
                removed = entry.pop(block.block_id, None) is not None  # type: ignore[union-attr]
                if entry:
                    cmap[key] = entry
        if removed:
            self.num_evictions += 1
            if self.event_sink is not None:
                raw = key if block.group_id == 0 else key[:-4]
                self.event_sink(BlockRemoved(block_hashes=[external_block_hash(raw)], group_idx=block.group_id))
        block.block_hash = None
        self.num_cached_blocks -= 1

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
        """Drop the hashes of the given blocks, even in-use ones, without freeing them."""
        for bid in block_ids:
            block = self.blocks[bid]
            if block.block_hash is not None:
                self._evict(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; only allowed when no block is in use (the null block aside)."""
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.block_hash = None
        self.num_cached_blocks = 0
        if self.event_sink is not None:
            self.event_sink(AllBlocksCleared())
        return True

    # -- state --------------------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """vLLM's KV usage metric: ``1 - free / (num_gpu_blocks - 1)``."""
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)

    def free_block_ids(self) -> list[int]:
        return self.free_block_queue.block_ids()

    def check_integrity(self) -> None:
        """Assert every pool invariant; O(num_gpu_blocks). Used after each step in tests."""
        assert self.null_block.block_id == 0 and self.null_block.block_hash is None
        assert self.null_block not in self.free_block_queue, "null block in free queue"
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
