"""Router-side indexes of which replica holds which prefix block.

* :class:`KVEventIndex` -- fed by KV events (mirrors the KV-block index of llm-d-kv-cache-manager
  ``pkg/kvcache/kvblock`` and Dynamo's ``KvIndexer`` radix tree, ``lib/kv-router/src/indexer``):
  ``BlockStored`` adds the replica to each hash, ``BlockRemoved`` takes it off, ``AllBlocksCleared``
  and a replica going down drop all of the replica's entries. Set semantics, as both products
  have: a removal of one copy of a duplicated block removes the entry although the engine may
  still hold the other copy (a false negative a real router has too).
* :class:`LRUPrefixIndex` -- written at routing time (mirrors the approximate indexer of
  ``gateway-api-inference-extension`` ``pkg/epp/scheduling/framework/plugins/multi/prefix/indexer.go``
  and llm-d ``pkg/plugins/scorer/approximate_indexer.go``): per replica an LRU of at most
  ``capacity`` hashes; an evicted hash leaves the forward map.

Both answer :meth:`match`: per replica, the number of leading hashes of a request it holds,
counted contiguously from block 0 (a replica missing block i holds no prefix past it). Hashes are
chained, so a map from hash to replicas is the radix tree: one hash names its whole prefix.

Cost: O(blocks matched + replicas) per match, O(1) per event hash. :func:`make_kv_event_index`
gives a compiled twin of :class:`KVEventIndex` (``sim.cluster.compiled_index``: same answers, its
state in C) where it is built -- sharded by 64 replicas above that (:class:`ShardedKVEventIndex`) --
else this one. Imports nothing but
stdlib (and that optional extension).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

_Compiled: Callable[[int], EventIndex] | None
try:
    from sim.cluster.compiled_index import CompiledKVEventIndex as _Compiled
except ImportError:  # pragma: no cover - not built (no C compiler): the Python index, same answers
    _Compiled = None


def _match(forward: dict[int, int], hashes: Sequence[int], candidates: int) -> dict[int, int]:
    """Per replica (bit) in ``candidates``: leading hashes held, for those holding at least one."""
    out: dict[int, int] = {}
    active = candidates
    get = forward.get
    for i, h in enumerate(hashes):
        held = active & get(h, 0)
        dropped = active & ~held
        if dropped and i:
            _bits_to(out, dropped, i)
        active = held
        if not active:
            return out
    _bits_to(out, active, len(hashes))
    return out


def _bits_to(out: dict[int, int], mask: int, value: int) -> None:
    while mask:
        low = mask & -mask
        out[low.bit_length() - 1] = value
        mask ^= low


def mask_of(replicas: Iterable[int]) -> int:
    m = 0
    for r in replicas:
        m |= 1 << r
    return m


class EventIndex(Protocol):
    """What the routers' cache views use of a KV-event index (Python or compiled)."""

    def store(self, replica: int, hashes: Iterable[int]) -> None:
        """Changes state: ``BlockStored`` (hashes: vLLM's unsigned 64-bit event form)."""

    def remove(self, replica: int, hashes: Iterable[int]) -> None:
        """Changes state: ``BlockRemoved``."""

    def clear(self, replica: int) -> None:
        """Changes state: ``AllBlocksCleared`` or the replica left the pool."""

    def match(self, hashes: Sequence[int], candidates: Iterable[int]) -> dict[int, int]:
        """Query: leading hashes held per candidate replica (only those holding block 0), in
        the order their runs end, lowest replica first within one block."""

    def num_entries(self, replica: int) -> int:
        """Query: how many hashes ``replica`` holds."""


def make_kv_event_index(num_replicas: int, *, compiled: bool = True) -> EventIndex:
    """The compiled index when ``compiled`` and built -- one table for up to 64 replicas (one bit
    each), a :class:`ShardedKVEventIndex` of such tables above -- else :class:`KVEventIndex`; all
    give the same answers (property tests drive them side by side)."""
    if compiled and _Compiled is not None:
        return _Compiled(num_replicas) if num_replicas <= _SHARD else ShardedKVEventIndex(num_replicas, _Compiled)
    return KVEventIndex(num_replicas)


_SHARD = 64  # replicas per compiled table (one bit each in a 64-bit mask)


