"""The prefix-cache index: block key -> cached block(s) (mirrors ``BlockHashToBlockMap`` of vLLM
0.25.1's ``vllm/v1/core/block_pool.py``).

Invariants:

* **no de-duplication**: identical content cached twice stays twice under one key; an entry is a
  block, or ``{block_id: block}`` (insertion order) when several blocks hold the same content;
  lookups return the first-inserted block still present;
* an entry is never empty: the key goes when its last block does;
* the bulk methods (``longest_cached_prefix``, ``insert_blocks``, ``evict_blocks``) also keep each
  block's ``block_hash`` in step with the map (the reverse link), and are the pool's hot paths:
  one call per operation, one dict operation per block.

Imports nothing but ``sim.core.kv_cache_block``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, KeysView

from sim.core.kv_cache_block import BlockKey, KVCacheBlock

_Entry = KVCacheBlock | dict[int, KVCacheBlock]


class BlockHashToBlockMap:
    """key -> block, or ``{block_id: block}`` when several blocks hold the same content."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[BlockKey, _Entry] = {}

    # -- queries (no state change) ----------------------------------------------------------------
    def get_one_block(self, key: BlockKey) -> KVCacheBlock | None:
        """Query: the first-inserted block cached under ``key``, or None."""
        entry = self._cache.get(key)
        if entry is None or type(entry) is KVCacheBlock:
            return entry
        return next(iter(entry.values()))  # type: ignore[union-attr]

    def longest_cached_prefix(self, keys: Iterable[BlockKey]) -> list[KVCacheBlock]:
        """Query: the first-inserted block of each key, stopping at the first key not cached.

        With chained hashes nothing after a miss can be cached for the same prefix, so this is
        the full-attention hit search (vLLM ``FullAttentionManager.find_longest_cache_hit`` for one
        group); O(hits)."""
        get = self._cache.get
        blocks: list[KVCacheBlock] = []
        for key in keys:
            entry = get(key)
            if entry is None:
                break
            blocks.append(entry if type(entry) is KVCacheBlock else next(iter(entry.values())))  # type: ignore[union-attr]
        return blocks

    def block_ids(self, key: BlockKey) -> list[int]:
        """Query: all block ids cached under ``key``, first-inserted first."""
        entry = self._cache.get(key)
        if entry is None:
            return []
        if type(entry) is KVCacheBlock:
            return [entry.block_id]
        return list(entry)  # type: ignore[arg-type]

    def items(self) -> Iterator[tuple[BlockKey, list[KVCacheBlock]]]:
        """Query: ``(key, blocks)`` per key, blocks first-inserted first."""
        for key, entry in self._cache.items():
            yield key, ([entry] if type(entry) is KVCacheBlock else list(entry.values()))  # type: ignore[union-attr]

    def keys(self) -> KeysView[BlockKey]:
        """Query: a live set-like view of the cached keys (for bulk membership tests)."""
        return self._cache.keys()

    def __len__(self) -> int:
        return len(self._cache)

    # -- updates ----------------------------------------------------------------------------------
    def insert(self, key: BlockKey, block: KVCacheBlock) -> None:
        """Add ``block`` under ``key`` after any block already there (no de-duplication)."""
        entry = self._cache.setdefault(key, block)
        if entry is not block:
            self._add_duplicate(key, entry, block)

    def insert_blocks(self, blocks: Iterable[KVCacheBlock], keys: Iterable[BlockKey]) -> None:
        """Cache each block under its key: set ``block.block_hash`` and :meth:`insert` it."""
        setdefault = self._cache.setdefault
        for block, key in zip(blocks, keys):
            block.block_hash = key
            entry = setdefault(key, block)
            if entry is not block:
                self._add_duplicate(key, entry, block)

    def _add_duplicate(self, key: BlockKey, entry: _Entry, block: KVCacheBlock) -> None:
        """A second block with already-cached content: both stay (first-inserted is looked up)."""
        if type(entry) is KVCacheBlock:
            self._cache[key] = {entry.block_id: entry, block.block_id: block}
        else:
            entry[block.block_id] = block  # type: ignore[index]

    def pop(self, key: BlockKey, block_id: int) -> KVCacheBlock | None:
        """Remove block ``block_id`` from under ``key`` (others stay); the block, or None."""
        entry = self._cache.pop(key, None)
        if entry is None:
            return None
        if type(entry) is KVCacheBlock:
            if entry.block_id == block_id:
                return entry
            self._cache[key] = entry
            return None
        block = entry.pop(block_id, None)  # type: ignore[union-attr]
        if entry:
            self._cache[key] = entry
        return block

    def evict_blocks(self, blocks: Iterable[KVCacheBlock]) -> int:
        """Drop the key of every cached block in ``blocks`` (blocks handed out again) and clear its
        ``block_hash``; returns how many were cached. Each must be in the map under its key."""
        cpop = self._cache.pop
        n = 0
        for block in blocks:
            key = block.block_hash
            if key is not None:
                entry = cpop(key)
                if entry is not block:  # several blocks hold this content: keep the others
                    assert type(entry) is dict, f"block {block.block_id} is cached but not under its key"
                    del entry[block.block_id]
                    if entry:
                        self._cache[key] = entry
                block.block_hash = None
                n += 1
        return n
