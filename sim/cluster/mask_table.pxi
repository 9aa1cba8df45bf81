"""A hash -> bitmask table in C (included by ``compiled_index.pyx`` and ``compiled_active.pyx``):
the one layout both keep, a 64-bit hash mapped to the bitmask of the replicas (or workers) that
hold it -- the KV-event index's hash -> replicas (llm-d's ``kvblock`` index, Dynamo's
``KvIndexer``) and the active blocks' hash -> workers (Dynamo's ``sequences``).

Open addressing, linear probing, power-of-two size; each slot is (key, mask), 16 bytes, and is
empty when its mask is 0 (a hash is in the table while some bit of it is set). The key is the hash
MIXED (SplitMix64's finaliser, ``_mix``: a bijection of 64-bit words, so two keys are equal iff
their hashes are), and a key's home slot is its low bits: no hash pattern clusters the probes, and
the moves of a deletion and of a rebuild read a slot's home from the slot, without mixing again.
The functions below take mixed keys; a caller mixes each hash once (``_mt_start``/``_mt_next``
mix a run of hashes ``RING`` ahead of their turn and fetch their home slots meanwhile: each is a
cache miss in a table larger than the caches). A hash whose last bit goes leaves by backward-shift
deletion (Knuth's algorithm R: the entries after it in its probe run move up when their home
allows), so no tombstone lengthens later probes and constant insert/delete churn never forces a
rebuild; the table is rebuilt (to at least four times the live count) only when the live hashes
pass half its size, or after a bit is cleared everywhere.

A table of 2 MiB or more has its own mapping, aligned to 2 MiB and advised to the kernel for huge
pages (``madvise(MADV_HUGEPAGE)``, Linux; the default ``transparent_hugepage=madvise`` gives them
only to memory that asks): a fleet's index is tens of MiB probed at random, and with 4 KiB pages
nearly every probe missed the TLB too (its page walk stalled the very prefetch meant to hide the
miss). Elsewhere, or below 2 MiB, plain ``calloc``; both are zeroed, both freed by ``_mt_free``
(``sim/core/huge_pages.pxi``, shared with the compiled pool's key table).
"""

from cpython cimport array as carray
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport uint64_t
from libc.stdlib cimport realloc

cdef extern from *:
    void __builtin_prefetch(const void* addr) nogil  # (GCC/Clang: a hint, never a fault)

include "../core/huge_pages.pxi"  # apc_huge_alloc / apc_huge_free (shared with the compiled pool)

cdef struct Slot:
    uint64_t key   # the hash, mixed (_mix)
    uint64_t mask

cdef enum:
    RING = 16  # hashes mixed and fetched ahead of their turn (a power of two: _mt_next)

cdef struct MaskTable:
    Slot* slots
    Py_ssize_t cap   # a power of two
    Py_ssize_t live  # slots with a nonzero mask


cdef carray.array _MT_WORDS = carray.array("Q")  # the template of _mt_words' arrays


cdef carray.array _mt_words(object hashes):
    """``hashes`` as an ``array('Q')``, the C words both tables' callers read in place: an
    ``array('Q')`` itself (another array: TypeError), else the ints of a list (or any iterable)
    converted one by one (``array('Q', ints)`` converts each int by the general byte-array path,
    several times slower)."""
    cdef list hs
    cdef carray.array out
    cdef Py_ssize_t i, n
    if type(hashes) is carray.array:
        if (<carray.array>hashes).ob_descr.typecode != b'Q':
            raise TypeError(f"hashes as an array are an array('Q'), got typecode {hashes.typecode!r}")
        return <carray.array>hashes
    hs = hashes if type(hashes) is list else list(hashes)
    n = PyList_GET_SIZE(hs)
    out = carray.clone(_MT_WORDS, n, False)
    for i in range(n):
        out.data.as_ulonglongs[i] = <uint64_t>(<object>PyList_GET_ITEM(hs, i))
    return out


cdef int _mt_reserve(void** buf, Py_ssize_t* cap, Py_ssize_t n, size_t item) except -1:
    """A caller's scratch ``buf[0]`` (``cap[0]`` items of ``item`` bytes) holds at least ``n`` items:
    grown by doubling from 256 (``realloc``: what it held is kept), ``cap[0]`` updated."""
    cdef Py_ssize_t c = cap[0] if cap[0] else 256
    cdef void* p
    if n <= cap[0]:
        return 0
    while c < n:
        c *= 2
    p = realloc(buf[0], c * item)
    if p == NULL:
        raise MemoryError()
    buf[0] = p
    cap[0] = c
    return 0


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    x ^= x >> 30
    x *= <uint64_t>0xBF58476D1CE4E5B9
    x ^= x >> 27
    x *= <uint64_t>0x94D049BB133111EB
    x ^= x >> 31
    return x


cdef int _mt_init(MaskTable* t, Py_ssize_t initial_slots) except -1:
    """An empty table of ``initial_slots`` (rounded up to a power of two, at least 8)."""
    t.cap = 8
    while t.cap < initial_slots:
        t.cap *= 2
    t.slots = <Slot*>apc_huge_alloc(t.cap * sizeof(Slot))
    if t.slots == NULL:
        raise MemoryError()
    t.live = 0
    return 0


cdef void _mt_free(MaskTable* t) noexcept:
    """Release the table's slots (the owner's ``__dealloc__``)."""
    apc_huge_free(t.slots, t.cap * sizeof(Slot))
    t.slots = NULL


