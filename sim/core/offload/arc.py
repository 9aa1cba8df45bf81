"""The CPU tier's ARC policy (mirrors vLLM 0.33.0's ``ARCCachePolicy``,
``v1/kv_offload/cpu/policies/arc.py``).

T1 holds chunks seen once, T2 chunks reused; B1/B2 are ghost lists of keys evicted from T1/T2;
``target_t1`` is the adaptive target size of T1 (starts at 0, so scans are evicted from T1 first).

* ``insert``: MRU of T1, the key leaves B1/B2;
* ``on_store_miss`` (once per key per request, tail first): a key in B1 raises ``target_t1`` by
  ``max(1, |B2|/|B1|)`` (at most the capacity), one in B2 lowers it by ``max(1, |B1|/|B2|)`` (at
  least 0); the ghost key moves to its list's MRU end;
* ``on_request_finished`` (tail first): keys the request only inserted move to the MRU end of their
  list; keys it reused (loaded, or found ready when offered) go T1 -> T2's MRU or to T2's MRU end;
* ``evict(n)``: per victim, from T1 while ``|T1| (shrinking as victims are chosen) >=
  int(target_t1)``, else from T2, each falling back to the other; scans are monotonic (one iterator
  per list for the whole call); victims go to B1/B2, each ghost list then trimmed to the capacity
  from its LRU end.

Invariants: T1 and T2 are disjoint; B1, B2 are disjoint from T1 and T2 except transiently (vLLM
never removes a ghost on ``evict``); ``0 <= target_t1 <= capacity``. Imports nothing from the
project beyond this package.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from sim.core.offload.policy import CachePolicy, ChunkStatus, OffloadKey, ReqContext, order_request_keys


def _next_candidate(
    entries: Iterator[tuple[OffloadKey, ChunkStatus]], protected: set[OffloadKey]
) -> tuple[OffloadKey, ChunkStatus] | None:
    for key, chunk in entries:
        if chunk.ref_cnt == 0 and key not in protected:
            return key, chunk
    return None


class ARCCachePolicy(CachePolicy):
    """ARC (see the module docstring)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.target_t1_size: float = 0.0
        self.t1: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        chunk = self.t1.get(key)
        return chunk if chunk is not None else self.t2.get(key)

    def get_many(self, keys: Sequence[OffloadKey]) -> list[ChunkStatus | None]:
        t1, t2 = self.t1, self.t2
        return [t1.get(k) or t2.get(k) for k in keys]  # a ChunkStatus is always true

    def keys(self) -> Iterable[OffloadKey]:
        return [*self.t1, *self.t2]

    def none_resident(self, keys: Sequence[OffloadKey]) -> bool:
        return self.t1.keys().isdisjoint(keys) and self.t2.keys().isdisjoint(keys)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, ctx: ReqContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def insert_many(self, keys: Sequence[OffloadKey], chunks: Sequence[ChunkStatus], ctx: ReqContext) -> None:
        self.t1.update(zip(keys, chunks, strict=True))
        for ghost in (self.b1, self.b2):
            if ghost and not ghost.keys().isdisjoint(keys):
                for key in keys:
                    ghost.pop(key, None)

    def remove(self, key: OffloadKey) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _adapt_to_ghost_hit(self, key: OffloadKey) -> None:
        if key in self.b1:
            delta = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            delta = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            self.b2.move_to_end(key)

    def observes_store_misses(self) -> bool:
        return True

    def on_store_miss(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        if self.b1.keys().isdisjoint(keys) and self.b2.keys().isdisjoint(keys):
            return  # no ghost hit: nothing adapts
        for key in reversed(keys):  # vLLM ARCCachePolicy.on_store_miss: tail first
            self._adapt_to_ghost_hit(key)

    def on_request_finished(
        self, keys: Sequence[OffloadKey], insertion_only: set[OffloadKey], reused: set[OffloadKey], ctx: ReqContext
    ) -> None:
        for key in reversed(order_request_keys(keys, ctx)):
            if key in insertion_only:
                # a store is not a frequency hit: keep the list, restore tail-to-head recency
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
                continue
            if key in reused:
                if key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def evict_split(self, n: int, protected: set[OffloadKey]) -> tuple[list[OffloadKey], list[ChunkStatus]] | None:
        if n == 0:
            return [], []
        keys: list[OffloadKey] = []
        chunks: list[ChunkStatus] = []
        from_t1: list[bool] = []
        virtual_t1 = len(self.t1)
        target = int(self.target_t1_size)
        # one iterator per list for the whole call (vLLM keeps the scans monotonic): a chunk
        # skipped once (pinned, pending, protected) is not revisited in this call
        t1_iter = iter(self.t1.items())
        t2_iter = iter(self.t2.items())
        for _ in range(n):
            cand = None
            if virtual_t1 >= target:
                cand = _next_candidate(t1_iter, protected)
                if cand is not None:
                    virtual_t1 -= 1
                    from_t1.append(True)
            if cand is None:
                cand = _next_candidate(t2_iter, protected)
                if cand is not None:
                    from_t1.append(False)
            if cand is None:
                cand = _next_candidate(t1_iter, protected)
                if cand is None:
                    return None
                virtual_t1 -= 1
                from_t1.append(True)
            keys.append(cand[0])
            chunks.append(cand[1])
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        for key, src in zip(keys, from_t1, strict=True):
            if src:
                del t1[key]
                b1[key] = None
            else:
                del t2[key]
                b2[key] = None
        for ghost in (b1, b2):
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)
        return keys, chunks

    def check_integrity(self) -> None:
        """Query: assert T1/T2 disjoint and the target in range."""
        assert not (self.t1.keys() & self.t2.keys())
        assert 0 <= self.target_t1_size <= self.cache_capacity
        assert len(self.b1) <= self.cache_capacity and len(self.b2) <= self.cache_capacity
