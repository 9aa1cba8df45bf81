"""The entries' order (``_less``), the key table's hash, the prefetch hint (``APC_PREFETCH``) and a
request's access record (included by ``chunk_table.pyx``)."""


cdef inline bint _less(const Entry* a, const Entry* b) noexcept nogil:
    return a.major < b.major or (a.major == b.major and a.minor < b.minor)


cdef int _compare(const void* a, const void* b) noexcept nogil:
    return -1 if _less(<const Entry*>a, <const Entry*>b) else (1 if _less(<const Entry*>b, <const Entry*>a) else 0)


cdef extern from *:
    """
    #define APC_PREFETCH(p) __builtin_prefetch((const void*)(p))
    """
    void APC_PREFETCH(const void* p) nogil  # (a hint: the line is loaded while other work goes on)


cdef uint64_t _GOLD = 0x9E3779B97F4A7C15, _M1 = 0xBF58476D1CE4E5B9, _M2 = 0x94D049BB133111EB


cdef inline Py_hash_t _key_hash(object key) except? -1:
    """The key table's hash of ``key``: a 16-byte key (every block hash the engine makes) mixed
    from its two words by splitmix64's finaliser -- Python's ``hash`` of a bytes object runs
    SipHash over it once per object, the costliest step of a store -- else Python's hash. Only
    this table reads it (a hit is confirmed by comparing the keys), so any spread will do."""
    cdef uint64_t a, b
    if PyBytes_CheckExact(key) and PyBytes_GET_SIZE(key) == 16:
        memcpy(&a, PyBytes_AS_STRING(key), 8)
        memcpy(&b, PyBytes_AS_STRING(key) + 8, 8)
        a ^= b * _GOLD
        a = (a ^ (a >> 30)) * _M1
        a = (a ^ (a >> 27)) * _M2
        return <Py_hash_t>((a ^ (a >> 31)) >> 1)
    return hash(key)


@cython.final
cdef class _Access:
    """One request's access record: ``seen[i]`` is its key at chunk index ``i`` once observed
    (None before), ``slots[i]`` that key's chunk id when last known (-1: none; the finish checks
    it by identity), ``rank`` its LRU rank (0: none yet), ``finished`` once committed."""

    cdef list seen
    cdef int32_t* slots
    cdef Py_ssize_t cap
    cdef int64_t rank
    cdef bint finished

    def __cinit__(self) -> None:
        self.seen = []
        self.slots = NULL
        self.cap = 0
        self.rank = 0
        self.finished = False

    def __dealloc__(self) -> None:
        free(self.slots)

    cdef int note(self, Py_ssize_t i, int32_t s) except -1:
        """Chunk index ``i``'s key is held by chunk ``s`` now."""
        cdef Py_ssize_t j, cap = self.cap
        if i >= cap:
            cap = max(i + 1, 2 * cap, 64)
            self.slots = <int32_t*>realloc(self.slots, cap * sizeof(int32_t))
            if not self.slots:
                raise MemoryError()
            for j in range(self.cap, cap):
                self.slots[j] = -1
            self.cap = cap
        self.slots[i] = s
        return 0
