"""The pieces every CPU cache policy shares (mirrors vLLM 0.33.0's ``v1/kv_offload/cpu/policies/
base.py``: ``ChunkStatus``, ``CachePolicy``, ``order_request_keys``; and ``ReqContext`` of
``v1/kv_offload/base.py``).

Invariants:

* a chunk's ``ref_cnt`` is -1 while its store is in flight (not readable, not evictable), 0 when
  ready and evictable, > 0 while loads pin it;
* a key is an offload key (``bytes``: the block hash of the chunk's last GPU block; one KV group,
  so vLLM's 4-byte group suffix is left out -- it is the same for every key);
* ``ReqContext.key_positions[key]`` is the end token of the key's chunk in that request
  (``RequestOffloadState.update_offload_keys``); policies order a request's keys by it.

Imports nothing from the project beyond this package.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

OffloadKey = bytes


class RankGroup:
    """The LRU policy's rank group (``sim.core.offload.lru``): the chunks whose rank has major
    ``gid``. ``keys`` holds its evictable ones in rank order -- ascending minor, or descending when
    ``not asc`` -- while ``ordered``; ``bound`` is the extreme minor appended since; ``population``
    counts its resident chunks (evictable or not), ``top`` bounds their minors from above;
    ``finished``: a finish batch's group."""

    __slots__ = ("gid", "keys", "asc", "bound", "ordered", "population", "top", "finished")

    def __init__(self, gid: int, asc: bool, finished: bool = False) -> None:
        self.gid = gid
        self.keys: dict[OffloadKey, None] = {}
        self.asc = asc
        self.bound = 0
        self.ordered = True
        self.population = 0
        self.top = -(1 << 62)
        self.finished = finished


class ChunkStatus:
    """One CPU chunk slot: ``chunk_id`` (its buffer index) and ``ref_cnt`` (-1: being written);
    the LRU policy also keeps the chunk's rank on it: ``group`` (its major) and ``minor``."""

    __slots__ = ("chunk_id", "ref_cnt", "group", "minor")

    def __init__(self, chunk_id: int) -> None:
        self.chunk_id = chunk_id
        self.ref_cnt = -1  # not ready until complete_store
        self.group: RankGroup | None = None
        self.minor = 0

    @property
    def is_ready(self) -> bool:
        """Query: the store completed, so the chunk can be read."""
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"ChunkStatus({self.chunk_id}, ref_cnt={self.ref_cnt})"


class ReqContext:
    """Per-request scratch the manager and policy keep (vLLM's ``ReqContext`` state slots): the
    LRU policy's request rank (0: none yet), the manager's access record, the keys' positions."""

    __slots__ = ("req_id", "lru_rank", "access", "key_positions")

    def __init__(self, req_id: str) -> None:
        self.req_id = req_id
        self.lru_rank = 0
        self.access: object | None = None  # the manager's RequestCacheAccess
        self.key_positions: dict[OffloadKey, int] = {}


def order_request_keys(keys: Sequence[OffloadKey], ctx: ReqContext) -> list[OffloadKey]:
    """Pure: ``keys`` head to tail by their position in the request (vLLM ``order_request_keys``),
    unchanged when some key has no position."""
    out = list(keys)
    pos = ctx.key_positions
    if all(k in pos for k in out):
        out.sort(key=pos.__getitem__)
    return out


class CachePolicy(ABC):
    """Chunk organisation and eviction choice of the CPU tier (vLLM ``CachePolicy``). Every method
    changes state unless it says "Query"."""

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity

    @abstractmethod
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        """Query: the resident chunk of ``key`` (ready or not), or None."""

    def get_many(self, keys: Sequence[OffloadKey]) -> list[ChunkStatus | None]:
        """Query: ``get`` of each key, in order."""
        return [self.get(k) for k in keys]

    @abstractmethod
    def insert(self, key: OffloadKey, chunk: ChunkStatus, ctx: ReqContext) -> None:
        """A newly allocated (not ready) chunk stored by ``ctx``'s request."""

    def insert_many(self, keys: Sequence[OffloadKey], chunks: Sequence[ChunkStatus], ctx: ReqContext) -> None:
        """``insert`` of each key with its chunk, in order."""
        for key, chunk in zip(keys, chunks, strict=True):
            self.insert(key, chunk, ctx)

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Drop a chunk (a failed store)."""

    def observes_store_misses(self) -> bool:
        """Query: whether ``on_store_miss`` does anything (else the manager need not track them)."""
        return False

    def observes_finish_sets(self) -> bool:
        """Query: whether ``on_request_finished`` reads its ``insertion_only`` and ``reused`` sets
        (else the manager passes them empty and need not keep them)."""
        return True

    def none_resident(self, keys: Sequence[OffloadKey]) -> bool:
        """Query: no key of ``keys`` is resident."""
        return all(c is None for c in self.get_many(keys))

    def on_store_miss(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """Keys about to be stored, observed once per request before insertion (ARC adapts)."""
        return

    def on_request_access(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """Keys first seen by ``ctx``'s request (stored, loaded or ready residents offered again)."""
        return

    @abstractmethod
    def on_request_finished(
        self, keys: Sequence[OffloadKey], insertion_only: set[OffloadKey], reused: set[OffloadKey], ctx: ReqContext
    ) -> None:
        """Commit one finished request's accesses; ``keys`` head to tail."""

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """Exactly ``n`` evictable chunks not in ``protected``, removed -- or None and nothing changed
        (a policy defines this or ``evict_split``, each defaults to the other)."""
        out = self.evict_split(n, protected)
        return None if out is None else list(zip(out[0], out[1], strict=True))

    def evict_split(self, n: int, protected: set[OffloadKey]) -> tuple[list[OffloadKey], list[ChunkStatus]] | None:
        """``evict`` as two lists: the victims' keys and their chunks, in eviction order."""
        out = self.evict(n, protected)
        if out is None:
            return None
        return [k for k, _ in out], [c for _, c in out]

    def mark_evictable(self, key: OffloadKey) -> None:
        """``key``'s ref_cnt became 0."""
        return

    def mark_evictable_many(self, keys: Sequence[OffloadKey], chunks: Sequence[ChunkStatus]) -> None:
        """``mark_evictable`` of each key (its chunk beside it), in order."""
        for key in keys:
            self.mark_evictable(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        """``key``'s ref_cnt left 0."""
        return

    @abstractmethod
    def keys(self) -> Iterable[OffloadKey]:
        """Query: every resident key (for integrity checks)."""
