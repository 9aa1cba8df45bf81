"""The free block queue in eviction order (mirrors ``FreeKVCacheBlockQueue`` of vLLM 0.25.1's
``vllm/v1/core/kv_cache_utils.py``), with its never-used blocks kept as a range, not as objects.

Invariants: the head is reused (and its hash evicted) first; every operation is O(1) per block;
a block is in the queue at most once. vLLM threads a doubly-linked list through the blocks; here
the list is an ``OrderedDict`` (CPython's C doubly-linked list), which gives the same operations
and order.

**Never-used blocks are a range.** vLLM's queue starts as every block in id order. A pop takes the
head, a free links at an end (at the tail, or, in this pool, unhashed blocks at the head:
``sim.core.block_pool``), and a removal from the middle (a prefix hit touching a free cached
block) only ever takes a block that was handed out before, since only those can be cached. So the
blocks never handed out stay one contiguous run of ids, in id order, in one place of the queue:
everything pushed at the head since sits before it, everything pushed at the tail after it. The
queue is therefore ``head`` (an ``OrderedDict``), then the ids ``next_virgin .. num_blocks - 1``
(two ints), then ``tail``; a pop that reaches the run makes each block object there (appended to
the pool's ``blocks`` list, so that list holds exactly the blocks ever handed out, ids ``0 ..
next_virgin - 1``) as it hands it out. Once the run is empty the two parts are one ``OrderedDict``
(``head is tail``): the run is reached only after ``head`` is empty, so nothing needs moving. A
replica that never fills its pool holds objects for the blocks it used, not for ``num_gpu_blocks``.

Imports nothing but ``sim.core.kv_cache_block``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import repeat

from sim.core.kv_cache_block import KVCacheBlock

_ABSENT = object()  # OrderedDict.pop's default: the values are all None


class FreeKVCacheBlockQueue:
    """The free list, head (next evicted) first. Every method but the queries changes state.

    ``blocks`` are free blocks in queue order; with ``num_blocks`` (a pool), they are the blocks
    ``0 .. len(blocks) - 1`` and the ids ``len(blocks) .. num_blocks - 1`` follow them, never used:
    their objects are made and appended to ``blocks`` (the same list) when first popped."""

    __slots__ = ("_head", "_tail", "_blocks", "_next_virgin", "_num_blocks")

    def __init__(self, blocks: list[KVCacheBlock], num_blocks: int | None = None) -> None:
        self._blocks = blocks
        self._next_virgin = len(blocks)
        self._num_blocks = len(blocks) if num_blocks is None else num_blocks
        if self._num_blocks < self._next_virgin:
            raise ValueError(f"num_blocks {num_blocks} is below the {len(blocks)} blocks given")
        self._head: OrderedDict[KVCacheBlock, None] = OrderedDict.fromkeys(blocks)
        # the run of never-used ids lies between head and tail; without one they are the same dict
        self._tail = OrderedDict[KVCacheBlock, None]() if self._num_blocks > self._next_virgin else self._head

    @property
    def num_free_blocks(self) -> int:
        """Query: the queue length."""
        head, tail = self._head, self._tail
        if head is tail:
            return len(head)
        return len(head) + self._num_blocks - self._next_virgin + len(tail)

    @property
    def next_virgin(self) -> int:
        """Query: the lowest never-used block id (``num_blocks`` once every block was handed out)."""
        return self._next_virgin

    def popleft(self) -> KVCacheBlock:
        """Unlink and return the head."""
        if not self.num_free_blocks:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Unlink and return the ``n`` head blocks, head first (one C-level pop each)."""
        head = self._head
        if n <= len(head):  # (always, once head and tail are one: n <= num_free_blocks)
            return [b for b, _ in map(head.popitem, repeat(False, n))]
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot get {n} free blocks from the pool")
        out = [b for b, _ in map(head.popitem, repeat(False, len(head)))]
        start = self._next_virgin
        stop = min(self._num_blocks, start + n - len(out))
        made = [KVCacheBlock(i) for i in range(start, stop)]
        self._blocks.extend(made)
        out.extend(made)
        self._next_virgin = stop
        if stop == self._num_blocks:
            self._head = self._tail  # the run is gone and head is empty: tail is the whole queue
            out.extend(b for b, _ in map(self._tail.popitem, repeat(False, n - len(out))))
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` wherever it is (a touched hit; never a never-used block)."""
        if self._head.pop(block, _ABSENT) is _ABSENT:
            del self._tail[block]

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Link ``blocks`` at the tail, keeping their order."""
        self._tail.update(zip(blocks, repeat(None)))

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link ``blocks`` at the head, keeping their order (``blocks[0]`` becomes the head)."""
        q = self._head
        move = q.move_to_end
        for b in reversed(blocks):
            q[b] = None
            move(b, last=False)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block in self._head or block in self._tail

    def block_ids(self) -> list[int]:
        """Query: free block ids, head (next evicted) first."""
        ids = [b.block_id for b in self._head]
        if self._tail is not self._head:
            ids.extend(range(self._next_virgin, self._num_blocks))
            ids.extend(b.block_id for b in self._tail)
        return ids

    def check_integrity(self) -> None:
        """Assert the run of never-used ids has no object and every object was handed out:
        ``blocks`` holds ids ``0 .. next_virgin - 1`` in order; head and tail share no block."""
        assert len(self._blocks) == self._next_virgin <= self._num_blocks, (
            len(self._blocks), self._next_virgin, self._num_blocks)
        assert all(b.block_id == i for i, b in enumerate(self._blocks)), "blocks out of id order"
        assert (self._head is self._tail) == (self._next_virgin == self._num_blocks), "run ended but parts apart"
        if self._head is not self._tail:
            assert not self._head.keys() & self._tail.keys(), "a block both before and after the run"
