"""Running requests' stored chunks, kept per request (included by ``chunk_table.pyx``).

A store completes at the storing request's rank ``(rank, -position)``, and a request stores head to
tail, so its completed stores arrive in descending rank: a stack whose top is the request's smallest.
Its finish re-ranks every key it stored (they are among the keys it observed), so at that moment
every entry of its stack is stale: the stack is dropped whole instead of each entry being popped
from the shared heap one by one later. The groups' tops are ordered by a small heap of their own
(one live entry per non-empty group: ``slot`` the group id, ``version`` the group's version, drawn
from one counter so a reused group id never revives an old entry). The eviction order is unchanged:
it takes the smallest of the FIFO's head, the heap's top and the groups' tops (ranks are distinct)."""


cdef struct Heap:
    Entry* data
    Py_ssize_t size, cap


cdef int _heap_push(Heap* h, Entry e) except -1:
    cdef Py_ssize_t i, parent
    if h.size == h.cap:
        h.cap = 2 * h.cap if h.cap else 64
        h.data = <Entry*>realloc(h.data, h.cap * sizeof(Entry))
        if not h.data:
            raise MemoryError()
    i = h.size
    h.size += 1
    while i > 0:
        parent = (i - 1) >> 1
        if not _less(&e, &h.data[parent]):
            break
        h.data[i] = h.data[parent]
        i = parent
    h.data[i] = e
    return 0


cdef Entry _heap_pop(Heap* h) noexcept:
    cdef Entry top = h.data[0]
    cdef Entry last
    cdef Py_ssize_t i = 0, child, n
    h.size -= 1
    n = h.size
    if n:
        last = h.data[n]
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and _less(&h.data[child + 1], &h.data[child]):
                child += 1
            if not _less(&h.data[child], &last):
                break
            h.data[i] = h.data[child]
            i = child
        h.data[i] = last
    return top


cdef void _heap_replace_top(Heap* h, Entry e) noexcept:
    """The top replaced by ``e`` (``h`` not empty), sifted down: ``_heap_pop`` then ``_heap_push``
    in one pass."""
    cdef Py_ssize_t i = 0, child, n = h.size
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and _less(&h.data[child + 1], &h.data[child]):
            child += 1
        if not _less(&h.data[child], &e):
            break
        h.data[i] = h.data[child]
        i = child
    h.data[i] = e


cdef class _Group:
    """One running request's completed stores: ``stack[:n]`` in descending rank (top: the smallest)."""

    cdef Entry* stack
    cdef Py_ssize_t n, cap
    cdef int32_t gid, version
    cdef bint alive  # False once dropped (its request finished) or cleared by a rebuild

    def __cinit__(self) -> None:
        self.stack = NULL
        self.n = self.cap = 0

    def __dealloc__(self) -> None:
        free(self.stack)

    cdef int append(self, Entry e) except -1:
        if self.n == self.cap:
            self.reserve(self.n + 1)
        self.stack[self.n] = e
        self.n += 1
        return 0

    cdef int reserve(self, Py_ssize_t need) except -1:
        """Room for ``need`` entries (the capacity doubles, from 64)."""
        if need <= self.cap:
            return 0
        while self.cap < need:
            self.cap = 2 * self.cap if self.cap else 64
        self.stack = <Entry*>realloc(self.stack, self.cap * sizeof(Entry))
        if not self.stack:
            raise MemoryError()
        return 0
