# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled KV block pool (mirrors ``vllm/v1/core/block_pool.py`` of vLLM 0.25.1, like
:mod:`sim.core.block_pool`, its pure-Python oracle).

Same behaviour, op for op, as :class:`sim.core.block_pool.BlockPool` -- block ids, free order,
hits, evictions, KV events, duplicates (no de-duplication), groups, the null block -- with its
state in C arrays:

* the free queue is intrusive: ``int32`` prev/next links indexed by block id, head first;
* the prefix-cache index is an open-addressing table (linear probing) of 128-bit keys (a 16-byte
  key is its own digest; other lengths are folded to 128 bits and compared in full on a digest
  match), each slot holding a doubly linked list of the blocks cached under it, first-inserted
  first (vLLM keeps every block per hash);
* eviction unlinks a reused block from its list in O(1); a key left with no block is deleted
  from the table then (backward-shift deletion: no tombstones, so the table never needs a rebuild
  to drop dead keys -- it is rebuilt only when the pool grows);
* range APIs: ``get_new_blocks(n)``, ``cache_full_blocks`` over a range, ``free_blocks`` and
  ``longest_cached_prefix(keys, max_blocks)`` are one call each;
* it grows with the blocks it touches: a block's object and C state are made when it is first
  handed out (``blocks`` holds ids ``0 .. len(blocks) - 1``, the blocks ever handed out), the
  never-used ones being a run of ids in the free queue (``compiled_pool_queue.pxi``).

Blocks are :class:`CompiledBlock` objects (``block_id``, ``ref_cnt``, ``block_hash``,
``group_id``, ``is_null``: read like :class:`sim.core.kv_cache_block.KVCacheBlock`); keys must be
``bytes``. Built by setuptools (``pip install -e .``); :mod:`sim.core.pool_impl` falls back to the
Python pool, with one message, when this module is not built. Imports neither simpy nor torch.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF, PyObject
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Realloc
from libc.string cimport memcmp, memcpy, memmove, memset

from collections.abc import Set

from sim.core.block_pool import emit_stored
from sim.core.cache_observer import EVICT_EXPLICIT, EVICT_RESET, EVICT_REUSED
from sim.core.hashing import external_block_hash
from sim.core.kv_cache_block import make_block_key
from sim.core.kv_events import AllBlocksCleared, BlockRemoved

cdef inline object _external_hash(object raw):
    """``external_block_hash(raw)`` as a Python int (an event object's hash): ``_ext64``
    (compiled_pool_events.pxi) reads it from the bytes' last 8 in C -- a KV event is emitted per
    stored and per evicted block."""
    return _ext64(raw)


# The module is one Cython compilation unit in five files (each under the 400-line house rule):
# the C layout, the index primitives, the free queue, this file's BlockPool API, and the views.
include "huge_pages.pxi"
include "compiled_pool_layout.pxi"
include "be64.pxi"
include "compiled_pool_events.pxi"
include "compiled_pool_index.pxi"
include "compiled_pool_queue.pxi"


