"""The reference ARC policy: ``sim.core.offload.arc`` as it was before its batched calls (vLLM
0.33.0's ``ARCCachePolicy``, ``v1/kv_offload/cpu/policies/arc.py``, one call per key), the oracle
``tests/test_offload_lru_equivalence.py`` compares the tier's ARC against (through
``tests/offload_manager_reference.py``). A module of the package, not of the tests, so that it
compiles with the others (an interpreted class cannot subclass the compiled ``CachePolicy``)."""

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

    def keys(self) -> Iterable[OffloadKey]:
        return [*self.t1, *self.t2]

    def insert(self, key: OffloadKey, chunk: ChunkStatus, ctx: ReqContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

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

    def on_store_miss(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
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

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        candidates: list[tuple[OffloadKey, ChunkStatus, bool]] = []
        virtual_t1 = len(self.t1)
        # one iterator per list for the whole call (vLLM keeps the scans monotonic): a chunk
        # skipped once (pinned, pending, protected) is not revisited in this call
        t1_iter = iter(self.t1.items())
        t2_iter = iter(self.t2.items())
        for _ in range(n):
            cand: tuple[OffloadKey, ChunkStatus, bool] | None = None
            if virtual_t1 >= int(self.target_t1_size):
                e = _next_candidate(t1_iter, protected)
                if e is not None:
                    cand = (e[0], e[1], True)
                    virtual_t1 -= 1
            if cand is None:
                e = _next_candidate(t2_iter, protected)
                if e is not None:
                    cand = (e[0], e[1], False)
            if cand is None:
                e = _next_candidate(t1_iter, protected)
                if e is None:
                    return None
                cand = (e[0], e[1], True)
                virtual_t1 -= 1
            candidates.append(cand)
        out: list[tuple[OffloadKey, ChunkStatus]] = []
        for key, chunk, from_t1 in candidates:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            out.append((key, chunk))
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)
        return out

    def check_integrity(self) -> None:
        """Query: assert T1/T2 disjoint and the target in range."""
        assert not (self.t1.keys() & self.t2.keys())
        assert 0 <= self.target_t1_size <= self.cache_capacity
        assert len(self.b1) <= self.cache_capacity and len(self.b2) <= self.cache_capacity
