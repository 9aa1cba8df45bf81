"""The groups' operations on the table (included by ``chunk_table.pyx``; see
``chunk_table_groups.pxi``)."""


cdef int _group_top(_TableCore t, _Group g) except -1:
    """``g``'s top changed: its new live entry in the groups' heap (none when it is empty)."""
    cdef Entry e
    t.gseq += 1
    g.version = t.gseq
    if g.n:
        e = g.stack[g.n - 1]
        e.slot, e.version = g.gid, g.version
        _heap_push(&t.gheap, e)
    return 0


cdef inline int _push_stored(_TableCore t, int32_t s, _Group g) except -1:
    """``s`` (a completed store) is evictable at its rank: on the FIFO when it goes there in order,
    else on its request's stack ``g`` when below its top, else on the heap (``_TableCore._push``:
    ``g`` None)."""
    cdef Entry e = t._entry(s)
    if t.fifo_head == t.fifo_tail or not _less(&e, &t.fifo[t.fifo_tail - 1]):
        t._fifo_append(e)
    elif g is not None and g.alive and (g.n == 0 or _less(&e, &g.stack[g.n - 1])):
        g.append(e)  # (its caller renews the group's top once per store: _group_top)
        t.group_entries += 1
    else:
        _heap_push(&t.heap, e)
    if t._num_entries() >= 2 * t.num_evictable + 64:
        t._rebuild()
    return 0


cdef Py_ssize_t _stack_run(_TableCore t, _Group g, int* slots, Py_ssize_t i, Py_ssize_t n,
                           int64_t grank) except -1:
    """``complete_store``'s chunks ``slots[i:n]`` (pending, of one store) made ready and pushed on
    ``g``'s stack while each goes there as ``_push_stored`` would put it -- its request's rank
    ``grank``, not the FIFO's, below the stack's top -- in one pass; returns the index of the first
    that does not (the caller pushes it the general way). The rebuild check is not needed here:
    each push adds one entry and one evictable chunk, so the stale entries' share only falls."""
    cdef Slot* c
    cdef Entry e
    if not g.alive or i >= n:
        return i
    g.reserve(g.n + n - i)
    while i < n:
        c = &t.sl[slots[i]]
        if c.major != grank:
            break
        e.major, e.minor, e.slot, e.version = c.major, c.minor, slots[i], c.version + 1
        if t.fifo_head == t.fifo_tail or not _less(&e, &t.fifo[t.fifo_tail - 1]):
            break  # (the FIFO would take it)
        if g.n and not _less(&e, &g.stack[g.n - 1]):
            break  # (not below the top: the heap would take it)
        c.version += 1
        c.ref_cnt = 0
        t.num_evictable += 1
        g.stack[g.n] = e
        g.n += 1
        t.group_entries += 1
        i += 1
    return i


cdef inline int _rerank_fresh(_TableCore t, int32_t s) except -1:
    """A finish's fresh rank for chunk ``s`` (``on_request_finished``): the largest rank yet, so an
    evictable chunk's entry goes to the FIFO's tail, as ``_push_stored`` would put it."""
    cdef Slot* c = &t.sl[s]
    cdef Entry e
    t.next_rank += 1
    c.major, c.minor = t.next_rank, 0
    if c.ref_cnt == 0:
        c.version += 1
        e.major, e.minor, e.slot, e.version = c.major, 0, s, c.version
        if t.fifo_tail < t.fifo_cap:
            t.fifo[t.fifo_tail] = e
            t.fifo_tail += 1
        else:
            t._fifo_append(e)
        if t._num_entries() >= 2 * t.num_evictable + 64:
            t._rebuild()
    return 0


cdef _Group _group_of(_TableCore t, int64_t rank):
    """The stack of the running request whose rank is ``rank`` (made on its first completed store)."""
    g = t.groups.get(rank)
    if g is None:
        # (a dropped group's stack is reused: growing a fresh one by doubling cost a realloc and a
        # copy per doubling for every running request that stores)
        g = t.spare_groups.pop() if t.spare_groups else _Group()
        (<_Group>g).n = 0
        (<_Group>g).alive = True
        if t.free_gids:
            (<_Group>g).gid = t.free_gids.pop()
            t.group_ids[(<_Group>g).gid] = g
        else:
            (<_Group>g).gid = len(t.group_ids)
            t.group_ids.append(g)
        t.groups[rank] = g
    return <_Group>g


cdef int _group_drop(_TableCore t, int64_t rank) except -1:
    """The request of ``rank`` finished: its stack's entries are all stale (module docstring)."""
    g = t.groups.pop(rank, None)
    if g is None:
        return 0
    t.group_entries -= (<_Group>g).n
    (<_Group>g).alive = False
    t.group_ids[(<_Group>g).gid] = None
    t.free_gids.append((<_Group>g).gid)
    t.spare_groups.append(g)
    return 0


cdef int _groups_clear(_TableCore t) except -1:
    """Every group dropped (a rebuild keeps one entry per evictable chunk in the FIFO)."""
    for g in t.group_ids:
        if g is not None:
            (<_Group>g).alive = False
    t.groups.clear()
    t.group_ids.clear()
    t.free_gids.clear()
    t.gheap.size = 0
    t.group_entries = 0
    return 0


cdef bint _group_head(_TableCore t) except -1:
    """Drop the groups' heap's stale entries from its top; True when a live one remains."""
    cdef Entry* top
    while t.gheap.size:
        top = &t.gheap.data[0]
        g = t.group_ids[top.slot] if top.slot < len(t.group_ids) else None
        if g is not None and (<_Group>g).version == top.version:
            return True
        _heap_pop(&t.gheap)
    return False


cdef int _group_pop(_TableCore t, Entry* out) except -1:
    """The top of the group whose top is smallest (``_group_head`` found it live), removed into ``out``."""
    cdef Entry e
    cdef _Group g = <_Group>t.group_ids[t.gheap.data[0].slot]
    g.n -= 1
    t.group_entries -= 1
    out[0] = g.stack[g.n]
    t.gseq += 1
    g.version = t.gseq
    if g.n:  # (its next top takes its entry's place at the heap's top: one sift-down, not a pop and a push)
        e = g.stack[g.n - 1]
        e.slot, e.version = g.gid, g.version
        _heap_replace_top(&t.gheap, e)
    else:
        _heap_pop(&t.gheap)
    return 0


def _group_entries(_TableCore t) -> list:
    """Query: every entry on the groups' stacks (for ``check_integrity``)."""
    cdef _Group g
    cdef Py_ssize_t i
    out = []
    for g in t.group_ids:
        if g is not None:
            out += [g.stack[i] for i in range(g.n)]
    return out