class ShardedKVEventIndex:
    """A fleet of more than 64 replicas on compiled tables of 64 each: replica ``r`` is replica
    ``r % 64`` of table ``r // 64``. A replica's leading-hash count does not depend on the others,
    so a match is each table's match of its candidates, merged in the order the single index gives
    (the run's length, then the replica). Python's index made a 256-bit int per stored hash."""

    def __init__(self, num_replicas: int, table: Callable[[int], EventIndex]) -> None:
        self.num_replicas = num_replicas
        self.shards = [table(min(_SHARD, num_replicas - lo)) for lo in range(0, num_replicas, _SHARD)]

    def _at(self, replica: int) -> tuple[Any, int]:
        """The table of ``replica`` and its number there (IndexError outside the fleet)."""
        if replica < 0 or replica >= self.num_replicas:
            raise IndexError(f"replica {replica} out of range 0..{self.num_replicas - 1}")
        return self.shards[replica // _SHARD], replica % _SHARD

    def store(self, replica: int, hashes: Iterable[int]) -> None:
        shard, r = self._at(replica)
        shard.store(r, hashes)

    def remove(self, replica: int, hashes: Iterable[int]) -> None:
        shard, r = self._at(replica)
        shard.remove(r, hashes)

    def apply(self, replica: int, events: list[object], start: int, stored_type: type, removed_type: type,
              gpu_medium: str) -> int:
        """The table's ``CompiledKVEventIndex.apply`` for ``replica`` (see ``sim.cluster.kv_view``)."""
        shard, r = self._at(replica)
        return int(shard.apply(r, events, start, stored_type, removed_type, gpu_medium))

    def apply_raw(self, replica: int, words: Any) -> None:
        """The table's ``CompiledKVEventIndex.apply_raw`` for ``replica`` (a raw batch's words)."""
        shard, r = self._at(replica)
        shard.apply_raw(r, words)

    def clear(self, replica: int) -> None:
        shard, r = self._at(replica)
        shard.clear(r)

    def match(self, hashes: Sequence[int], candidates: Iterable[int]) -> dict[int, int]:
        by_shard: dict[int, list[int]] = {}
        for replica in candidates:
            self._at(replica)
            by_shard.setdefault(replica // _SHARD, []).append(replica % _SHARD)
        # (a list or an array('Q') is read by every shard as it is: the compiled match reads an array in place)
        hs = hashes if type(hashes) is list or type(hashes) is array else list(hashes)
        found: list[tuple[int, int]] = []
        for k, members in by_shard.items():
            lo = k * _SHARD
            found.extend((n, lo + r) for r, n in self.shards[k].match(hs, members).items())
        found.sort()
        return {r: n for n, r in found}

    def num_entries(self, replica: int) -> int:
        shard, r = self._at(replica)
        return int(shard.num_entries(r))


class KVEventIndex:
    """Hash -> replicas holding it, from KV events (see the module docstring); the oracle of
    the compiled one."""

    def __init__(self, num_replicas: int) -> None:
        self.forward: dict[int, int] = {}  # hash -> bitmask of replicas
        self.held: list[set[int]] = [set() for _ in range(num_replicas)]

    def store(self, replica: int, hashes: Iterable[int]) -> None:
        """Changes state: ``BlockStored``."""
        bit = 1 << replica
        fwd = self.forward
        held = self.held[replica]
        for h in hashes:
            fwd[h] = fwd.get(h, 0) | bit
            held.add(h)

    def remove(self, replica: int, hashes: Iterable[int]) -> None:
        """Changes state: ``BlockRemoved``."""
        keep = ~(1 << replica)
        fwd = self.forward
        held = self.held[replica]
        for h in hashes:
            if h in held:
                held.remove(h)
                m = fwd[h] & keep
                if m:
                    fwd[h] = m
                else:
                    del fwd[h]

    def clear(self, replica: int) -> None:
        """Changes state: ``AllBlocksCleared`` or the replica left the pool."""
        self.remove(replica, list(self.held[replica]))

    def match(self, hashes: Sequence[int], candidates: Iterable[int]) -> dict[int, int]:
        """Query: leading hashes held per candidate replica (only those holding block 0)."""
        return _match(self.forward, hashes, mask_of(candidates))

    def num_entries(self, replica: int) -> int:
        return len(self.held[replica])


class LRUPrefixIndex:
    """Per-replica LRU of routed prefix hashes (see the module docstring)."""

    def __init__(self, num_replicas: int, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"LRU capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.forward: dict[int, int] = {}
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]

    def add(self, replica: int, hashes: Iterable[int]) -> None:
        """Changes state: record that ``replica`` will hold ``hashes`` (most recent last)."""
        bit = 1 << replica
        lru = self.lru[replica]
        fwd = self.forward
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                fwd[h] = fwd.get(h, 0) | bit
                if len(lru) > self.capacity:
                    old, _ = lru.popitem(last=False)
                    self._drop(old, bit)

    def _drop(self, h: int, bit: int) -> None:
        m = self.forward[h] & ~bit
        if m:
            self.forward[h] = m
        else:
            del self.forward[h]

    def clear(self, replica: int) -> None:
        """Changes state: the replica left the pool (``RemovePod``)."""
        bit = 1 << replica
        for h in self.lru[replica]:
            self._drop(h, bit)
        self.lru[replica].clear()

    def match(self, hashes: Sequence[int], candidates: Iterable[int]) -> dict[int, int]:
        """Query: leading hashes recorded per candidate replica."""
        return _match(self.forward, hashes, mask_of(candidates))