cdef class CompiledBlockPool(_PoolQueue):
    """Owns the blocks, the free queue and the hash index; emits KV events to an optional sink
    (``event_sink`` may be set after construction). Queries say so; every other method changes
    state. Drop-in for :class:`sim.core.block_pool.BlockPool`. Its C state and primitives are
    :class:`_PoolIndex`'s and :class:`_PoolQueue`'s (``compiled_pool_index.pxi``,
    ``compiled_pool_queue.pxi``)."""

    def __init__(self, int num_gpu_blocks, bint enable_caching=True, event_sink=None):
        self.enable_caching = enable_caching
        self.event_sink = event_sink
        self.observer = None
        self.blocks = []  # made as they are first handed out (_make_virgin): ids 0 .. len - 1
        self.null_block = self._popleft()
        self.null_block.is_null = True
        self.num_cached_blocks = 0
        self.num_evictions = 0
        self._grouped = False
        self.free_block_queue = _FreeQueueView(self)
        self.cached_block_hash_to_block = _HashMapView(self)

    # -- lookup -------------------------------------------------------------------------------
    def get_cached_block(self, block_hash, group_ids):
        """Query: the first-inserted cached block for ``block_hash`` in every group, or None on
        any miss."""
        cdef int32_t b
        out = []
        for gid in group_ids:
            b = self._head_of(make_block_key(block_hash, gid))
            if b < 0:
                return None
            out.append(self._block(b))
        return out

    def longest_cached_prefix(self, block_hashes, Py_ssize_t max_blocks):
        """Query: the first-inserted block of each of the first ``max_blocks`` keys, stopping at the
        first key not cached (the one-group full-attention hit search); O(hits)."""
        cdef list out = []
        cdef int32_t b
        cdef Py_ssize_t i, n = len(block_hashes)
        if max_blocks < n:
            n = max_blocks
        for i in range(n):
            b = self._head_of(block_hashes[i])
            if b < 0:
                break
            out.append(self._block(b))
        return out

    # -- caching ------------------------------------------------------------------------------
    def cache_full_blocks(self, request, blocks, int num_cached_blocks, int num_full_blocks, int block_size,
                          int group_id=0, *, block_hashes=None, mask=None, spec_kind=None, sliding_window=None):
        """Give ``blocks[num_cached_blocks:num_full_blocks]`` their hashes and insert them (see
        ``BlockPool.cache_full_blocks``: null and masked blocks skipped, one ``BlockStored`` per
        call with a sink; with a :class:`KVEventLog` its raw form, written here)."""
        cdef int i
        cdef Py_ssize_t n_stored = 0
        cdef CompiledBlock blk
        cdef KVEventLog log = self._log
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes if block_hashes is None else block_hashes
        if len(hashes) < num_full_blocks:
            raise AssertionError(
                f"{request.request_id}: caching {num_full_blocks} blocks but only {len(hashes)} hashed"
            )
        if block_hashes is None and group_id == 0 and mask is None and not self._grouped and (
                self._sink is None or log is not None):
            # hot path (one full-attention group: no null blocks, group ids all 0), no event
            # objects: the raw event is every block's hash, in order (written once all are in, as
            # the object is emitted after the loop below)
            if type(blocks) is list and type(hashes) is list:
                self._insert_list(blocks, hashes, num_cached_blocks, num_full_blocks)
            else:
                for i in range(num_cached_blocks, num_full_blocks):
                    blk = <CompiledBlock?>blocks[i]
                    if blk._key is not None:
                        raise AssertionError(f"block {blk.block_id} already cached")
                    self._insert(blk, hashes[i])
                    self.num_cached_blocks += 1  # counted as it goes: a refused item stops a consistent pool
            if log is not None:
                log.begin(log.step(), EV_STORED, num_full_blocks - num_cached_blocks)
                for i in range(num_cached_blocks, num_full_blocks):
                    log.put(_ext64(hashes[i]))
            if self.observer is not None:
                self.observer.on_cache(request, blocks, num_cached_blocks, num_full_blocks, 0)
            return
        if group_id:
            self._grouped = True
        stored = []
        kept = []
        for i in range(num_cached_blocks, num_full_blocks):
            blk = <CompiledBlock?>blocks[i]
            if blk.is_null or (mask is not None and not mask[i - num_cached_blocks]):
                continue
            if blk._key is not None:
                raise AssertionError(f"block {blk.block_id} already cached")
            key = hashes[i] if group_id == 0 else make_block_key(hashes[i], group_id)
            blk.group_id = group_id
            self._insert(blk, key)
            self.num_cached_blocks += 1
            if self._sink is not None:
                stored.append(_external_hash(hashes[i]))
                kept.append(i)
        if log is not None:
            n_stored = len(stored)
            log.begin(log.step(), EV_STORED, n_stored)
            for i in range(n_stored):
                log.put(<uint64_t>stored[i])
        elif self._sink is not None:
            emit_stored(self._sink, request, hashes, stored, kept, num_cached_blocks, num_full_blocks,
                        block_size, group_id, spec_kind, sliding_window)
        if self.observer is not None:
            self.observer.on_cache(request, blocks, num_cached_blocks, num_full_blocks, group_id)

    cdef void _insert_list(self, list blocks, list hashes, int start, int stop) except *:
        """Cache ``blocks[start:stop]`` under ``hashes[start:stop]``, a group at a time: first every
        key of the group is digested and its table slot and block prefetched, then the group is
        inserted (the slots are random: waiting on one cache miss at a time would dominate)."""
        cdef uint64_t k0[GROUP]
        cdef uint64_t k1[GROUP]
        cdef uint32_t spread[GROUP]
        cdef int i = start, g, m
        cdef CompiledBlock blk
        while i < stop:
            m = stop - i if stop - i < GROUP else GROUP
            for g in range(m):
                _digest(<object>PyList_GET_ITEM(hashes, i + g), &k0[g], &k1[g])
                spread[g] = _spread(k0[g], k1[g])
                __builtin_prefetch(&self._slots[spread[g] & <uint32_t>self._tmask])
                __builtin_prefetch(PyList_GET_ITEM(blocks, i + g))
            for g in range(m):
                blk = <CompiledBlock?><object>PyList_GET_ITEM(blocks, i + g)  # checked: needs an object
                if blk._key is not None:
                    raise AssertionError(f"block {blk.block_id} already cached")
                self._insert_at(blk, <object>PyList_GET_ITEM(hashes, i + g), k0[g], k1[g], spread[g])
                self.num_cached_blocks += 1
            i += m

    # -- allocation ---------------------------------------------------------------------------
    def get_new_blocks(self, int num_blocks):
        """Pop ``num_blocks`` from the head with ``ref_cnt = 1``, evicting their hashes now ("free
        is not evict"). Raises ValueError if the queue is shorter.

        The popped blocks are a prefix of the free list: their ids are collected first, then each
        block object (and, for a cached one, its table slot) is fetched ``GROUP`` blocks ahead of
        its turn -- after churn the LRU order is random in memory."""
        cdef int i
        cdef CompiledBlock blk
        cdef int32_t* ids
        cdef KVEventLog log = self._log
        cdef int64_t step = 0
        cdef bint inline_evict = self.enable_caching and self.observer is None and (self._sink is None or log is not None)
        if num_blocks > self._nfree:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        if num_blocks <= 0:
            if self.enable_caching and self._sink is None and self.observer is not None:
                self.observer.on_evict([], EVICT_REUSED)  # as BlockPool does for an empty pop
            return []
        self._make_virgin(num_blocks)  # (may grow, so move, _scratch)
        ids = self._scratch
        self._pop_ids(num_blocks, ids)
        for i in range(num_blocks):
            __builtin_prefetch(&self._link[ids[i]])  # for the slot prefetches below
        for i in range(min(num_blocks, GROUP)):
            self._prefetch_pop(ids[i])
        if log is not None and inline_evict:
            step = log.step()
        cdef list ret = PyList_New(num_blocks)
        for i in range(num_blocks):
            if i + GROUP < num_blocks:
                self._prefetch_pop(ids[i + GROUP])
            blk = self._block(ids[i])
            Py_INCREF(blk)
            PyList_SET_ITEM(ret, i, blk)
            if inline_evict and blk._key is not None:
                if log is not None:  # (popped and evicted in pop order: the events' order)
                    log.removed(step, _ext64(blk._key if blk.group_id == 0 else blk._key[:len(blk._key) - 4]))
                self._unlink_hash(blk)
                self.num_evictions += 1
                self.num_cached_blocks -= 1
        if inline_evict:
            pass
        elif self.enable_caching and self._sink is not None:
            # all popped first, then evicted in pop order (the order of the BlockRemoved events)
            for i in range(num_blocks):
                blk = <CompiledBlock>PyList_GET_ITEM(ret, i)
                if blk._key is not None:
                    self._evict(blk)
        elif self.enable_caching and self.observer is not None:
            # as BlockPool: the observer sees the popped blocks, still keyed, in one call
            self.observer.on_evict(ret, EVICT_REUSED)
            for i in range(num_blocks):
                blk = <CompiledBlock>PyList_GET_ITEM(ret, i)
                if blk._key is not None:
                    self._unlink_hash(blk)
                    self.num_evictions += 1
                    self.num_cached_blocks -= 1
        for i in range(num_blocks):
            (<CompiledBlock>PyList_GET_ITEM(ret, i)).ref_cnt = 1
        return ret

    cdef inline void _prefetch_pop(self, int32_t bid) noexcept:
        """Start fetching what popping ``bid`` touches: its block object and, when it is cached,
        its key's table slot and the next (for writing: the eviction unlinks the block from the
        slot's list, and deletes an emptied key)."""
        cdef int32_t slot = self._link[bid].slot
        __builtin_prefetch(PyList_GET_ITEM(self.blocks, bid))
        if slot != NONE:
            __builtin_prefetch(&self._slots[slot], 1)
            # and the next slot's: a key left without blocks is deleted, which reads on from there
            __builtin_prefetch(&self._slots[(slot + 1) & self._tmask], 1)

    def num_evictable(self, blocks):
        """Query: how many of the hit ``blocks`` touching would take from the free queue (see
        ``BlockPool.num_evictable``): one call for a request's hits, not two attribute reads a block
        from the (mypyc) coordinator."""
        cdef CompiledBlock blk
        cdef Py_ssize_t i, n = 0
        if type(blocks) is list:
            for i in range(PyList_GET_SIZE(blocks)):
                blk = <CompiledBlock?><object>PyList_GET_ITEM(blocks, i)
                if blk.ref_cnt == 0 and not blk.is_null:
                    n += 1
            return n
        for b in blocks:
            blk = <CompiledBlock?>b
            if blk.ref_cnt == 0 and not blk.is_null:
                n += 1
        return n

    def touch(self, blocks):
        """Take a reference on hit blocks, unlinking free ones from the queue (they keep their hash)."""
        cdef CompiledBlock blk
        for b in blocks:
            blk = <CompiledBlock?>b
            if blk.ref_cnt == 0 and not blk.is_null:
                if not self._is_free(blk.block_id):
                    raise KeyError(blk)
                self._unlink_free(blk.block_id)
            blk.ref_cnt += 1

    def free_blocks(self, ordered_blocks):
        """Drop one reference each; unhashed blocks reaching 0 go to the head, hashed to the tail,
        each in the given order. A list is walked with each block object fetched ``GROUP`` blocks
        ahead (a request's blocks are freed long after they were last touched)."""
        cdef CompiledBlock blk
        cdef Py_ssize_t i, n
        cdef int32_t k, n_head = 0  # unhashed blocks reaching 0, bound for the head (in _scratch)
        try:
            if type(ordered_blocks) is list:
                n = PyList_GET_SIZE(ordered_blocks)
                for i in range(min(n, GROUP)):
                    __builtin_prefetch(PyList_GET_ITEM(ordered_blocks, i), 1)
                for i in range(n):
                    if i + GROUP < n:
                        __builtin_prefetch(PyList_GET_ITEM(ordered_blocks, i + GROUP), 1)
                    n_head = self._release(<CompiledBlock?><object>PyList_GET_ITEM(ordered_blocks, i), n_head)
            else:
                for b in ordered_blocks:
                    n_head = self._release(<CompiledBlock?>b, n_head)
        finally:  # (also when an item is not a block: those released so far are queued)
            # pushed at the head last to first, so they lead the queue in the given order (each
            # end of the queue keeps its own order, so doing the head's pushes last changes nothing)
            for k in range(n_head - 1, -1, -1):
                self._link_head(self._scratch[k])

    cdef inline int32_t _release(self, CompiledBlock blk, int32_t n_head) noexcept:
        """Drop one reference of ``blk`` (see ``free_blocks``): a hashed block reaching 0 goes to
        the tail now, an unhashed one to ``_scratch[n_head]``; returns the new ``n_head``."""
        cdef int rc = blk.ref_cnt - 1
        blk.ref_cnt = rc
        if rc == 0 and not blk.is_null:
            if blk._key is None:
                self._scratch[n_head] = blk.block_id
                return n_head + 1
            self._link_tail(blk.block_id)
        return n_head

    def evict_blocks(self, block_ids):
        """Drop the hashes of the given blocks, even in-use ones, without freeing them (a block
        never handed out has none); IndexError for an id outside ``0 .. num_gpu_blocks - 1``."""
        cdef CompiledBlock blk
        for bid in block_ids:
            if not 0 <= bid < self.num_gpu_blocks:
                raise IndexError(f"block id {bid} is not in a pool of {self.num_gpu_blocks} blocks")
            if bid < self._next_virgin:
                blk = self._block(bid)
                if blk._key is not None:
                    self._evict(blk, EVICT_EXPLICIT)

    def reset_prefix_cache(self):
        """Forget every hash; only allowed when no block is in use (the null block aside)."""
        cdef int i
        cdef Link* l
        if self.num_gpu_blocks - self._nfree != 1:
            return False
        if self.observer is not None:
            self.observer.on_evict([b for b in self.blocks if (<CompiledBlock>b)._key is not None], EVICT_RESET)
        for i in range(self._next_virgin):  # (a never-used block has no key)
            self._block(i)._key = None
            l = &self._link[i]
            l.hprev = l.hnext = l.slot = NONE
        _free_table(self._slots, self._tcap)
        self._slots = NULL
        self._alloc_table(_table_size(self._cap))
        self.num_cached_blocks = 0
        if self._log is not None:
            self._log.begin(self._log.step(), EV_CLEARED, 0)
        elif self._sink is not None:
            self._sink(AllBlocksCleared())
        return True

    # -- state --------------------------------------------------------------------------------
    def get_num_free_blocks(self):
        """Query: blocks in the free queue (cached ones included)."""
        return self._nfree

    def get_usage(self):
        """Query: vLLM's KV usage metric, ``1 - free / (num_gpu_blocks - 1)``."""
        return 1.0 - self._nfree / <double>(self.num_gpu_blocks - 1)


include "compiled_pool_views.pxi"
