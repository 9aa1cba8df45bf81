"""The table's eviction (included by ``chunk_table.pyx``): vLLM ``LRUCachePolicy.evict`` -- the
smallest ranks among the evictable, unprotected chunks -- over the FIFO, the heap and the groups'
stacks (``_TableCore._pop_min``), with the FIFO's head taken in runs: at block 16 most victims are
chunks whose request finished, whose fresh ranks the FIFO holds in order."""


cdef inline bint _fifo_run_next(_TableCore t) noexcept:
    """Query: the FIFO's head is the smallest entry, as ``_pop_min`` would find it, without looking
    at a group: it lies below the heap's top and strictly below the groups' heap top, live or stale
    (a stale top is at most every live group top; on a tie ``_pop_min`` decides)."""
    if t.fifo_head == t.fifo_tail:
        return False
    if t.heap.size and not _less(&t.fifo[t.fifo_head], &t.heap.data[0]):
        return False
    return not (t.group_entries and t.gheap.size and not _less(&t.fifo[t.fifo_head], &t.gheap.data[0]))


cdef bint _evict(_TableCore t, Py_ssize_t n, Py_ssize_t num_protected, list out) except -1:
    """Remove the ``n`` smallest-rank evictable, unprotected chunks (their keys appended to ``out``
    in eviction order unless ``out`` is None, their ids pushed on the free stack); False, and
    nothing changed, when there are fewer (vLLM ``evict``: protected entries are pushed back)."""
    cdef Entry* picked = <Entry*>malloc((n + num_protected + 1) * sizeof(Entry))
    if not picked:
        raise MemoryError()
    cdef Py_ssize_t i, num_picked = 0, num_deferred = 0
    cdef Entry e
    cdef int32_t s
    try:
        while num_picked < n and t._num_entries():
            if t.fifo_head + 8 < t.fifo_tail:  # (the FIFO's victims-to-be, fetched ahead)
                APC_PREFETCH(&t.sl[t.fifo[t.fifo_head + 8].slot])
            if _fifo_run_next(t):  # (nothing but the FIFO pops here: the heap and groups stay as they are)
                e = t.fifo[t.fifo_head]
                t.fifo_head += 1
                if t.fifo_head == t.fifo_tail:
                    t.fifo_head = t.fifo_tail = 0
            else:
                t._pop_min(&e)
            if not t._live(&e):
                continue
            if t.protected[e.slot]:  # kept at the end of the buffer
                picked[n + num_deferred] = e
                num_deferred += 1
                continue
            picked[num_picked] = e
            num_picked += 1
        for i in range(num_deferred):
            _heap_push(&t.heap, picked[n + i])
        if num_picked < n:
            for i in range(num_picked):
                _heap_push(&t.heap, picked[i])
            return False
        # (the victims' buckets fetched ahead, found by the hashes their records keep, and their
        # key objects, whose references the table gives back: cold by now)
        for i in range(n):
            APC_PREFETCH(&t.tbl[<size_t>t.sl[picked[i].slot].hash & t.tbl_mask])
            APC_PREFETCH(t.sl[picked[i].slot].key)
        for i in range(n):
            s = picked[i].slot
            if out is not None:
                out.append(<object>t.sl[s].key)
            t._index_del(s)
            t.free_stack[t.num_free_stack] = s
            t.num_free_stack += 1
        t.num_evictable -= n
        return True
    finally:
        free(picked)
