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
* eviction is lazy: a reused block is unlinked from its list in O(1), but the key stays in the
  table with an empty list -- a lookup of it checks the list and misses -- until the table is
  rebuilt (when used slots pass half its size), so an eviction never probes or deletes;
* range APIs: ``get_new_blocks(n)``, ``cache_full_blocks`` over a range, ``free_blocks`` and
  ``longest_cached_prefix(keys, max_blocks)`` are one call each.

Blocks are :class:`CompiledBlock` objects (``block_id``, ``ref_cnt``, ``block_hash``,
``group_id``, ``is_null``: read like :class:`sim.core.kv_cache_block.KVCacheBlock`); keys must be
``bytes``. Built by setuptools (``pip install -e .``); :mod:`sim.core.pool_impl` falls back to the
Python pool, with one message, when this module is not built. Imports neither simpy nor torch.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF, PyObject
from libc.stdint cimport int32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy

from collections.abc import Set

from sim.core.block_pool import emit_stored
from sim.core.cache_observer import EVICT_EXPLICIT, EVICT_RESET, EVICT_REUSED
from sim.core.hashing import external_block_hash
from sim.core.kv_cache_block import make_block_key
from sim.core.kv_events import AllBlocksCleared, BlockRemoved

cdef extern from *:
    void __builtin_prefetch(const void* addr) nogil

cdef int32_t NONE = -1
cdef enum:
    GROUP = 16  # keys digested and their table slots prefetched ahead of the inserts
cdef uint64_t M1 = 0xBF58476D1CE4E5B9
cdef uint64_t M2 = 0x94D049BB133111EB
cdef uint64_t GOLD = 0x9E3779B97F4A7C15


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    """splitmix64's finaliser: a bijection spreading every input bit over the word."""
    x = (x ^ (x >> 30)) * M1
    x = (x ^ (x >> 27)) * M2
    return x ^ (x >> 31)


cdef inline void _digest(object key, uint64_t* k0, uint64_t* k1) except *:
    """The 128-bit digest of a key: its bytes when it has 16 (every fast / xxhash hash), else a
    fold of all its bytes and its length (compared in full on a match)."""
    if not PyBytes_Check(key):
        raise TypeError(f"block keys must be bytes, got {type(key).__name__}")
    cdef const char* p = PyBytes_AS_STRING(key)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(key)
    cdef Py_ssize_t i
    cdef uint64_t w, a, b
    if n == 16:
        memcpy(k0, p, 8)
        memcpy(k1, p + 8, 8)
        return
    a = <uint64_t>n * GOLD
    b = ~a
    i = 0
    while i < n:
        w = 0
        memcpy(&w, p + i, 8 if n - i >= 8 else n - i)
        a = _mix(a ^ w) + GOLD
        b = _mix(b + w * M1) ^ a
        i += 8
    k0[0] = a
    k1[0] = b


@cython.no_gc
cdef class CompiledBlock:
    """One KV block's metadata (the fields of ``KVCacheBlock``; ``block_hash`` is read-only: the
    pool sets it). Not tracked by the cyclic GC: it holds only ints and a bytes key, so it cannot
    be part of a cycle (and a pool's tens of thousands of blocks would cost every GC pass)."""

    cdef readonly int block_id
    cdef public int ref_cnt
    cdef public int group_id
    cdef readonly bint is_null
    cdef object _key  # the map key while cached, else None

    def __cinit__(self, int block_id):
        self.block_id = block_id
        self.ref_cnt = 0
        self.group_id = 0
        self.is_null = False
        self._key = None

    @property
    def block_hash(self):
        return self._key

    def __repr__(self):
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self._key is not None})"


ctypedef struct Link:
    # one block's links: the free queue, its key's block list, its table slot
    int32_t fprev
    int32_t fnext
    int32_t hprev
    int32_t hnext
    int32_t slot
    int32_t in_free


ctypedef struct Slot:
    # one table slot: the key's 128-bit digest and length (0: never used), its block list
    uint64_t k0
    uint64_t k1
    int32_t klen
    int32_t head
    int32_t tail
    int32_t pad


