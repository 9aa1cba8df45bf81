"""The CPU tier's bookkeeping (mirrors vLLM 0.33.0's ``CPUOffloadingManager``,
``v1/kv_offload/cpu/manager.py``): a pool of ``num_chunks`` chunk slots, ref counts, the request
access record that policies commit at finish, and the ``store_threshold`` access tracker.

* ``lookup``: MISS / HIT (ready) / HIT_PENDING (resident, store in flight); changes nothing;
* ``prepare_store(keys)``: ready residents are *reuses*, pending residents are ignored, absent keys
  are stored (after the ``store_threshold`` filter); it needs ``#to_store - free`` victims: more than
  the evictable chunks, or a policy that cannot find them -> **None, nothing allocated** (the
  connector counts an allocation failure and re-offers next step). New chunks are inserted not
  ready (ref_cnt -1): they occupy capacity and already look up as HIT_PENDING;
* ``complete_store``: ready and evictable; ``prepare_load``: pins (ref_cnt + 1) ready chunks and
  records them as reused; ``complete_load``: unpins;
* ``on_request_finished``: hands the request's keys (head to tail), the ones it only inserted and
  the ones it reused to the policy, once.

Invariants (``check_integrity``): free slots + resident chunks = allocated slots <= ``num_chunks``;
``num_evictable`` counts resident chunks with ref_cnt 0, ``num_write_pending`` those with -1; chunk
ids are unique. Fresh slots are handed out before freed ones, and freed ones last-freed first
(``_allocate_chunks``: ``_free_list.pop()``). Imports nothing from the project beyond this package.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.core.offload.arc import ARCCachePolicy
from sim.core.offload.lru import LRUCachePolicy
from sim.core.offload.lru_reference import HeapLRUCachePolicy
from sim.core.offload.policy import CachePolicy, ChunkStatus, OffloadKey, ReqContext

MAX_TRACKER_SIZE = 64_000
"""vLLM's ``max_tracker_size``: keys the ``store_threshold`` tracker remembers (LRU)."""


class LookupResult(enum.Enum):
    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()


@dataclass(slots=True)
class RequestCacheAccess:
    """Keys one request observed, in prefix order (vLLM ``_RequestCacheAccess``)."""

    keys: list[OffloadKey] = field(default_factory=list)
    seen: set[OffloadKey] = field(default_factory=set)
    inserted: set[OffloadKey] = field(default_factory=set)
    reused: set[OffloadKey] = field(default_factory=set)
    store_misses: set[OffloadKey] = field(default_factory=set)
    finished: bool = False


@dataclass(slots=True)
class PrepareStoreOutput:
    """What ``prepare_store`` decided: the keys to copy (in offer order) and the keys it evicted;
    ``chunks``: the chunks allocated for ``keys_to_store``, beside them (for ``complete_store``):
    ``ChunkStatus`` records here, an ``array('i')`` of chunk ids in the compiled tier (``chunk_table.pyx``)."""

    keys_to_store: list[OffloadKey]
    evicted_keys: list[OffloadKey]
    chunks: Sequence[Any] = field(default_factory=list)


@dataclass(slots=True)
class ManagerStats:
    """Cumulative CPU-tier counters (vLLM's ``CPUOffloadingMetrics`` and allocation histogram)."""

    chunks_stored: int = 0  # chunks allocated by prepare_store
    chunks_evicted: int = 0
    chunks_loaded: int = 0  # chunks pinned by prepare_load
    stores_skipped: int = 0  # store_threshold filter
    allocations: int = 0  # prepare_store calls that allocated (vLLM cpu_allocation_size samples)


def make_policy(name: str, capacity: int) -> CachePolicy:
    """The policy named ``name`` ("lru" or "arc", vLLM ``CachePolicyFactory``)."""
    if name == "lru":
        return LRUCachePolicy(capacity)
    if name == "arc":
        return ARCCachePolicy(capacity)
    if name == "lru_reference":  # vLLM's heap as written: the oracle of "lru" (tests)
        return HeapLRUCachePolicy(capacity)
    raise ValueError(f"unknown offload eviction policy {name!r} (expected 'lru' or 'arc')")


