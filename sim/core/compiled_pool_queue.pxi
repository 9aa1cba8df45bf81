"""The compiled pool's free queue and its growth (included by ``compiled_pool.pyx``):
:class:`_PoolQueue` adds to :class:`_PoolIndex` the free-queue operations, the growth of every
array with the blocks handed out, and ``check_integrity``. Invariant: a block is in the free queue
iff its ``ref_cnt`` is 0.

The free queue is a ring of block ids read from head to tail, with lazy removal: each free block
records the ring position of its entry (``_rpos``), an entry whose block records another position
is stale and skipped, and taking a block out of the middle (a prefix hit on a free cached block)
only marks it not free. A pop of n blocks reads the ring in order, so its reads do not wait on each
other as a linked list's would (each next id read from the last one's links, one cache miss after
another); appending at the tail or, for freed blocks without a hash, at the head writes one entry.
When the ring is full it is compacted in place, in order; at least half of it is stale then
(``_ring_size``).

**Never-used blocks are a range, not ring entries.** vLLM's queue starts as every block in id
order; pops take the head, frees link at an end, and only blocks handed out before (cached ones)
are ever taken from the middle -- so the blocks never handed out stay one run of ids
(``_next_virgin .. num_gpu_blocks - 1``) in id order at one place of the queue: ring position
``_vpos``, with the ``_nhead`` free blocks pushed at the head since before it and the ones pushed
at the tail after it (see ``sim.core.free_block_queue``, the Python pool's same rule). A pop takes
the blocks before the run, then the run's ids, making their objects then (``_make_virgin``), then
the blocks after it. Block ids, free order, hits and evictions are those of the pool that made
every block up front; memory follows the blocks handed out: ``_grow`` at least doubles the arrays
(ids ``0 .. _cap - 1``) when a pop reaches past them, and takes all ``num_gpu_blocks`` at once when
that reaches an eighth of them and 2,048 blocks (``WHOLE``, ``JUMP_FROM``).
"""

cdef enum:
    MIN_BLOCKS = 64  # the per-block arrays' first size (about 13 KiB of a pool's state)
    # a growth to JUMP_FROM blocks or more that reaches 1 / WHOLE of the pool's blocks takes them
    # all: a pool that fills then skips its last doublings, each a new table filled by a rebuild
    # (its pages faulted in anew), and a pool that stops below an eighth of its blocks never holds
    # more than twice what it used (a small pool, whose doublings are cheap, keeps them all)
    WHOLE = 8
    JUMP_FROM = 2048  # (about 200 KiB of a pool's state)


cdef inline void* _realloc(void* p, size_t size) except NULL:
    """``PyMem_Realloc``, raising ``MemoryError`` on failure (``p`` is then still valid)."""
    cdef void* q = PyMem_Realloc(p, size)
    if q == NULL:
        raise MemoryError()
    return q