cdef class CompiledBlockPool:
    """Owns all blocks, the free queue and the hash index; emits KV events to an optional sink
    (``event_sink`` may be set after construction). Queries say so; every other method changes
    state. Drop-in for :class:`sim.core.block_pool.BlockPool`.

    Layout: one ``Link`` per block (int32 free-queue prev/next, key-list prev/next, slot) and one
    32-byte ``Slot`` per table entry, so a probe or a pop touches one cache line."""

    cdef readonly int num_gpu_blocks
    cdef readonly bint enable_caching
    cdef public object event_sink
    cdef public object observer  # sim.core.cache_observer: told, never consulted
    cdef readonly list blocks
    cdef readonly CompiledBlock null_block
    cdef public long long num_cached_blocks
    cdef public long long num_evictions
    cdef readonly object free_block_queue
    cdef readonly object cached_block_hash_to_block
    cdef bint _grouped
    cdef Link* _link
    cdef int32_t* _scratch  # block ids of one pop
    cdef int32_t _fhead, _ftail, _nfree
    cdef Slot* _slots
    cdef list _tkeys  # the key object of each slot whose key is not 16 bytes (exact compare), else None
    cdef int32_t _tcap, _tmask, _tn_used, _tlive

    def __cinit__(self, int num_gpu_blocks, bint enable_caching=True, event_sink=None):
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is the null block), got {num_gpu_blocks}")
        self._link = <Link*>malloc(num_gpu_blocks * sizeof(Link))
        self._scratch = <int32_t*>malloc(num_gpu_blocks * sizeof(int32_t))
        if self._link == NULL or self._scratch == NULL:
            raise MemoryError()
        self._slots = NULL
        self._alloc_table(_table_size(num_gpu_blocks))

    def __init__(self, int num_gpu_blocks, bint enable_caching=True, event_sink=None):
        cdef int i, n = num_gpu_blocks
        cdef Link* l
        self.num_gpu_blocks = n
        self.enable_caching = enable_caching
        self.event_sink = event_sink
        self.observer = None
        self.blocks = [CompiledBlock(i) for i in range(n)]
        for i in range(n):
            l = &self._link[i]
            l.fprev = i - 1
            l.fnext = i + 1 if i + 1 < n else NONE
            l.in_free = 1
            l.hprev = l.hnext = l.slot = NONE
        self._fhead = 0
        self._ftail = n - 1
        self._nfree = n
        self.null_block = self._popleft()
        self.null_block.is_null = True
        self.num_cached_blocks = 0
        self.num_evictions = 0
        self._grouped = False
        self.free_block_queue = _FreeQueueView(self)
        self.cached_block_hash_to_block = _HashMapView(self)

    def __dealloc__(self):
        free(self._link)
        free(self._scratch)
        free(self._slots)

    # -- C internals --------------------------------------------------------------------------
    cdef inline CompiledBlock _block(self, int32_t bid):
        return <CompiledBlock>PyList_GET_ITEM(self.blocks, bid)

    cdef void _alloc_table(self, int32_t cap) except *:
        cdef Slot* t = <Slot*>calloc(cap, sizeof(Slot))
        if t == NULL:
            raise MemoryError()
        self._slots = t
        self._tkeys = [None] * cap
        self._tcap = cap
        self._tmask = cap - 1
        self._tn_used = 0
        self._tlive = 0

    cdef inline int32_t _home(self, uint64_t k0, uint64_t k1) noexcept:
        """The slot a key's probe starts at."""
        return <int32_t>(_mix(k0 ^ (k1 * GOLD)) & <uint64_t>self._tmask)

    cdef inline int32_t _probe(self, uint64_t k0, uint64_t k1, Py_ssize_t n, object key, bint* found) except -2:
        return self._probe_at(self._home(k0, k1), k0, k1, n, key, found)

    cdef inline int32_t _probe_at(self, int32_t s, uint64_t k0, uint64_t k1, Py_ssize_t n, object key,
                                  bint* found) except -2:
        """The slot holding ``key``, else the empty slot where it would go (``found`` says which);
        linear probing from ``s``, its home slot."""
        cdef Slot* t
        cdef object other
        while True:
            t = &self._slots[s]
            if t.klen == 0:
                found[0] = False
                return s
            if t.k0 == k0 and t.k1 == k1 and t.klen == n:
                if n == 16:
                    found[0] = True
                    return s
                other = <object>PyList_GET_ITEM(self._tkeys, s)
                if memcmp(PyBytes_AS_STRING(other), PyBytes_AS_STRING(key), n) == 0:
                    found[0] = True
                    return s
            s = (s + 1) & self._tmask

    cdef int32_t _find(self, object key) except -2:
        """Query: the used slot of ``key`` (its list may be empty), or -1."""
        cdef uint64_t k0 = 0, k1 = 0
        cdef bint found
        _digest(key, &k0, &k1)
        cdef int32_t s = self._probe(k0, k1, PyBytes_GET_SIZE(key), key, &found)
        return s if found else -1

    cdef inline int32_t _head_of(self, object key) except -2:
        """Query: the first-inserted block cached under ``key``, or -1."""
        cdef int32_t s = self._find(key)
        return -1 if s < 0 else self._slots[s].head

    cdef void _rebuild(self) except *:
        """Drop the keys whose list is empty (lazy evictions), at the same size: a live key holds a
        cached block, so at most a quarter of the slots are live (``_table_size``) and the home
        slot of a key never changes."""
        cdef Slot* old = self._slots
        cdef list okeys = self._tkeys
        cdef int32_t old_cap = self._tcap, s, t, b
        cdef bint found
        self._alloc_table(old_cap)
        for s in range(old_cap):
            if old[s].klen and old[s].head != NONE:
                key = <object>PyList_GET_ITEM(okeys, s)
                t = self._probe(old[s].k0, old[s].k1, old[s].klen, key, &found)
                self._slots[t] = old[s]
                if old[s].klen != 16:
                    self._tkeys[t] = key
                self._tn_used += 1
                self._tlive += 1
                b = old[s].head
                while b != NONE:
                    self._link[b].slot = t
                    b = self._link[b].hnext
        free(old)

    cdef void _insert(self, CompiledBlock blk, object key) except *:
        """Cache ``blk`` under ``key`` after any block already there (no de-duplication)."""
        cdef uint64_t k0 = 0, k1 = 0
        _digest(key, &k0, &k1)
        self._insert_at(blk, key, k0, k1, self._home(k0, k1))

    cdef void _insert_at(self, CompiledBlock blk, object key, uint64_t k0, uint64_t k1, int32_t home) except *:
        """:meth:`_insert` with the key's digest and home slot already computed."""
        cdef bint found
        cdef Py_ssize_t n = PyBytes_GET_SIZE(key)
        cdef int32_t s, bid = blk.block_id, tail
        cdef Slot* t
        s = self._probe_at(home, k0, k1, n, key, &found)
        if not found:
            if (self._tn_used + 1) * 2 > self._tcap:
                self._rebuild()
                s = self._probe(k0, k1, n, key, &found)
            t = &self._slots[s]
            t.k0 = k0
            t.k1 = k1
            t.klen = <int32_t>n
            t.head = t.tail = NONE
            if n != 16:
                self._tkeys[s] = key
            self._tn_used += 1
        t = &self._slots[s]
        tail = t.tail
        self._link[bid].hprev = tail
        self._link[bid].hnext = NONE
        if tail == NONE:
            t.head = bid
            self._tlive += 1
        else:
            self._link[tail].hnext = bid
        t.tail = bid
        self._link[bid].slot = s
        blk._key = key

    cdef void _unlink_hash(self, CompiledBlock blk) noexcept:
        """Remove ``blk`` from its key's list (the key stays in the table: lazy eviction)."""
        cdef int32_t bid = blk.block_id
        cdef Link* l = &self._link[bid]
        cdef Slot* t = &self._slots[l.slot]
        if l.hprev == NONE:
            t.head = l.hnext
        else:
            self._link[l.hprev].hnext = l.hnext
        if l.hnext == NONE:
            t.tail = l.hprev
        else:
            self._link[l.hnext].hprev = l.hprev
        if t.head == NONE:
            self._tlive -= 1
        l.hprev = l.hnext = l.slot = NONE
        blk._key = None

    cdef void _evict(self, CompiledBlock blk, object reason=EVICT_REUSED) except *:
        """Drop a cached block's hash, emitting ``BlockRemoved`` with a sink (the observer is told
        first, as ``BlockPool._evict`` does)."""
        key = blk._key
        if self.observer is not None:
            self.observer.on_evict((blk,), reason)
        self._unlink_hash(blk)
        self.num_evictions += 1
        self.num_cached_blocks -= 1
        if self.event_sink is not None:
            raw = key if blk.group_id == 0 else key[:len(key) - 4]
            self.event_sink(BlockRemoved(block_hashes=[external_block_hash(raw)], group_idx=blk.group_id))

    cdef inline void _unlink_free(self, int32_t bid) noexcept:
        cdef Link* l = &self._link[bid]
        if l.fprev == NONE:
            self._fhead = l.fnext
        else:
            self._link[l.fprev].fnext = l.fnext
        if l.fnext == NONE:
            self._ftail = l.fprev
        else:
            self._link[l.fnext].fprev = l.fprev
        l.in_free = 0
        self._nfree -= 1

    cdef inline void _link_tail(self, int32_t bid) noexcept:
        cdef Link* l = &self._link[bid]
        l.fprev = self._ftail
        l.fnext = NONE
        if self._ftail == NONE:
            self._fhead = bid
        else:
            self._link[self._ftail].fnext = bid
        self._ftail = bid
        l.in_free = 1
        self._nfree += 1

    cdef inline void _link_after(self, int32_t bid, int32_t prev) noexcept:
        """Link ``bid`` after ``prev`` (NONE: at the head)."""
        cdef Link* l = &self._link[bid]
        cdef int32_t nx = self._fhead if prev == NONE else self._link[prev].fnext
        l.fprev = prev
        l.fnext = nx
        if prev == NONE:
            self._fhead = bid
        else:
            self._link[prev].fnext = bid
        if nx == NONE:
            self._ftail = bid
        else:
            self._link[nx].fprev = bid
        l.in_free = 1
        self._nfree += 1

    cdef CompiledBlock _popleft(self):
        if self._nfree == 0:
            raise ValueError("No free blocks available")
        cdef int32_t bid = self._fhead
        self._unlink_free(bid)
        return self._block(bid)

    cdef bint _is_free(self, int32_t bid) noexcept:
        return self._link[bid].in_free != 0

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
        call with a sink)."""
        cdef int i
        cdef CompiledBlock blk
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes if block_hashes is None else block_hashes
        if len(hashes) < num_full_blocks:
            raise AssertionError(
                f"{request.request_id}: caching {num_full_blocks} blocks but only {len(hashes)} hashed"
            )
        if block_hashes is None and group_id == 0 and mask is None and not self._grouped and self.event_sink is None:
            # hot path (one full-attention group: no null blocks, group ids all 0), no events
            if type(blocks) is list and type(hashes) is list:
                self._insert_list(blocks, hashes, num_cached_blocks, num_full_blocks)
            else:
                for i in range(num_cached_blocks, num_full_blocks):
                    blk = <CompiledBlock?>blocks[i]
                    if blk._key is not None:
                        raise AssertionError(f"block {blk.block_id} already cached")
                    self._insert(blk, hashes[i])
            self.num_cached_blocks += num_full_blocks - num_cached_blocks
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
            if self.event_sink is not None:
                stored.append(external_block_hash(hashes[i]))
                kept.append(i)
        if self.event_sink is not None:
            emit_stored(self.event_sink, request, hashes, stored, kept, num_cached_blocks, num_full_blocks,
                        block_size, group_id, spec_kind, sliding_window)
        if self.observer is not None:
            self.observer.on_cache(request, blocks, num_cached_blocks, num_full_blocks, group_id)

    cdef void _insert_list(self, list blocks, list hashes, int start, int stop) except *:
        """Cache ``blocks[start:stop]`` under ``hashes[start:stop]``, a group at a time: first every
        key of the group is digested and its table slot and block prefetched, then the group is
        inserted (the slots are random: waiting on one cache miss at a time would dominate)."""
        cdef uint64_t k0[GROUP]
        cdef uint64_t k1[GROUP]
        cdef int32_t home[GROUP]
        cdef int i = start, g, m
        cdef CompiledBlock blk
        while i < stop:
            m = stop - i if stop - i < GROUP else GROUP
            for g in range(m):
                _digest(<object>PyList_GET_ITEM(hashes, i + g), &k0[g], &k1[g])
                home[g] = self._home(k0[g], k1[g])
                __builtin_prefetch(&self._slots[home[g]])
                __builtin_prefetch(PyList_GET_ITEM(blocks, i + g))
            for g in range(m):
                blk = <CompiledBlock?>PyList_GET_ITEM(blocks, i + g)
                if blk._key is not None:
                    raise AssertionError(f"block {blk.block_id} already cached")
                self._insert_at(blk, <object>PyList_GET_ITEM(hashes, i + g), k0[g], k1[g], home[g])
            i += m

    # -- allocation ---------------------------------------------------------------------------
    def get_new_blocks(self, int num_blocks):
        """Pop ``num_blocks`` from the head with ``ref_cnt = 1``, evicting their hashes now ("free
        is not evict"). Raises ValueError if the queue is shorter.

        The popped blocks are a prefix of the free list: their ids are collected first, then each
        block object (and, for a cached one, its table slot) is fetched ``GROUP`` blocks ahead of
        its turn -- after churn the LRU order is random in memory."""
        cdef int i
        cdef int32_t bid, slot
        cdef CompiledBlock blk
        cdef int32_t* ids = self._scratch
        if num_blocks > self._nfree:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        if num_blocks <= 0:
            if self.enable_caching and self.event_sink is None and self.observer is not None:
                self.observer.on_evict([], EVICT_REUSED)  # as BlockPool does for an empty pop
            return []
        bid = self._fhead
        for i in range(num_blocks):
            ids[i] = bid
            self._link[bid].in_free = 0
            bid = self._link[bid].fnext
        self._fhead = bid
        if bid == NONE:
            self._ftail = NONE
        else:
            self._link[bid].fprev = NONE
        self._nfree -= num_blocks
        for i in range(min(num_blocks, GROUP)):
            __builtin_prefetch(PyList_GET_ITEM(self.blocks, ids[i]))
        cdef list ret = PyList_New(num_blocks)
        for i in range(num_blocks):
            if i + GROUP < num_blocks:
                __builtin_prefetch(PyList_GET_ITEM(self.blocks, ids[i + GROUP]))
                slot = self._link[ids[i + GROUP]].slot
                if slot != NONE:
                    __builtin_prefetch(&self._slots[slot])
            blk = self._block(ids[i])
            Py_INCREF(blk)
            PyList_SET_ITEM(ret, i, blk)
            if self.enable_caching and blk._key is not None and self.event_sink is None and self.observer is None:
                self._unlink_hash(blk)
                self.num_evictions += 1
                self.num_cached_blocks -= 1
        if self.enable_caching and self.event_sink is not None:
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
        each in the given order."""
        cdef CompiledBlock blk
        cdef int rc
        cdef int32_t cursor = NONE  # the last unhashed block linked at the head
        for b in ordered_blocks:
            blk = <CompiledBlock?>b
            rc = blk.ref_cnt - 1
            blk.ref_cnt = rc
            if rc == 0 and not blk.is_null:
                if blk._key is None:
                    self._link_after(blk.block_id, cursor)
                    cursor = blk.block_id
                else:
                    self._link_tail(blk.block_id)

    def evict_blocks(self, block_ids):
        """Drop the hashes of the given blocks, even in-use ones, without freeing them."""
        cdef CompiledBlock blk
        for bid in block_ids:
            blk = <CompiledBlock>self.blocks[bid]
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
        for i in range(self.num_gpu_blocks):
            self._block(i)._key = None
            l = &self._link[i]
            l.hprev = l.hnext = l.slot = NONE
        free(self._slots)
        self._slots = NULL
        self._alloc_table(_table_size(self.num_gpu_blocks))
        self.num_cached_blocks = 0
        if self.event_sink is not None:
            self.event_sink(AllBlocksCleared())
        return True

    # -- state --------------------------------------------------------------------------------
    def get_num_free_blocks(self):
        """Query: blocks in the free queue (cached ones included)."""
        return self._nfree

    def get_usage(self):
        """Query: vLLM's KV usage metric, ``1 - free / (num_gpu_blocks - 1)``."""
        return 1.0 - self._nfree / <double>(self.num_gpu_blocks - 1)

    def free_block_ids(self):
        """Query: free block ids, head (next reused) first."""
        out = []
        cdef int32_t b = self._fhead
        while b != NONE:
            out.append(b)
            b = self._link[b].fnext
        return out

    cdef object _slot_key(self, int32_t s):
        """The key object of a slot with a block (its head block's key)."""
        return self._block(self._slots[s].head)._key

    def check_integrity(self):
        """Assert every pool invariant and the C structures' consistency; O(num_gpu_blocks + table)."""
        cdef int32_t b, prev, s, n_free = 0, n_live = 0, n_used = 0
        cdef int i
        cdef CompiledBlock blk
        cdef bint found
        cdef uint64_t k0 = 0, k1 = 0
        assert self.null_block.block_id == 0 and self.null_block._key is None
        assert not self._is_free(0), "null block in free queue"
        prev = NONE
        b = self._fhead
        while b != NONE:
            assert self._link[b].fprev == prev, f"free list broken at block {b}"
            assert self._is_free(b), f"block {b} linked but not flagged free"
            n_free += 1
            assert n_free <= self.num_gpu_blocks, "free list cycle"
            prev = b
            b = self._link[b].fnext
        assert prev == self._ftail and n_free == self._nfree, (prev, self._ftail, n_free, self._nfree)
        n_cached = 0
        for i in range(1, self.num_gpu_blocks):
            blk = self._block(i)
            assert blk.ref_cnt >= 0, f"block {i} ref_cnt {blk.ref_cnt} < 0"
            assert self._is_free(i) == (blk.ref_cnt == 0), (
                f"block {i}: ref_cnt={blk.ref_cnt} but in_free_queue={self._is_free(i)}"
            )
            if blk._key is not None:
                n_cached += 1
                _digest(blk._key, &k0, &k1)
                s = self._probe(k0, k1, PyBytes_GET_SIZE(blk._key), blk._key, &found)
                assert found and s == self._link[i].slot, f"block {i} has a hash but is not in the map under it"
            else:
                assert self._link[i].slot == NONE, f"uncached block {i} linked in the map"
        n_mapped = 0
        for s in range(self._tcap):
            if not self._slots[s].klen:
                continue
            n_used += 1
            assert (self._tkeys[s] is None) == (self._slots[s].klen == 16), f"slot {s} key object"
            prev = NONE
            b = self._slots[s].head
            if b != NONE:
                n_live += 1
            while b != NONE:
                assert self._link[b].hprev == prev and self._link[b].slot == s, f"hash list broken at block {b}"
                _digest(self._block(b)._key, &k0, &k1)
                assert k0 == self._slots[s].k0 and k1 == self._slots[s].k1, f"block {b} is under another key"
                n_mapped += 1
                prev = b
                b = self._link[b].hnext
            assert prev == self._slots[s].tail, f"hash list tail of slot {s}"
        assert n_used == self._tn_used and n_live == self._tlive, (n_used, self._tn_used, n_live, self._tlive)
        assert n_mapped == n_cached == self.num_cached_blocks, (n_mapped, n_cached, self.num_cached_blocks)


cdef class _FreeQueueView:
    """Read-only view of the free queue (``num_free_blocks``, ``in``, ``block_ids``)."""

    cdef CompiledBlockPool _pool

    def __cinit__(self, CompiledBlockPool pool):
        self._pool = pool

    @property
    def num_free_blocks(self):
        return self._pool._nfree

    def __len__(self):
        return self._pool._nfree

    def __contains__(self, CompiledBlock block):
        return self._pool._is_free(block.block_id)

    def block_ids(self):
        return self._pool.free_block_ids()


cdef class _HashMapView:
    """Read-only view of the prefix-cache index, with the queries of ``BlockHashToBlockMap``."""

    cdef CompiledBlockPool _pool

    def __cinit__(self, CompiledBlockPool pool):
        self._pool = pool

    def __len__(self):
        return self._pool._tlive

    def get_one_block(self, key):
        cdef int32_t b = self._pool._head_of(key)
        return None if b < 0 else self._pool._block(b)

    def keys(self):
        """Query: a live set-like view of the cached keys (``BlockHashToBlockMap.keys``)."""
        return _KeysView(self)

    def __contains__(self, key):
        return self._pool._head_of(key) >= 0

    def longest_cached_prefix(self, keys):
        return self._pool.longest_cached_prefix(list(keys), 1 << 62)

    def block_ids(self, key):
        cdef int32_t b = self._pool._head_of(key)
        out = []
        while b >= 0:
            out.append(b)
            b = self._pool._link[b].hnext
        return out

    def items(self):
        """``(key, blocks)`` per key with a block, in table order."""
        cdef int32_t s, b
        cdef CompiledBlockPool pool = self._pool
        for s in range(pool._tcap):
            if pool._slots[s].klen and pool._slots[s].head != NONE:
                blocks = []
                b = pool._slots[s].head
                while b != NONE:
                    blocks.append(pool._block(b))
                    b = pool._link[b].hnext
                yield pool._slot_key(s), blocks


class _KeysView(Set):
    """The cached keys as a live set (``&`` with an iterable gives a ``set``, as a dict's keys do)."""

    __slots__ = ("_map",)

    def __init__(self, hash_map):
        self._map = hash_map

    @classmethod
    def _from_iterable(cls, it):
        return set(it)

    def __contains__(self, key):
        return key in self._map

    def __len__(self):
        return len(self._map)

    def __iter__(self):
        for key, _ in self._map.items():
            yield key


cdef int32_t _table_size(int num_gpu_blocks):
    """A power of two at least 4x the blocks (a cached block holds one key): at most a quarter live."""
    cdef int32_t cap = 16
    while cap < 4 * num_gpu_blocks:
        cap *= 2
    return cap