cdef inline void _mt_fetch(MaskTable* t, uint64_t key, bint deep) noexcept:
    """Hint: mixed ``key``'s home slot will be read soon; ``deep``: the next cache line too, for a
    run that deletes (a deletion's backward shift reads on to the end of the probe run: perf put
    most of a raw batch's time on those reads when only the home line was fetched ahead). A run
    that only probes (a prompt's match or acquire) fetches the home line alone: the line after it
    is rarely read there and only takes a fetch slot."""
    cdef Py_ssize_t m = t.cap - 1, i = <Py_ssize_t>(key & <uint64_t>m)
    __builtin_prefetch(&t.slots[i])
    if deep:  # (slot i + 4 always lies in the line after slot i's: 16-byte slots, 64-byte lines)
        __builtin_prefetch(&t.slots[(i + 4) & m])


cdef inline void _mt_start(MaskTable* t, uint64_t* ring, const uint64_t* hs, Py_ssize_t n, bint deep) noexcept:
    """Begin a run over the ``n`` hashes ``hs``: the first ``RING`` mixed into ``ring``, their home
    slots fetched (``deep``: see ``_mt_fetch``). Then ``_mt_next`` for ``i = 0, 1, ..., n - 1``,
    each once and in order, with the same ``deep``."""
    cdef Py_ssize_t j
    for j in range(n if n < RING else RING):
        ring[j] = _mix(hs[j])
        _mt_fetch(t, ring[j], deep)


cdef inline uint64_t _mt_next(MaskTable* t, uint64_t* ring, const uint64_t* hs, Py_ssize_t i,
                              Py_ssize_t n, bint deep) noexcept:
    """``hs[i]`` mixed (from ``ring``), after mixing ``hs[i + RING]`` into its place and fetching
    its home slot. Valid across a rebuild: a mixed key does not depend on the table's size."""
    cdef uint64_t key = ring[i & (RING - 1)]
    if i + RING < n:
        ring[i & (RING - 1)] = _mix(hs[i + RING])
        _mt_fetch(t, ring[i & (RING - 1)], deep)
    return key


cdef inline Py_ssize_t _mt_find(MaskTable* t, uint64_t key) noexcept:
    """The live slot of mixed ``key``, or -1."""
    cdef Py_ssize_t m = t.cap - 1
    cdef Py_ssize_t i = <Py_ssize_t>(key & <uint64_t>m)
    cdef Slot* s
    while True:
        s = &t.slots[i]
        if s.mask == 0:  # (an empty slot: a live hash has a bit set)
            return -1
        if s.key == key:
            return i
        i = (i + 1) & m


cdef int _mt_rebuild(MaskTable* t) except -1:
    """Rehash the live slots into a table of at least four times their count."""
    cdef Py_ssize_t cap = 8, old_cap = t.cap, i, j, m
    cdef Slot* old = t.slots
    cdef Slot* new
    while cap < 4 * (t.live + 1):
        cap *= 2
    new = <Slot*>apc_huge_alloc(cap * sizeof(Slot))
    if new == NULL:
        raise MemoryError()
    m = cap - 1
    for i in range(old_cap):
        if old[i].mask != 0:
            j = <Py_ssize_t>(old[i].key & <uint64_t>m)
            while new[j].mask != 0:
                j = (j + 1) & m
            new[j] = old[i]
    apc_huge_free(old, old_cap * sizeof(Slot))
    t.slots = new
    t.cap = cap
    return 0


cdef inline Slot* _mt_insert(MaskTable* t, uint64_t key) except NULL:
    """The live slot of mixed ``key``, made (mask 0: the caller sets a bit at once) when absent;
    may rebuild the table first."""
    cdef Py_ssize_t m, i
    cdef Slot* s
    if (t.live + 1) * 2 > t.cap:
        _mt_rebuild(t)
    m = t.cap - 1
    i = <Py_ssize_t>(key & <uint64_t>m)
    while True:
        s = &t.slots[i]
        if s.mask == 0:
            break
        if s.key == key:
            return s
        i = (i + 1) & m
    s.key = key
    s.mask = 0
    t.live += 1
    return s


cdef void _mt_delete_at(MaskTable* t, Py_ssize_t i) noexcept:
    """Empty slot ``i`` by backward shift: each later entry of the probe run moves into the hole
    when its home slot is not cyclically within (hole, entry], so every key stays reachable from
    its home without passing an empty slot."""
    cdef Py_ssize_t m = t.cap - 1, j = i, k
    while True:
        j = (j + 1) & m
        if t.slots[j].mask == 0:
            break
        k = <Py_ssize_t>(t.slots[j].key & <uint64_t>m)
        if (i < k <= j) if i <= j else (k > i or k <= j):
            continue  # its home lies after the hole: it must stay
        t.slots[i] = t.slots[j]
        i = j
    t.slots[i].mask = 0


cdef inline void _mt_drop_bit(MaskTable* t, Py_ssize_t i, uint64_t bit) noexcept:
    """Take ``bit`` off slot ``i``; the hash leaves the table with its last bit."""
    cdef Slot* s = &t.slots[i]
    s.mask &= ~bit
    if s.mask == 0:
        _mt_delete_at(t, i)
        t.live -= 1


cdef int _mt_clear_bit(MaskTable* t, uint64_t bit) except -1:
    """Take ``bit`` off every slot. A deletion would shift entries under the scan, so the slots
    are emptied in place and left out by one rebuild (when any emptied)."""
    cdef Py_ssize_t i, dropped = 0
    cdef Slot* s
    for i in range(t.cap):
        s = &t.slots[i]
        if s.mask & bit:
            s.mask &= ~bit
            if s.mask == 0:
                dropped += 1
    if dropped:
        t.live -= dropped
        _mt_rebuild(t)
    return 0
