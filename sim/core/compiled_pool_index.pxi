"""The compiled pool's index mechanics (included by ``compiled_pool.pyx``): :class:`_PoolIndex`
owns the C arrays -- the free-queue ring (its operations in ``compiled_pool_queue.pxi``) and the
open-addressing key table -- and the table's primitive operations; :class:`CompiledBlockPool`
builds vLLM's BlockPool API on top of them. Invariant (checked by ``check_integrity``): a block
with a key is linked in exactly that key's slot list, first-inserted first.

Every array grows with the blocks the pool has handed out, not with ``num_gpu_blocks``
(``_PoolQueue._grow``): the per-block arrays hold ``_cap`` blocks, the table ``_table_size(_cap)``
slots, so a pool that used a few hundred of its blocks holds a few hundred blocks' state (taken
with ``PyMem_*``, so ``tracemalloc`` counts it), and one that passes an eighth of its blocks takes
its whole size at once (a pool that fills grows once more, not through every doubling). A table
that grows is rebuilt at the new size; its slot order is nowhere observable (the Python pool's
dict has another order, and every result is the same with either pool). A table of 2 MiB or more
(65,536 slots and up: a pool holding more than 16,384 blocks' state) is its own mapping in huge
pages (``huge_pages.pxi``): its probes land at random, and a pool that fills touches all of it;
the per-block arrays of such a pool move into one more when it takes its whole size (``_arena``).
Neither mapping is seen by ``tracemalloc`` (they are whole pools of more than 16,384 blocks).
A key whose last block is evicted leaves the table at once (backward-shift deletion,
``_delete_slot``), so the table holds only live keys: at most half its slots, and no rebuild ever
runs to drop dead ones.
"""


cdef inline void _free_table(Slot* slots, int32_t cap) noexcept:
    """Release a table ``_PoolIndex._alloc_table`` took for ``cap`` slots (its size says how)."""
    if cap * sizeof(Slot) < APC_HUGE:
        PyMem_Free(slots)
    else:
        apc_huge_unmap(slots, cap * sizeof(Slot))


