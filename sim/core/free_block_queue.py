"""The free block queue in eviction order (mirrors ``FreeKVCacheBlockQueue`` of vLLM 0.25.1's
``vllm/v1/core/kv_cache_utils.py``).

Invariants: the head is reused (and its hash evicted) first; every operation is O(1) per block;
a block is in the queue at most once. vLLM threads a doubly-linked list through the blocks; here
the list is an ``OrderedDict`` (CPython's C doubly-linked list), which gives the same operations
and order. Imports nothing but ``sim.core.kv_cache_block``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import repeat

from sim.core.kv_cache_block import KVCacheBlock


class FreeKVCacheBlockQueue:
    """The free list, head (next evicted) first. Every method but the queries changes state."""

    __slots__ = ("_q",)

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._q: OrderedDict[KVCacheBlock, None] = OrderedDict.fromkeys(blocks)

    @property
    def num_free_blocks(self) -> int:
        """Query: the queue length."""
        return len(self._q)

    def popleft(self) -> KVCacheBlock:
        """Unlink and return the head."""
        if not self._q:
            raise ValueError("No free blocks available")
        return self._q.popitem(last=False)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Unlink and return the ``n`` head blocks, head first (one C-level pop each)."""
        if n > len(self._q):
            raise ValueError(f"Cannot get {n} free blocks from the pool")
        return [b for b, _ in map(self._q.popitem, repeat(False, n))]

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` wherever it is (a touched hit)."""
        del self._q[block]

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Link ``blocks`` at the tail, keeping their order."""
        self._q.update(zip(blocks, repeat(None)))

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link ``blocks`` at the head, keeping their order (``blocks[0]`` becomes the head)."""
        q = self._q
        move = q.move_to_end
        for b in reversed(blocks):
            q[b] = None
            move(b, last=False)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block in self._q

    def block_ids(self) -> list[int]:
        """Query: free block ids, head (next evicted) first."""
        return [b.block_id for b in self._q]
