"""The compiled pool's C layout (included by ``compiled_pool.pyx``): the 128-bit key digest,
the :class:`CompiledBlock` metadata object, the per-block ``Link`` and per-slot ``Slot`` records,
and the table and free-queue ring size rules. Invariant: a 16-byte key is its own digest; every
other key is folded to 128 bits and compared in full on a digest match."""

cdef extern from *:
    void __builtin_prefetch(const void* addr, ...) nogil

cdef int32_t NONE = -1
cdef int64_t NOT_FREE = -1  # the ring position of a block not in the free queue
cdef int64_t RING_BASE = 1LL << 40  # the first head position (pushes at the head count down)
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


cdef inline uint32_t _spread(uint64_t k0, uint64_t k1) noexcept nogil:
    """A digest's table hash: its home slot is the low bits (``& mask``), at every table size."""
    return <uint32_t>_mix(k0 ^ (k1 * GOLD))


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

    # (no __cinit__: a new object's C fields are zero and its key None; the pool makes its blocks
    # with _new_block, which skips the argument parsing of a call -- a fleet makes one per block)
    def __init__(self, int block_id):
        self.block_id = block_id

    @property
    def block_hash(self):
        return self._key

    def __repr__(self):
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self._key is not None})"


cdef inline CompiledBlock _new_block(int32_t block_id):
    """A new unused block (``CompiledBlock(block_id)`` without the call's argument parsing)."""
    cdef CompiledBlock blk = CompiledBlock.__new__(CompiledBlock)
    blk.block_id = block_id
    return blk


ctypedef struct Link:
    # one block's key links: its key's block list and its table slot
    int32_t hprev
    int32_t hnext
    int32_t slot
    int32_t pad


ctypedef struct Slot:
    # one table slot: the key's 128-bit digest and length (0: empty), its block list (never empty
    # in a used slot: an emptied key is deleted, see compiled_pool_index.pxi)
    uint64_t k0
    uint64_t k1
    int32_t klen
    int32_t head
    int32_t tail
    uint32_t spread  # _spread(k0, k1): the home slot is its low bits (a deletion reads it)


cdef int32_t _table_size(int num_gpu_blocks):
    """A power of two at least 2x the blocks: a cached block holds one key and an emptied key is
    deleted at once, so at most half the slots are used (linear probing stays short)."""
    cdef int32_t cap = 16
    while cap < 2 * num_gpu_blocks:
        cap *= 2
    return cap


cdef int32_t _ring_size(int num_gpu_blocks):
    """A power of two at least 2x the blocks: the free queue holds at most every block, so a full
    ring is at least half stale entries, and compacting it frees at least half of it."""
    cdef int32_t cap = 16
    while cap < 2 * num_gpu_blocks:
        cap *= 2
    return cap
