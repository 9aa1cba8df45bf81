"""The compiled pool's index mechanics (included by ``compiled_pool.pyx``): :class:`_PoolIndex`
owns the C arrays -- the intrusive free list and the open-addressing key table -- and their
primitive operations; :class:`CompiledBlockPool` builds vLLM's BlockPool API on top of them.
Invariants (checked by ``check_integrity``): a block is in the free list iff its ``ref_cnt`` is 0;
a block with a key is linked in exactly that key's slot list, first-inserted first.

The free queue is a ring of block ids read from head to tail, with lazy removal: each free block
records the ring position of its entry (``_rpos``), an entry whose block records another position
is stale and skipped, and taking a block out of the middle (a prefix hit on a free cached block)
only marks it not free. A pop of n blocks reads the ring in order, so its reads do not wait on each
other as a linked list's would (each next id read from the last one's links, one cache miss after
another); appending at the tail or, for freed blocks without a hash, at the head writes one entry.
When the ring is full it is compacted in place, in order; at least half of it is stale then
(``_ring_size``).
"""


cdef class _PoolIndex:
    """The C state of a pool: one ``Link`` per block (int32 free-queue prev/next, key-list
    prev/next, slot) and one 32-byte ``Slot`` per table entry, so a probe or a pop touches one
    cache line. Not used on its own: :class:`CompiledBlockPool` is the pool."""

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
    cdef int32_t* _ring  # the free queue: block ids from position _rhead to _rtail (mod its size)
    cdef int64_t* _rpos  # per block: the position of its live ring entry, NOT_FREE when in use
    cdef int64_t _rhead, _rtail
    cdef int32_t _rmask, _nfree
    cdef Link* _link
    cdef int32_t* _scratch  # block ids of one pop, or of one free's blocks bound for the head
    cdef Slot* _slots
    cdef list _tkeys  # the key object of each slot whose key is not 16 bytes (exact compare), else None
    cdef int32_t _tcap, _tmask, _tn_used, _tlive

    def __cinit__(self, int num_gpu_blocks, bint enable_caching=True, event_sink=None):
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is the null block), got {num_gpu_blocks}")
        cdef int32_t ring = _ring_size(num_gpu_blocks)
        self._ring = <int32_t*>calloc(ring, sizeof(int32_t))  # zeroed: pops prefetch past the tail
        self._rpos = <int64_t*>malloc(num_gpu_blocks * sizeof(int64_t))
        self._rmask = ring - 1
        self._link = <Link*>malloc(num_gpu_blocks * sizeof(Link))
        self._scratch = <int32_t*>malloc(num_gpu_blocks * sizeof(int32_t))
        if self._ring == NULL or self._rpos == NULL or self._link == NULL or self._scratch == NULL:
            raise MemoryError()
        self._slots = NULL
        self._alloc_table(_table_size(num_gpu_blocks))

    def __dealloc__(self):
        free(self._ring)
        free(self._rpos)
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
            self.event_sink(BlockRemoved(block_hashes=[_external_hash(raw)], group_idx=blk.group_id))

    cdef inline void _unlink_free(self, int32_t bid) noexcept:
        """Take a free block out of the queue (its entry goes stale)."""
        self._rpos[bid] = NOT_FREE
        self._nfree -= 1

    cdef inline void _link_tail(self, int32_t bid) noexcept:
        if self._rtail - self._rhead > self._rmask:
            self._compact()
        self._ring[self._rtail & self._rmask] = bid
        self._rpos[bid] = self._rtail
        self._rtail += 1
        self._nfree += 1

    cdef inline void _link_head(self, int32_t bid) noexcept:
        if self._rtail - self._rhead > self._rmask:
            self._compact()
        self._rhead -= 1
        self._ring[self._rhead & self._rmask] = bid
        self._rpos[bid] = self._rhead
        self._nfree += 1

    cdef void _compact(self) noexcept:
        """Move the live entries together at the head, in order (in place: each goes to a position
        at or before its own)."""
        cdef int64_t p, w = self._rhead
        cdef int32_t bid, mask = self._rmask
        for p in range(self._rhead, self._rtail):
            bid = self._ring[p & mask]
            if self._rpos[bid] == p:
                self._ring[w & mask] = bid
                self._rpos[bid] = w
                w += 1
        self._rtail = w

    cdef void _pop_ids(self, int32_t n, int32_t* ids) noexcept:
        """Take the first ``n`` free blocks (``n <= _nfree``) into ``ids``, head first."""
        cdef int64_t p = self._rhead
        cdef int32_t k = 0, bid, mask = self._rmask
        while k < n:
            __builtin_prefetch(&self._rpos[self._ring[(p + GROUP) & mask]])
            bid = self._ring[p & mask]
            if self._rpos[bid] == p:
                self._rpos[bid] = NOT_FREE
                ids[k] = bid
                k += 1
            p += 1
        self._rhead = p
        self._nfree -= n

    cdef CompiledBlock _popleft(self):
        if self._nfree == 0:
            raise ValueError("No free blocks available")
        cdef int32_t bid
        self._pop_ids(1, &bid)
        return self._block(bid)

    cdef bint _is_free(self, int32_t bid) noexcept:
        return self._rpos[bid] != NOT_FREE

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
        assert 0 <= self._rtail - self._rhead <= self._rmask + 1, "free-queue ring overfull"
        cdef int64_t p
        for p in range(self._rhead, self._rtail):
            b = self._ring[p & self._rmask]
            if self._rpos[b] == p:
                assert 0 < b < self.num_gpu_blocks, f"ring entry {b} is not a block"
                n_free += 1
        assert n_free == self._nfree, (n_free, self._nfree)
        for i in range(self.num_gpu_blocks):
            if self._rpos[i] != NOT_FREE:
                p = self._rpos[i]
                assert self._rhead <= p < self._rtail and self._ring[p & self._rmask] == i, (
                    f"free block {i} is not in the ring at its position"
                )
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