class CPUOffloadingManager:
    """The CPU tier (see the module docstring). Every method changes state unless it says Query."""

    def __init__(self, num_chunks: int, policy: str = "lru", store_threshold: int = 0) -> None:
        if num_chunks < 1:
            raise ValueError(f"the CPU tier needs at least one chunk, got {num_chunks}")
        self.num_chunks = num_chunks
        self.policy: CachePolicy = make_policy(policy, num_chunks)
        self.num_allocated = 0  # slots ever handed out (fresh ones are 0 .. num_allocated - 1)
        self.free_list: list[ChunkStatus] = []  # freed chunk records, reused last-freed first
        self.num_evictable = 0
        self.num_write_pending = 0
        self.store_threshold = store_threshold
        # vLLM: the tracker exists only for a threshold of 2 or more (1 would admit every key)
        self.counts: OrderedDict[OffloadKey, int] | None = OrderedDict() if store_threshold >= 2 else None
        self.stats = ManagerStats()
        # vLLM ``events`` (enable_events): raw (removed, keys) events for the KV-event tracker
        # (sim.core.offload.events); None while the engine's KV events are off
        self.events: list[tuple[bool, list[OffloadKey]]] | None = None
        self._tracks_misses = self.policy.observes_store_misses()  # LRU: on_store_miss does nothing
        # LRU's finish reads the keys alone: the inserted/reused sets need not be kept
        self._finish_sets = self.policy.observes_finish_sets()

    # -- helpers ------------------------------------------------------------------------------
    def num_free_chunks(self) -> int:
        """Query: never-used plus freed slots."""
        return len(self.free_list) + self.num_chunks - self.num_allocated

    def _allocate_chunks(self, n: int) -> list[ChunkStatus]:
        num_fresh = min(n, self.num_chunks - self.num_allocated)
        chunks = [ChunkStatus(self.num_allocated + i) for i in range(num_fresh)]
        self.num_allocated += num_fresh
        if n > num_fresh:  # freed slots, last freed first (vLLM ``_free_list.pop()``)
            free = self.free_list
            reused = free[len(free) - (n - num_fresh) :]
            del free[len(free) - (n - num_fresh) :]
            reused.reverse()
            for chunk in reused:
                chunk.ref_cnt = -1
                chunk.group = None
            chunks.extend(reused)
        return chunks

    def _record_accesses(self, keys: Sequence[OffloadKey]) -> None:
        """The threshold tracker sees one offer without evicting the offer's own tracked keys
        (vLLM ``_record_accesses``)."""
        counts = self.counts
        assert counts is not None
        protected: set[OffloadKey] = set()
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
                protected.add(key)
        num_unprotected = len(counts) - len(protected)
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= MAX_TRACKER_SIZE:
                if num_unprotected == 0:
                    continue
                counts.popitem(last=False)
                num_unprotected -= 1
            counts[key] = 1

    @staticmethod
    def _access(ctx: ReqContext) -> RequestCacheAccess:
        if ctx.access is None:
            ctx.access = RequestCacheAccess()
        assert isinstance(ctx.access, RequestCacheAccess)
        return ctx.access

    def _record_request_access(
        self,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        reused: Sequence[OffloadKey] = (),
        resident: Sequence[OffloadKey] | None = None,
    ) -> None:
        """Note keys the request observed (first time only, prefix order) and tell the policy
        (vLLM ``_record_request_cache_access``). ``resident``: the only keys of ``keys`` the tier
        holds (None: any); the policy is told the new ones among them -- the same for both
        policies, which act on resident keys only (LRU) or not at all (ARC)."""
        state = self._access(ctx)
        seen = state.seen
        new_keys = [k for k in keys if k not in seen]
        if new_keys:
            assert not state.finished, "new cache keys observed after request finalization"
            num_seen = len(seen)
            seen.update(new_keys)
            if len(seen) - num_seen < len(new_keys):  # a key repeated in the offer: first one only
                new_keys = list(dict.fromkeys(new_keys))
            state.keys.extend(new_keys)
            if resident is not None:
                held = set(resident)
                new_keys = [k for k in new_keys if k in held] if held else []
            self.policy.on_request_access(new_keys, ctx)
        if reused and self._finish_sets:
            # re-reading a chunk this request inserted is not a second access
            inserted = state.inserted
            state.reused.update(k for k in reused if k not in inserted)

    # -- the manager interface ----------------------------------------------------------------
    def lookup(self, key: OffloadKey) -> LookupResult:
        """Query: whether ``key`` is resident and readable."""
        chunk = self.policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    def needs_positions(self) -> bool:
        """Query: yes -- the policies read a key's position from ``ReqContext.key_positions``."""
        return True

    def lookup_run(self, keys: list[OffloadKey], start: int, stop: int, stop_at_pending: bool) -> tuple[int, bool]:
        """Query: ``(count, pending)``: the resident keys from ``keys[start]`` on, up to ``stop``,
        before the first absent one, and whether one of them is pending (with ``stop_at_pending``
        the count stops at the first pending one)."""
        count = 0
        pending = False
        get = self.policy.get
        for key in keys[start:stop]:
            chunk = get(key)
            if chunk is None:
                break
            count += 1
            if chunk.ref_cnt < 0:
                pending = True
                if stop_at_pending:
                    break
        return count, pending

    def first_pending(self, keys: list[OffloadKey]) -> int:
        """Query: the index of the first key of ``keys`` whose chunk is being stored, or -1."""
        get = self.policy.get
        for i, key in enumerate(keys):
            chunk = get(key)
            if chunk is not None and chunk.ref_cnt < 0:
                return i
        return -1

    def prepare_load(self, keys: Sequence[OffloadKey], ctx: ReqContext, first: int = -1) -> None:
        """Pin ready chunks for a load (they must all be resident and ready); ``first``: the index
        of ``keys[0]`` in the request's keys (read by the compiled tier only)."""
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None and chunk.is_ready, f"chunk {key!r} is not loadable"
            if chunk.ref_cnt == 0:
                self.policy.mark_non_evictable(key)
                self.num_evictable -= 1
            chunk.ref_cnt += 1
        self.stats.chunks_loaded += len(keys)
        self._record_request_access(keys, ctx, reused=keys)

    def complete_load(self, keys: Collection[OffloadKey]) -> None:
        """Unpin the chunks of a finished load."""
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None and chunk.ref_cnt > 0, f"chunk {key!r} was not being loaded"
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.num_evictable += 1
                self.policy.mark_evictable(key)

    def _fresh_offer(self, keys: Sequence[OffloadKey], state: RequestCacheAccess) -> bool:
        """Whether ``keys`` are all absent from the tier, unseen by the request and distinct -- then
        recorded as seen (the usual offer: a prefill's new chunks). ``_record_request_access`` of
        such an offer extends the request's keys and tells the policy of no resident key: the same
        as here, with one set pass instead of a lookup per key. False changes nothing."""
        seen = state.seen
        if state.finished or not self.policy.none_resident(keys) or not seen.isdisjoint(keys):
            return False
        num_seen = len(seen)
        seen.update(keys)
        if len(seen) - num_seen < len(keys):  # a key repeated in the offer: the general path
            seen.difference_update(keys)
            return False
        state.keys.extend(keys)
        return True

    def prepare_store(self, keys: Sequence[OffloadKey], ctx: ReqContext, first: int = -1) -> PrepareStoreOutput | None:
        """Allocate chunks for the absent keys of an offer (see the module docstring); None when
        they cannot all be allocated (then no chunk was allocated or evicted). ``first``: as in
        ``prepare_load``."""
        if self.counts is None and keys:
            state = self._access(ctx)
            if self._fresh_offer(keys, state):
                key_list = keys if isinstance(keys, list) else list(keys)
                if self._tracks_misses:  # (unseen keys were never store misses of this request)
                    self.policy.on_store_miss(key_list, ctx)
                    state.store_misses.update(key_list)
                self.policy.on_request_access([], ctx)  # (LRU: the request's rank is taken)
                return self._store(key_list, [], state, ctx)
        if self.counts is not None:
            self._record_accesses(keys)
        found = self.policy.get_many(keys)
        to_store = [k for k, c in zip(keys, found) if c is None]
        ready_existing = [k for k, c in zip(keys, found) if c is not None and c.ref_cnt >= 0]
        if self.counts is not None:
            n = len(to_store)
            counts, threshold = self.counts, self.store_threshold
            to_store = [k for k in to_store if counts.get(k, 0) >= threshold]
            self.stats.stores_skipped += n - len(to_store)
        state = self._access(ctx)
        store_misses = state.store_misses
        misses = [k for k in to_store if k not in store_misses] if self._tracks_misses else []
        if misses:
            # ARC learns from B1/B2 before insert() drops the ghost; once per key per request
            self.policy.on_store_miss(misses, ctx)
            store_misses.update(misses)
        # recorded before any early return; candidates count as insertions only once allocated
        if len(to_store) + len(ready_existing) == len(keys):
            recorded_keys = keys  # every key is recorded (no pending resident, none filtered)
        else:
            recorded = set(to_store)
            recorded.update(ready_existing)
            recorded_keys = [k for k in keys if k in recorded]
        self._record_request_access(recorded_keys, ctx, reused=ready_existing, resident=ready_existing)
        if not to_store:
            return PrepareStoreOutput([], [])
        return self._store(to_store, ready_existing, state, ctx)

    def _store(
        self, to_store: list[OffloadKey], ready_existing: list[OffloadKey], state: RequestCacheAccess, ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        """``prepare_store``'s allocation of ``to_store`` (not empty), evicting as needed."""
        num_to_evict = len(to_store) - self.num_free_chunks()
        evicted_keys: list[OffloadKey] = []
        if num_to_evict > 0:
            if num_to_evict > self.num_evictable:
                return None
            # the offer's own keys are never victims: a chunk already stored stays (of them, only
            # the ready residents can be evictable at all, so they are the whole protected set)
            evicted = self.policy.evict_split(num_to_evict, set(ready_existing))
            if evicted is None:
                return None
            evicted_keys, freed = evicted
            self.num_evictable -= len(freed)
            self.free_list.extend(freed)
            self.stats.chunks_evicted += len(freed)
            if self.events is not None:  # before the new chunks are inserted, as vLLM appends it
                self.events.append((True, evicted_keys))
        chunks = self._allocate_chunks(len(to_store))
        self.policy.insert_many(to_store, chunks, ctx)
        self.num_write_pending += len(to_store)
        if self._finish_sets:
            state.inserted.update(to_store)
        self.stats.chunks_stored += len(to_store)
        self.stats.allocations += 1
        return PrepareStoreOutput(to_store, evicted_keys, chunks)

    def complete_store(self, keys: Collection[OffloadKey], chunks: Sequence[ChunkStatus] | None = None) -> None:
        """Make the chunks of a finished store ready and evictable; ``chunks``: the store's
        ``PrepareStoreOutput.chunks`` (its keys' chunks, still pending: no lookup needed)."""
        key_list = keys if isinstance(keys, list) else list(keys)
        if chunks and len(chunks) == len(key_list) and all(c.ref_cnt < 0 for c in chunks):
            for c in chunks:
                c.ref_cnt = 0
            self.num_write_pending -= len(chunks)
            self.num_evictable += len(chunks)
            self.policy.mark_evictable_many(key_list, chunks)
            if self.events is not None:
                self.events.append((False, key_list))
            return
        ready: list[OffloadKey] = []
        ready_chunks: list[ChunkStatus] = []
        for key, chunk in zip(key_list, self.policy.get_many(key_list)):
            if chunk is not None and chunk.ref_cnt < 0:
                chunk.ref_cnt = 0
                ready.append(key)
                ready_chunks.append(chunk)
        self.num_write_pending -= len(ready)
        self.num_evictable += len(ready)
        self.policy.mark_evictable_many(ready, ready_chunks)
        if ready and self.events is not None:
            self.events.append((False, ready))

    def on_request_finished(self, ctx: ReqContext) -> None:
        """Commit the finished request's accesses to the policy (once)."""
        state = ctx.access
        if not isinstance(state, RequestCacheAccess) or state.finished:
            return
        state.finished = True
        if self._finish_sets:
            self.policy.on_request_finished(state.keys, state.inserted - state.reused, state.reused, ctx)
        else:
            self.policy.on_request_finished(state.keys, set(), set(), ctx)

    # -- queries ------------------------------------------------------------------------------
    def usage(self) -> float:
        """Query: vLLM's CPU cache usage gauge -- resident chunks not evictable, over capacity."""
        used = self.num_allocated - len(self.free_list) - self.num_evictable
        return used / self.num_chunks

    def num_resident(self) -> int:
        """Query: chunks holding a key (ready or not)."""
        return self.num_allocated - len(self.free_list)

    def check_integrity(self) -> None:
        """Query: assert the module docstring's invariants (and the policy's)."""
        resident = {k: self.policy.get(k) for k in self.policy.keys()}
        assert len(resident) == self.num_resident(), (len(resident), self.num_resident())
        assert self.num_allocated <= self.num_chunks
        ids = [c.chunk_id for c in resident.values() if c is not None] + [c.chunk_id for c in self.free_list]
        assert len(set(ids)) == len(ids) == self.num_allocated, "chunk ids overlap"
        assert self.num_evictable == sum(1 for c in resident.values() if c is not None and c.ref_cnt == 0)
        assert self.num_write_pending == sum(1 for c in resident.values() if c is not None and c.ref_cnt == -1)
        check = getattr(self.policy, "check_integrity", None)
        if check is not None:
            check()
