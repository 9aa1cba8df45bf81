"""The manager's calls on the compiled LRU tier (included by ``chunk_table.pyx``):
:class:`LRUChunkTable` answers the calls of :class:`sim.core.offload.manager.CPUOffloadingManager`
the connector makes -- ``prepare_store`` / ``prepare_load`` take the index of their first key in the
request's key list (``first``) -- with the same results, op for op (see ``chunk_table.pyx``)."""


cdef class LRUChunkTable(_TableCore):
    """vLLM's ``CPUOffloadingManager`` with ``LRUCachePolicy`` in C arrays (module docstring).
    Every method changes state unless it says Query."""

    def needs_positions(self) -> bool:
        """Query: no -- a key's position comes from its index (``first``), not ``ReqContext``."""
        return False

    # -- lookups ------------------------------------------------------------------------------
    def lookup(self, key):
        """Query: MISS, HIT (ready) or HIT_PENDING (its store is in flight)."""
        cdef int32_t s = self._slot(key)
        if s < 0:
            return _MISS
        return _HIT if self.sl[s].ref_cnt >= 0 else _PENDING

    def lookup_run(self, list keys, Py_ssize_t start, Py_ssize_t stop, bint stop_at_pending):
        """Query: ``(count, pending)``: the resident keys from ``keys[start]`` on, up to ``stop``, before
        the first absent one, and whether one of them is pending (with ``stop_at_pending``, the count
        stops at the first pending one)."""
        cdef Py_ssize_t i, count = 0
        cdef bint pending = False
        cdef int32_t s
        stop = min(stop, PyList_GET_SIZE(keys))
        for i in range(start, stop):
            s = self._slot(<object>PyList_GET_ITEM(keys, i))
            if s < 0:
                break
            count += 1
            if self.sl[s].ref_cnt < 0:
                pending = True
                if stop_at_pending:
                    break
        return count, pending

    def first_pending(self, list keys) -> int:
        """Query: the index of the first key of ``keys`` whose chunk is being stored, or -1."""
        cdef Py_ssize_t i, n = PyList_GET_SIZE(keys)
        cdef int32_t* slots = self._slots(keys)
        cdef int32_t s
        for i in range(n):
            s = slots[i]
            if s >= 0 and self.sl[s].ref_cnt < 0:
                return i
        return -1

    # -- loads --------------------------------------------------------------------------------
    def prepare_load(self, list keys, ctx, Py_ssize_t first=-1) -> None:
        """Pin the ready chunks of ``keys`` (the request's keys from index ``first``) for a load,
        and record them as observed (a first observation touches the key's rank)."""
        if first < 0:
            raise ValueError("the compiled CPU tier needs the index of the first key (first)")
        cdef Py_ssize_t i, n = PyList_GET_SIZE(keys)
        cdef int32_t* slots = self._slots(keys)
        cdef int32_t s
        cdef int64_t rank = 0
        if n:
            self._minor(first + n - 1)
        for i in range(n):
            s = slots[i]
            assert s >= 0 and self.sl[s].ref_cnt >= 0, f"chunk {keys[i]!r} is not loadable"
        for i in range(n):
            s = slots[i]
            if self.sl[s].ref_cnt == 0:
                self.num_evictable -= 1  # (its heap entry goes stale: ref_cnt is not 0)
            self.sl[s].ref_cnt += 1
        self.chunks_loaded += n
        cdef _Access acc = self._access(ctx)
        for i in range(n):
            acc.note(first + i, slots[i])
            if self._see(acc, first + i, <object>PyList_GET_ITEM(keys, i)):
                if rank == 0:
                    assert not acc.finished, "new cache keys observed after request finalization"
                    rank = self._rank(acc)
                self._touch(slots[i], rank, self._minor(first + i))

    def complete_load(self, keys) -> None:
        """Unpin the chunks of a finished load."""
        cdef int32_t s
        for key in keys:
            s = self._slot(key)
            assert s >= 0 and self.sl[s].ref_cnt > 0, f"chunk {key!r} was not being loaded"
            self.sl[s].ref_cnt -= 1
            if self.sl[s].ref_cnt == 0:
                self.num_evictable += 1
                self._push(s)

    # -- stores -------------------------------------------------------------------------------
    def prepare_store(self, list keys, ctx, Py_ssize_t first=-1):
        """Allocate chunks for the absent keys of an offer (the request's keys from index
        ``first``): a ``PrepareStoreOutput``, or None when they cannot all be allocated (then no
        chunk was allocated or evicted). Ready residents are observed (touched the first time),
        pending ones ignored."""
        if first < 0:
            raise ValueError("the compiled CPU tier needs the index of the first key (first)")
        cdef Py_ssize_t i, n = PyList_GET_SIZE(keys), num_to_store = 0
        cdef int32_t* slots
        cdef int32_t s
        cdef int64_t rank = 0
        cdef bint fresh
        cdef _Access acc = self._access(ctx)
        if n:  # (refused before anything changes: see _minor)
            self._minor(first + n - 1)
        fresh = not acc.finished
        slots = self._slots(keys)  # (their hashes stay in hbuf for _store)
        for i in range(n):
            s = slots[i]
            if s >= 0 or self._seen(acc, first + i):
                fresh = False
        if n == 0:
            return PrepareStoreOutput([], [])
        if fresh:  # every key absent and unseen (a prefill's new chunks): observed, all stored
            if first == PyList_GET_SIZE(acc.seen):  # (the usual case: the record grows by the offer)
                acc.seen.extend(keys)
            else:
                for i in range(n):
                    self._see(acc, first + i, <object>PyList_GET_ITEM(keys, i))
            self._rank(acc)
            return self._store(keys, first, n, n, acc)
        for i in range(n):
            s = slots[i]
            if s < 0:
                num_to_store += 1
            elif self.sl[s].ref_cnt < 0:
                continue  # a pending resident is neither stored nor observed
            if self._see(acc, first + i, <object>PyList_GET_ITEM(keys, i)):
                if rank == 0:
                    assert not acc.finished, "new cache keys observed after request finalization"
                    rank = self._rank(acc)
                if s >= 0:
                    acc.note(first + i, s)
                    self._touch(s, rank, self._minor(first + i))
        if num_to_store == 0:
            return PrepareStoreOutput([], [])
        return self._store(keys, first, n, num_to_store, acc)

    cdef object _store(self, list keys, Py_ssize_t first, Py_ssize_t n, Py_ssize_t num_to_store, _Access acc):
        """``prepare_store``'s allocation of the absent keys (``slots[i] < 0``), evicting as needed;
        the offer's ready residents are never victims."""
        cdef int32_t* slots = self.buf
        cdef Py_ssize_t i, num_to_evict = num_to_store - (self.num_free_stack + self.num_chunks - self.num_allocated)
        cdef int32_t s
        cdef int64_t rank, tpc = self.tokens_per_chunk
        cdef bint ok
        cdef list evicted = [] if self.report_evictions or self.events is not None else None
        if num_to_evict > 0:
            if num_to_evict > self.num_evictable:
                return None
            for i in range(n):
                if slots[i] >= 0:
                    self.protected[slots[i]] = 1
            ok = _evict(self, num_to_evict, n - num_to_store, evicted)
            for i in range(n):
                if slots[i] >= 0:
                    self.protected[slots[i]] = 0
            if not ok:
                return None
            self.chunks_evicted += num_to_evict
            if self.events is not None:  # before the new chunks are inserted, as vLLM appends it
                self.events.append((True, evicted))
        rank = self._rank(acc)
        cdef list to_store = keys if num_to_store == n else []
        cdef array.array chunk_ids = array.clone(_IDS, num_to_store, False)
        cdef int* ids = chunk_ids.data.as_ints
        cdef Slot* c
        cdef Py_ssize_t k = 0
        for i in range(n):
            if slots[i] >= 0:
                continue
            key = <object>PyList_GET_ITEM(keys, i)
            if self.num_allocated < self.num_chunks:  # never-used ids first, then the last freed
                s = self.num_allocated
                self.num_allocated += 1
            else:
                self.num_free_stack -= 1
                s = self.free_stack[self.num_free_stack]
            self._index_add(key, s, self.hbuf[i])
            c = &self.sl[s]
            c.ref_cnt = -1
            c.major = rank
            c.minor = <int32_t>(-(first + i + 1) * tpc)  # (prepare_store checked it fits: _minor)
            acc.note(first + i, s)
            ids[k] = s
            k += 1
            if num_to_store != n:
                to_store.append(key)
        self.num_write_pending += num_to_store
        self.chunks_stored += num_to_store
        self.allocations += 1
        return PrepareStoreOutput(to_store, evicted if evicted is not None else [], chunk_ids)

    def complete_store(self, keys, chunks=None) -> None:
        """Make the chunks of a finished store ready and evictable; ``chunks``: the ids of its
        ``PrepareStoreOutput`` (still pending: no lookup needed)."""
        cdef list key_list = keys if isinstance(keys, list) else list(keys)
        cdef int32_t s
        cdef int* slots = NULL
        cdef list ready
        cdef Py_ssize_t i, n = len(key_list)
        cdef bint fast = isinstance(chunks, array.array) and n > 0 and len(chunks) == n
        cdef int64_t grank
        cdef _Group g
        if fast:  # (prepare_store's array of ids)
            slots = (<array.array>chunks).data.as_ints
            for i in range(n):
                APC_PREFETCH(&self.sl[slots[i]])
            for i in range(n):
                if self.sl[slots[i]].ref_cnt >= 0:
                    fast = False
                    break
        if fast:  # (one request's store: its chunks go on its stack, chunk_table_groups.pxi)
            grank = self.sl[slots[0]].major
            g = _group_of(self, grank)
            i = 0
            while i < n:
                s = slots[i]
                self.sl[s].ref_cnt = 0
                self.num_evictable += 1
                _push_stored(self, s, g if self.sl[s].major == grank else None)
                i = _stack_run(self, g, slots, i + 1, n, grank)  # (those that follow it on the stack)
            if g.alive:
                _group_top(self, g)
            self.num_write_pending -= len(key_list)
            if self.events is not None:
                self.events.append((False, key_list))
            return
        ready = []
        for key in key_list:
            s = self._slot(key)
            if s >= 0 and self.sl[s].ref_cnt < 0:
                self.sl[s].ref_cnt = 0
                self.num_evictable += 1
                self.num_write_pending -= 1
                self._push(s)
                ready.append(key)
        if ready and self.events is not None:
            self.events.append((False, ready))

    # -- finish -------------------------------------------------------------------------------
    def on_request_finished(self, ctx) -> None:
        """Commit the finished request's accesses (once): each observed resident key gets a fresh
        rank, tail first and head last (vLLM ``LRUCachePolicy.on_request_finished``)."""
        acc = ctx.access
        if not isinstance(acc, _Access) or (<_Access>acc).finished:
            return
        (<_Access>acc).finished = True
        _group_drop(self, (<_Access>acc).rank)
        cdef list seen = (<_Access>acc).seen
        cdef int32_t* known = (<_Access>acc).slots
        cdef Py_ssize_t i, cap = (<_Access>acc).cap
        cdef int32_t s
        cdef PyObject* key  # (borrowed from seen, which holds it: no reference taken per key)
        for i in range(min(cap, PyList_GET_SIZE(seen))):
            if known[i] >= 0:
                APC_PREFETCH(&self.sl[known[i]])
        for i in range(PyList_GET_SIZE(seen) - 1, -1, -1):
            key = PyList_GET_ITEM(seen, i)
            if key == <PyObject*>None:
                continue
            s = known[i] if i < cap else -1
            # (the chunk it had when observed, if that chunk still holds this very key: a key is
            # held by one chunk at most, so no probe is needed)
            if s < 0 or self.sl[s].key != key:
                s = self._slot(<object>key)
                if s < 0:
                    continue
            _rerank_fresh(self, s)

    # -- queries ------------------------------------------------------------------------------
    def num_free_chunks(self) -> int:
        """Query: never-used plus freed chunks."""
        return self.num_free_stack + self.num_chunks - self.num_allocated

    def num_resident(self) -> int:
        """Query: chunks holding a key (ready or not)."""
        return self.num_allocated - self.num_free_stack

    def usage(self) -> float:
        """Query: vLLM's CPU cache usage gauge -- resident chunks not evictable, over capacity."""
        return <double>(self.num_allocated - self.num_free_stack - self.num_evictable) / self.num_chunks

    @property
    def stats(self):
        """Query: the cumulative counters (a fresh ``ManagerStats``)."""
        return ManagerStats(chunks_stored=self.chunks_stored, chunks_evicted=self.chunks_evicted,
                            chunks_loaded=self.chunks_loaded, stores_skipped=0, allocations=self.allocations)

    @property
    def policy(self):
        """Query: this table, read as a policy (``get``, ``keys``)."""
        return self

    def get(self, key):
        """Query: a ``ChunkStatus`` copy of ``key``'s chunk (id and ref_cnt), or None."""
        cdef int32_t s = self._slot(key)
        if s < 0:
            return None
        chunk = ChunkStatus(s)
        chunk.ref_cnt = self.sl[s].ref_cnt
        return chunk

    def keys(self) -> list:
        """Query: every resident key."""
        return [k for k in self._slot_keys() if k is not None]

    @property
    def ranks(self) -> dict:
        """Query: every resident key's LRU rank, in vLLM's numbering."""
        return {k: (self.sl[s].major, self.sl[s].minor) for s, k in enumerate(self._slot_keys()) if k is not None}

    def eviction_order(self) -> list:
        """Query: the evictable keys, next victim first."""
        ranks = self.ranks
        keys = [k for s, k in enumerate(self._slot_keys()) if k is not None and self.sl[s].ref_cnt == 0]
        return sorted(keys, key=ranks.__getitem__)

    def check_integrity(self) -> None:
        """Query: the index and the chunk ids agree, the counters count, and every evictable chunk
        has exactly one live heap entry."""
        cdef Py_ssize_t i
        slot_keys = self._slot_keys()
        held = [self.tbl[i].slot for i in range(self.tbl_mask + 1) if self.tbl[i].slot >= 0]
        assert len(held) == len(set(held)) == self.num_resident(), (len(held), self.num_resident())
        for s in held:
            key = slot_keys[s]
            assert key is not None and self._slot(key) == s, "the key table does not find a chunk's key"
        free_ids = [self.free_stack[i] for i in range(self.num_free_stack)]
        assert all(slot_keys[s] is None for s in free_ids) and len(set(free_ids)) == len(free_ids)
        resident = [s for s in range(self.num_allocated) if slot_keys[s] is not None]
        assert self.num_evictable == sum(1 for s in resident if self.sl[s].ref_cnt == 0)
        assert self.num_write_pending == sum(1 for s in resident if self.sl[s].ref_cnt == -1)
        entries = [self.heap.data[i] for i in range(self.heap.size)]
        entries += [self.fifo[i] for i in range(self.fifo_head, self.fifo_tail)] + _group_entries(self)
        live = [e for e in entries if self.sl[<int32_t>e["slot"]].version == e["version"]
                and self.sl[<int32_t>e["slot"]].ref_cnt == 0 and slot_keys[e["slot"]] is not None]
        assert sorted(e["slot"] for e in live) == sorted(s for s in resident if self.sl[s].ref_cnt == 0), "entries are off"
        assert all((e["major"], e["minor"]) == (self.sl[<int32_t>e["slot"]].major, self.sl[<int32_t>e["slot"]].minor)
                   for e in live)
        fifo = [(self.fifo[i].major, self.fifo[i].minor) for i in range(self.fifo_head, self.fifo_tail)]
        assert fifo == sorted(fifo), "the FIFO is out of order"