cdef class _PoolQueue(_PoolIndex):
    """:class:`_PoolIndex` with the free-queue ring and growth. Not used on its own."""

    def __cinit__(self, int num_gpu_blocks, bint enable_caching=True, event_sink=None):
        self._grow(1)  # (the null block's)

    # -- growth -------------------------------------------------------------------------------
    cdef void _grow(self, int32_t need) except *:
        """Make the per-block arrays hold ids ``0 .. need - 1`` at least (at least doubling; all
        ``num_gpu_blocks`` once that reaches ``JUMP_FROM`` and ``1 / WHOLE`` of them), the ring and
        the table their sizes for that many blocks. Ids past ``_next_virgin`` get no ring entry and
        no key (``_rpos`` NOT_FREE, links NONE)."""
        cdef int32_t old = self._cap, cap, i
        cdef int64_t p
        cdef int32_t* ring = NULL
        if need <= old:
            return
        cap = max(need, max(2 * old, <int32_t>MIN_BLOCKS))
        if cap >= JUMP_FROM and <int64_t>cap * WHOLE >= self.num_gpu_blocks:
            cap = self.num_gpu_blocks
        cap = min(cap, self.num_gpu_blocks)
        cdef int32_t rsize = _ring_size(cap)
        if cap == self.num_gpu_blocks and <size_t>_table_size(cap) * sizeof(Slot) >= APC_HUGE:
            ring = self._move_to_arena(cap, rsize)  # (the last growth: the pool is whole)
        else:
            self._rpos = <int64_t*>_realloc(self._rpos, cap * sizeof(int64_t))
            self._link = <Link*>_realloc(self._link, cap * sizeof(Link))
            self._scratch = <int32_t*>_realloc(self._scratch, cap * sizeof(int32_t))
            if rsize > self._rmask + 1 or self._ring == NULL:
                ring = <int32_t*>PyMem_Calloc(rsize, sizeof(int32_t))  # zeroed: pops prefetch past the tail
                if ring == NULL:
                    raise MemoryError()
        for i in range(old, cap):
            self._rpos[i] = NOT_FREE
            self._link[i].hprev = self._link[i].hnext = self._link[i].slot = NONE
            self._link[i].pad = 0
        if ring != NULL:
            for p in range(self._rhead, self._rtail):  # same positions, the larger ring's slots
                ring[p & (rsize - 1)] = self._ring[p & self._rmask]
            PyMem_Free(self._ring)  # (never the arena's: the arena comes with the last growth)
            self._ring = ring
            self._rmask = rsize - 1
        self._cap = cap
        if self._slots == NULL:
            self._alloc_table(_table_size(cap))
        elif _table_size(cap) > self._tcap:
            self._rebuild(_table_size(cap))

    cdef int32_t* _move_to_arena(self, int32_t cap, int32_t rsize) except NULL:
        """Move the per-block arrays into one huge-page mapping for ``cap`` blocks (the arena: links,
        ring positions, scratch, and the ring of ``rsize`` entries, returned empty for the caller to
        fill): a whole pool's per-block state is about 1 MiB read at random block ids, which in 4 KiB
        pages is some 250 page faults to fill and a TLB miss on most reads."""
        cdef size_t n_link = cap * sizeof(Link), n_rpos = cap * sizeof(int64_t)
        cdef size_t n_ring = rsize * sizeof(int32_t), n_scratch = cap * sizeof(int32_t)
        cdef size_t size = (n_link + n_rpos + n_ring + n_scratch + APC_HUGE - 1) & ~(APC_HUGE - 1)
        cdef char* a = <char*>apc_huge_map(size)
        if a == NULL:
            raise MemoryError()
        memcpy(a, self._link, self._cap * sizeof(Link))
        memcpy(a + n_link, self._rpos, self._cap * sizeof(int64_t))
        memcpy(a + n_link + n_rpos + n_ring, self._scratch, self._cap * sizeof(int32_t))
        PyMem_Free(self._link)
        PyMem_Free(self._rpos)
        PyMem_Free(self._scratch)
        self._link = <Link*>a
        self._rpos = <int64_t*>(a + n_link)
        self._scratch = <int32_t*>(a + n_link + n_rpos + n_ring)
        self._arena = a
        self._arena_size = size
        return <int32_t*>(a + n_link + n_rpos)

    cdef void _make_virgin(self, int32_t n) except *:
        """Make the objects of the never-used ids a pop of ``n`` will take (the run comes after the
        ``_nhead`` blocks before it), growing the arrays first; the pop itself changes nothing."""
        cdef int32_t take, stop, i
        if self._next_virgin == self.num_gpu_blocks or n <= self._nhead:
            return
        take = min(n - self._nhead, self.num_gpu_blocks - self._next_virgin)
        stop = self._next_virgin + take
        self._grow(stop)
        for i in range(len(self.blocks), stop):
            self.blocks.append(_new_block(i))

    # -- the ring -----------------------------------------------------------------------------
    cdef inline void _unlink_free(self, int32_t bid) noexcept:
        """Take a free block out of the queue (its entry goes stale)."""
        if self._rpos[bid] < self._vpos and self._next_virgin < self.num_gpu_blocks:
            self._nhead -= 1
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
        if self._next_virgin < self.num_gpu_blocks:  # (once the run is gone, nothing is before it)
            self._nhead += 1

    cdef void _compact(self) noexcept:
        """Move the live entries together at the head, in order (in place: each goes to a position
        at or before its own); the run keeps its place, after the ``_nhead`` entries before it."""
        cdef int64_t p, w = self._rhead
        cdef int32_t bid, mask = self._rmask
        for p in range(self._rhead, self._rtail):
            bid = self._ring[p & mask]
            if self._rpos[bid] == p:
                self._ring[w & mask] = bid
                self._rpos[bid] = w
                w += 1
        self._rtail = w
        if self._next_virgin < self.num_gpu_blocks:
            self._vpos = self._rhead + self._nhead

    cdef void _walk(self, int32_t n, int32_t* ids) noexcept:
        """Take the first ``n`` live ring entries into ``ids``, head first (``_nfree`` unchanged)."""
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

    cdef void _pop_ids(self, int32_t n, int32_t* ids) noexcept:
        """Take the first ``n`` free blocks (``n <= _nfree``; the run's objects made by
        ``_make_virgin(n)``) into ``ids``, head first: before the run, the run, after it."""
        cdef int32_t k = 0, take, i
        if self._next_virgin < self.num_gpu_blocks:
            if n <= self._nhead:
                self._walk(n, ids)
                self._nhead -= n
                self._nfree -= n
                return
            k = self._nhead
            self._walk(k, ids)
            self._rhead = self._vpos  # (the entries left before the run are stale)
            self._nhead = 0
            take = min(n - k, self.num_gpu_blocks - self._next_virgin)
            for i in range(take):
                ids[k + i] = self._next_virgin + i
            self._next_virgin += take
            k += take
        if k < n:
            self._walk(n - k, ids + k)
        self._nfree -= n

    cdef CompiledBlock _popleft(self):
        if self._nfree == 0:
            raise ValueError("No free blocks available")
        cdef int32_t bid
        self._make_virgin(1)
        self._pop_ids(1, &bid)
        return self._block(bid)

    cdef bint _is_free(self, int32_t bid) noexcept:
        """Query: whether a block handed out before (``bid < _next_virgin``) is free."""
        return self._rpos[bid] != NOT_FREE

    @property
    def state_blocks(self):
        """Query: the blocks the C arrays hold state for (ids ``0 .. state_blocks - 1``; see
        ``_grow``): the pool's memory, which follows the blocks it handed out."""
        return self._cap

    def free_block_ids(self):
        """Query: free block ids, head (next reused) first."""
        out = []
        cdef int64_t p, stop = self._rtail
        cdef int32_t b
        cdef bint run = self._next_virgin < self.num_gpu_blocks
        if run:
            stop = self._vpos
        for p in range(self._rhead, stop):
            b = self._ring[p & self._rmask]
            if self._rpos[b] == p:
                out.append(b)
        if run:
            out.extend(range(self._next_virgin, self.num_gpu_blocks))
            for p in range(self._vpos, self._rtail):
                b = self._ring[p & self._rmask]
                if self._rpos[b] == p:
                    out.append(b)
        return out

    cdef void _check_queue(self) except *:
        """Assert the ring's consistency with ``_rpos``, ``_nfree``, ``_nhead`` and the run."""
        cdef int32_t b, n_free = 0, n_head = 0, i
        cdef int64_t p
        cdef bint run = self._next_virgin < self.num_gpu_blocks
        assert 0 < self._next_virgin <= self._cap <= self.num_gpu_blocks, (self._next_virgin, self._cap)
        assert len(self.blocks) == self._next_virgin, (len(self.blocks), self._next_virgin)
        assert self._rmask + 1 >= 2 * self._cap or self._cap == self.num_gpu_blocks, "ring smaller than 2x blocks"
        assert self._tcap >= 2 * self._cap, "table smaller than 2x blocks"
        assert 0 <= self._rtail - self._rhead <= self._rmask + 1, "free-queue ring overfull"
        if run:
            assert self._rhead <= self._vpos <= self._rtail, (self._rhead, self._vpos, self._rtail)
        for p in range(self._rhead, self._rtail):
            b = self._ring[p & self._rmask]
            if self._rpos[b] == p:
                assert 0 < b < self._next_virgin, f"ring entry {b} is not a block handed out"
                n_free += 1
                if run and p < self._vpos:
                    n_head += 1
        assert n_free + self.num_gpu_blocks - self._next_virgin == self._nfree, (n_free, self._nfree)
        assert not run or n_head == self._nhead, (n_head, self._nhead)
        for i in range(self._cap):
            if self._rpos[i] != NOT_FREE:
                p = self._rpos[i]
                assert i < self._next_virgin, f"never-used block {i} has a ring position"
                assert self._rhead <= p < self._rtail and self._ring[p & self._rmask] == i, (
                    f"free block {i} is not in the ring at its position"
                )
        for i in range(self._next_virgin, self._cap):
            assert self._link[i].slot == NONE, f"never-used block {i} linked in the map"

    def check_integrity(self):
        """Assert every pool invariant and the C structures' consistency; O(blocks handed out +
        table)."""
        cdef int32_t b, prev, s, n_live = 0, n_used = 0
        cdef int i
        cdef CompiledBlock blk
        cdef bint found
        cdef uint64_t k0 = 0, k1 = 0
        assert self.null_block.block_id == 0 and self.null_block._key is None
        assert not self._is_free(0), "null block in free queue"
        self._check_queue()
        n_cached = 0
        for i in range(1, self._next_virgin):
            blk = self._block(i)
            assert blk.block_id == i, f"blocks[{i}] is block {blk.block_id}"
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
            tkey = None if self._tkeys is None else self._tkeys[s]
            assert (tkey is None) == (self._slots[s].klen == 16), f"slot {s} key object"
            prev = NONE
            b = self._slots[s].head
            assert b != NONE, f"slot {s} holds a key without blocks (deleted keys leave no slot)"
            assert self._slots[s].spread == _spread(self._slots[s].k0, self._slots[s].k1), f"slot {s} spread"
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
