"""The reference LRU policy: vLLM 0.33.0's ``LRUCachePolicy`` (``v1/kv_offload/cpu/policies/lru.py``)
as written there, with its lazy-invalidation min-heap. It is the oracle of ``sim.core.offload.lru``
(the rank-group structure the tier runs on; ``tests/test_offload_lru_equivalence.py`` drives both
with the same random calls and compares every eviction). Select it with policy ``"lru_reference"``.

Recency is a *rank* ``(major, minor)``, smallest evicted first:

* a request gets a rank ``r`` (``_next_rank += 1``) at its first store or load access; a chunk it
  inserts or first touches gets ``(r, -position)``, and a touch only ever raises a rank -- so while a
  request runs, its chunks sit at its first-access rank, older requests' chunks go first, and within
  one request the tail (larger position) goes before the head;
* when the request finishes, every key it saw gets a fresh rank ``(_next_rank += 1, 0)``, tail
  first and head last, so the head becomes the most recent.

Invariants: ``ranks`` and ``chunks`` have the same keys; ``evictable`` is the set of keys whose
chunk has ``ref_cnt == 0``; every evictable key has a heap entry equal to its current rank (stale
entries are skipped lazily, as vLLM's min-heap does). Eviction never takes a pending (ref_cnt -1),
pinned (> 0) or protected chunk. Cost: O(log n) per rank change, O(k log n) per eviction of k.
Imports nothing from the project beyond this package.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from sim.core.offload.policy import CachePolicy, ChunkStatus, OffloadKey, ReqContext, order_request_keys

Rank = tuple[int, int]
_HeapEntry = tuple[Rank, OffloadKey]


class HeapLRUCachePolicy(CachePolicy):
    """LRU over request-scoped ranks on a lazy min-heap (see the module docstring)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        self.ranks: dict[OffloadKey, Rank] = {}
        self.evictable: set[OffloadKey] = set()
        self._heap: list[_HeapEntry] = []
        self._next_rank = 0

    # -- ranks --------------------------------------------------------------------------------
    def _request_rank(self, ctx: ReqContext) -> int:
        """The request's rank, assigned at its first access (vLLM ``_get_request_rank``)."""
        if ctx.lru_rank == 0:
            self._next_rank += 1
            ctx.lru_rank = self._next_rank
        return ctx.lru_rank

    def _update_heap(self, updated: Sequence[OffloadKey]) -> None:
        if not updated:
            return
        # vLLM rebuilds for a long update and pushes otherwise; both leave one current entry per
        # evictable key, which is all eviction reads
        if len(updated) >= max(64, len(self.evictable) // 4):
            self._rebuild()
        else:
            for key in updated:
                heapq.heappush(self._heap, (self.ranks[key], key))
            self._maybe_compact()

    def _rebuild(self) -> None:
        self._heap = [(self.ranks[k], k) for k in self.evictable]
        heapq.heapify(self._heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) >= max(64, 2 * len(self.evictable)):
            self._rebuild()

    # -- CachePolicy --------------------------------------------------------------------------
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def keys(self) -> Iterable[OffloadKey]:
        return self.chunks.keys()

    def insert(self, key: OffloadKey, chunk: ChunkStatus, ctx: ReqContext) -> None:
        self.chunks[key] = chunk
        position = ctx.key_positions.get(key)
        if position is None:
            self._next_rank += 1
            self.ranks[key] = (self._next_rank, 0)
        else:
            self.ranks[key] = (self._request_rank(ctx), -position)
        if chunk.ref_cnt == 0:
            self.evictable.add(key)
            heapq.heappush(self._heap, (self.ranks[key], key))

    def remove(self, key: OffloadKey) -> None:
        del self.chunks[key]
        self.ranks.pop(key, None)
        self.evictable.discard(key)

    def on_request_access(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        # vLLM LRUCachePolicy.on_request_access: the request's rank is taken even when no key is
        # resident yet (its inserts then share it)
        request_rank = self._request_rank(ctx)
        updated: list[OffloadKey] = []
        for key in keys:
            position = ctx.key_positions.get(key)
            if position is None or key not in self.chunks:
                continue
            rank = (request_rank, -position)
            if self.ranks[key] >= rank:
                continue
            self.ranks[key] = rank
            if key in self.evictable:
                updated.append(key)
        self._update_heap(updated)

    def on_request_finished(
        self, keys: Sequence[OffloadKey], insertion_only: set[OffloadKey], reused: set[OffloadKey], ctx: ReqContext
    ) -> None:
        # fresh ranks tail first, head last (vLLM: touch(reversed(order_request_keys(...)))), so the
        # request's head chunk is the most recently used
        updated: list[OffloadKey] = []
        for key in reversed(order_request_keys(keys, ctx)):
            if key not in self.chunks:
                continue
            self._next_rank += 1
            self.ranks[key] = (self._next_rank, 0)
            if key in self.evictable:
                updated.append(key)
        self._update_heap(updated)

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        selected: list[_HeapEntry] = []
        selected_keys: set[OffloadKey] = set()
        deferred: list[_HeapEntry] = []
        heap = self._heap
        while heap and len(selected) < n:
            entry = heapq.heappop(heap)
            rank, key = entry
            if key not in self.evictable or self.ranks.get(key) != rank:
                continue  # stale entry
            if key in selected_keys:
                continue  # an equal duplicate entry (re-pinned without a rank change)
            if key in protected:
                deferred.append(entry)
                continue
            selected.append(entry)
            selected_keys.add(key)
        if len(selected) < n:  # atomic: put everything back
            for entry in selected:
                heapq.heappush(heap, entry)
            for entry in deferred:
                heapq.heappush(heap, entry)
            return None
        for entry in deferred:
            heapq.heappush(heap, entry)
        out: list[tuple[OffloadKey, ChunkStatus]] = []
        for _, key in selected:
            chunk = self.chunks.pop(key)
            assert chunk.ref_cnt == 0
            self.evictable.remove(key)
            del self.ranks[key]
            out.append((key, chunk))
        self._maybe_compact()
        return out

    def mark_evictable(self, key: OffloadKey) -> None:
        self.evictable.add(key)
        heapq.heappush(self._heap, (self.ranks[key], key))
        self._maybe_compact()

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self.evictable.remove(key)

    # -- queries ------------------------------------------------------------------------------
    def eviction_order(self) -> list[OffloadKey]:
        """Query: the evictable keys, next victim first (for tests)."""
        return sorted(self.evictable, key=lambda k: (self.ranks[k], k))

    def check_integrity(self) -> None:
        """Query: assert the module docstring's invariants."""
        assert self.ranks.keys() == self.chunks.keys()
        assert self.evictable == {k for k, c in self.chunks.items() if c.ref_cnt == 0}
        current = {k for r, k in self._heap if k in self.evictable and self.ranks[k] == r}
        assert current == self.evictable, "an evictable key lacks a current heap entry"