cdef class _PoolIndex:
    """The C state of a pool: one ``Link`` per block (int32 free-queue prev/next, key-list
    prev/next, slot) and one 32-byte ``Slot`` per table entry, so a probe or a pop touches one
    cache line. Not used on its own: :class:`CompiledBlockPool` is the pool."""

    cdef readonly int num_gpu_blocks
    cdef readonly bint enable_caching
    cdef object _sink  # the KV-event sink (``event_sink``), or None
    cdef KVEventLog _log  # the sink when it is a raw log (written in C), else None
    cdef public object observer  # sim.core.cache_observer: told, never consulted
    cdef readonly list blocks
    cdef readonly CompiledBlock null_block
    cdef public long long num_cached_blocks
    cdef public long long num_evictions
    cdef readonly object free_block_queue
    cdef readonly object cached_block_hash_to_block
    cdef bint _grouped
    cdef int32_t* _ring  # the free queue: block ids from position _rhead to _rtail (mod its size)
    cdef int64_t* _rpos  # per block: the position of its live ring entry, NOT_FREE when in use
    cdef int64_t _rhead, _rtail
    cdef int32_t _rmask, _nfree  # (_nfree counts the never-used blocks too)
    cdef int32_t _cap  # blocks the per-block arrays (_rpos, _link, _scratch) hold
    cdef int32_t _next_virgin  # the lowest never-used block id (num_gpu_blocks when none is left)
    cdef int64_t _vpos  # the ring position the run of never-used ids sits at, while there is one
    cdef int32_t _nhead  # free blocks before the run (ring positions below _vpos), while there is one
    cdef Link* _link
    cdef int32_t* _scratch  # block ids of one pop, or of one free's blocks bound for the head
    # the one huge-page mapping of _link, _rpos, _ring and _scratch once the pool is whole and its
    # table is huge (``_PoolQueue._move_to_arena``), else NULL (each array its own PyMem block)
    cdef char* _arena
    cdef size_t _arena_size
    cdef Slot* _slots
    # the key object of each slot whose key is not 16 bytes (exact compare), else None; the list
    # itself is None until such a key is first inserted (keys of the default "fast" hash are 16)
    cdef list _tkeys
    cdef int32_t _tcap, _tmask, _tn_used, _tlive

    def __cinit__(self, int num_gpu_blocks, bint enable_caching=True, event_sink=None):
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is the null block), got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self._ring = NULL  # every array is allocated by _PoolQueue._grow, and grows there
        self._rpos = NULL
        self._link = NULL
        self._scratch = NULL
        self._slots = NULL
        self._arena = NULL
        self._cap = 0
        self._rmask = 0
        self._rhead = self._rtail = self._vpos = RING_BASE
        self._nfree = num_gpu_blocks
        self._next_virgin = 0
        self._nhead = 0

    def __dealloc__(self):
        if self._arena != NULL:
            apc_huge_unmap(self._arena, self._arena_size)
        else:
            PyMem_Free(self._ring)
            PyMem_Free(self._rpos)
            PyMem_Free(self._link)
            PyMem_Free(self._scratch)
        _free_table(self._slots, self._tcap)

    @property
    def event_sink(self):
        """The KV-event sink (None: no events); a :class:`KVEventLog` is written in C."""
        return self._sink

    @event_sink.setter
    def event_sink(self, sink):
        self._sink = sink
        self._log = sink if type(sink) is KVEventLog else None

    # -- C internals --------------------------------------------------------------------------
    cdef inline CompiledBlock _block(self, int32_t bid):
        return <CompiledBlock>PyList_GET_ITEM(self.blocks, bid)

    cdef void _alloc_table(self, int32_t cap) except *:
        """An empty table of ``cap`` slots (the old one, if any, released by the caller)."""
        cdef Slot* t
        if cap * sizeof(Slot) < APC_HUGE:
            t = <Slot*>PyMem_Calloc(cap, sizeof(Slot))
        else:
            t = <Slot*>apc_huge_map(cap * sizeof(Slot))
        if t == NULL:
            raise MemoryError()
        self._slots = t
        self._tkeys = None
        self._tcap = cap
        self._tmask = cap - 1
        self._tn_used = 0
        self._tlive = 0

    cdef void _set_tkey(self, int32_t s, object key) except *:
        """Keep ``key`` (not 16 bytes) as slot ``s``'s key object, making the list on first use."""
        if self._tkeys is None:
            self._tkeys = [None] * self._tcap
        self._tkeys[s] = key

    cdef inline int32_t _home(self, uint64_t k0, uint64_t k1) noexcept:
        """The slot a key's probe starts at."""
        return <int32_t>(_spread(k0, k1) & <uint32_t>self._tmask)

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

    cdef void _rebuild(self, int32_t cap) except *:
        """Move every key into a table of ``cap`` slots (a larger one: the pool grew, so
        ``_table_size`` did); every used slot holds a key with blocks (``_delete_slot``)."""
        cdef Slot* old = self._slots
        cdef list okeys = self._tkeys
        cdef int32_t old_cap = self._tcap, s, t, b
        cdef bint found
        self._alloc_table(cap)
        for s in range(old_cap):
            if old[s].klen and old[s].head != NONE:
                key = None if okeys is None else <object>PyList_GET_ITEM(okeys, s)
                t = self._probe(old[s].k0, old[s].k1, old[s].klen, key, &found)
                self._slots[t] = old[s]
                if old[s].klen != 16:
                    self._set_tkey(t, key)
                self._tn_used += 1
                self._tlive += 1
                b = old[s].head
                while b != NONE:
                    self._link[b].slot = t
                    b = self._link[b].hnext
        _free_table(old, old_cap)

    cdef void _insert(self, CompiledBlock blk, object key) except *:
        """Cache ``blk`` under ``key`` after any block already there (no de-duplication)."""
        cdef uint64_t k0 = 0, k1 = 0
        _digest(key, &k0, &k1)
        self._insert_at(blk, key, k0, k1, _spread(k0, k1))

    cdef void _insert_at(self, CompiledBlock blk, object key, uint64_t k0, uint64_t k1, uint32_t spread) except *:
        """:meth:`_insert` with the key's digest and ``_spread`` already computed."""
        cdef bint found
        cdef Py_ssize_t n = PyBytes_GET_SIZE(key)
        cdef int32_t s, bid = blk.block_id, tail
        cdef Slot* t
        s = self._probe_at(<int32_t>(spread & <uint32_t>self._tmask), k0, k1, n, key, &found)
        if not found:
            # (no rebuild here: every used slot holds a cached block's key, and the table has at
            # least 2x the slots of the blocks handed out -- _table_size, kept by _PoolQueue._grow)
            t = &self._slots[s]
            t.k0 = k0
            t.k1 = k1
            t.klen = <int32_t>n
            t.spread = spread
            t.head = t.tail = NONE
            if n != 16:
                self._set_tkey(s, key)
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
        """Remove ``blk`` from its key's list, and the key from the table when no block is left."""
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
            self._delete_slot(l.slot)
        l.hprev = l.hnext = l.slot = NONE
        blk._key = None

    cdef void _delete_slot(self, int32_t s) noexcept:
        """Empty slot ``s`` (its list just became empty) by backward-shift deletion: each key of the
        probe run after it that may sit earlier (its home slot is not between the hole and it, going
        round) moves back into the hole, which moves on to its old slot, until an empty slot ends
        the run. Linear probing then still finds every key, and the table keeps no dead keys (no
        tombstones, so no rebuild to drop them: an eviction is paid when it happens)."""
        cdef int32_t hole = s, j = s, mask = self._tmask, b
        cdef Slot* t
        cdef list tkeys = self._tkeys
        while True:
            j = (j + 1) & mask
            t = &self._slots[j]
            if t.klen == 0:
                break
            # distance home -> j at least hole -> j: the home is at or before the hole
            if ((j - <int32_t>(t.spread & <uint32_t>mask)) & mask) >= ((j - hole) & mask):
                self._slots[hole] = t[0]
                if tkeys is not None:
                    tkeys[hole] = tkeys[j]
                b = t.head
                self._link[b].slot = hole
                while b != t.tail:  # (the tail test first: most lists hold one block, whose
                    b = self._link[b].hnext  # links then are only written, never waited for)
                    self._link[b].slot = hole
                hole = j
        memset(&self._slots[hole], 0, sizeof(Slot))
        if tkeys is not None:
            tkeys[hole] = None
        self._tn_used -= 1

    cdef void _evict(self, CompiledBlock blk, object reason=EVICT_REUSED) except *:
        """Drop a cached block's hash, emitting ``BlockRemoved`` with a sink (the observer is told
        first, as ``BlockPool._evict`` does)."""
        key = blk._key
        if self.observer is not None:
            self.observer.on_evict((blk,), reason)
        self._unlink_hash(blk)
        self.num_evictions += 1
        self.num_cached_blocks -= 1
        if self._log is not None:
            self._log.removed(self._log.step(), _ext64(key if blk.group_id == 0 else key[:len(key) - 4]))
        elif self._sink is not None:
            raw = key if blk.group_id == 0 else key[:len(key) - 4]
            self._sink(BlockRemoved(block_hashes=[_external_hash(raw)], group_idx=blk.group_id))

    cdef object _slot_key(self, int32_t s):
        """The key object of a slot with a block (its head block's key)."""
        return self._block(self._slots[s].head)._key

