# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled CPU tier under LRU (mirrors vLLM 0.33.0's ``CPUOffloadingManager``,
``v1/kv_offload/cpu/manager.py``, with its ``LRUCachePolicy``, ``cpu/policies/lru.py``, and no
``store_threshold``): the same calls, chunk ids, victims and counters as
:class:`sim.core.offload.manager.CPUOffloadingManager` over ``LRUCachePolicy`` -- its oracle
(``tests/test_offload_chunk_table.py`` drives both with the same random calls) -- with the chunks'
state in C arrays indexed by chunk id instead of one Python object per chunk.

* a chunk slot is one 32-byte record (``Slot``: a chunk's operations touch one cache line, the
  cost that dominates at ~50,000 chunks) holding its key (a reference owned by the table),
  ``ref_cnt`` (-1 being stored, 0 evictable, > 0 pinned by loads), its LRU rank ``(major, minor)``
  (``minor`` in 32 bits), its entries' version and its key's table hash (an eviction finds the
  bucket without reading the key, a cold object by then); an open-addressing table (linear
  probing, at most half full, deletion by backward shift) maps a key's hash to its chunk id, a hit
  confirmed by comparing the key itself (the same object, usually);
* eviction takes the smallest ranks among the evictable, unprotected chunks, as vLLM's lazy
  min-heap pops them: here a C binary heap of ``(major, minor, chunk id, version)`` where only an
  entry whose version is its chunk's latest push counts (a rank change or a new readiness pushes
  again; stale entries are skipped when popped, the heap is rebuilt when they outnumber the live),
  beside a FIFO of finish ranks and, per running request, a stack of its completed stores that its
  finish drops whole (``chunk_table_groups.pxi``: every entry on it is stale by then);
* ranks are vLLM's numbers: a request's rank at its first access, ``(rank, -position)`` for the
  chunks it inserts or touches first (a touch only raises a rank), fresh ``(next_rank + 1, 0)``
  per resident key at its finish, tail first and head last;
* a request's access record is the chunk indices it observed (first time only): its keys are
  slices of the connector's key list, so each call names the index of its first key (``first``)
  and a key's position is ``(index + 1) * tokens_per_chunk``; a request's keys are distinct (each
  hashes its whole prefix), and the finish re-ranks its observed keys by descending index, which
  is vLLM's ``reversed(order_request_keys(...))``;
* freed chunk ids are reused last-freed first, after the never-used ones (``_free_list.pop()``);
  an offer's chunk ids come back as one ``array('i')`` (no Python int per chunk);
* the per-chunk loops over many chunks fetch ahead what their next pass reads (``APC_PREFETCH``:
  an offer's buckets, the victims' records, keys and buckets), so the cache misses overlap.

Built by setuptools (``pip install -e .``); :mod:`sim.core.offload.manager_impl` uses the Python
manager when this module is not built. Imports neither simpy nor torch.
"""

cimport cython
from cpython cimport array
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy, memmove
from libc.stdlib cimport free, malloc, qsort, realloc

import array

from sim.core.offload.manager import LookupResult, ManagerStats, PrepareStoreOutput
from sim.core.offload.policy import ChunkStatus


_MISS, _HIT, _PENDING = LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING
cdef array.array _IDS = array.array("i")  # the template of an offer's chunk ids


cdef struct Entry:
    int64_t major
    int64_t minor
    int32_t slot
    int32_t version


cdef struct Slot:  # one chunk (module docstring)
    int64_t major
    PyObject* key  # owned; NULL: free
    int32_t minor  # (-position: _minor checks it fits)
    int32_t ref_cnt
    int32_t version
    uint32_t hash  # its key's table hash (its bucket's)


cdef struct Bucket:  # a key table entry: chunk id (-1: empty) and 32 bits of its key's hash, one load
    int32_t slot
    uint32_t hash


include "chunk_table_keys.pxi"
include "chunk_table_groups.pxi"


cdef class _TableCore:
    """The C state of the LRU tier and its primitive operations (the heap, the access records);
    :class:`LRUChunkTable` (``chunk_table_ops.pxi``) builds the manager's calls on them."""

    cdef readonly int num_chunks
    cdef readonly int num_allocated
    cdef readonly long num_evictable
    cdef readonly long num_write_pending
    cdef int64_t tokens_per_chunk
    cdef int64_t next_rank
    cdef Bucket* tbl  # the key table
    cdef size_t tbl_mask
    cdef Slot* sl  # chunk id -> its record
    cdef char* protected
    cdef int32_t* free_stack
    cdef int num_free_stack
    cdef Heap heap
    cdef Entry* fifo  # [fifo_head, fifo_tail): entries in ascending rank, pushed in that order
    cdef Py_ssize_t fifo_head, fifo_tail, fifo_cap
    cdef int32_t* buf  # scratch: a call's chunk ids
    cdef uint32_t* hbuf  # scratch: a call's key hashes
    cdef Py_ssize_t buf_cap
    cdef long chunks_stored, chunks_evicted, chunks_loaded, allocations
    cdef Heap gheap  # the groups' tops (chunk_table_groups.pxi)
    cdef dict groups  # a running request's rank -> its _Group
    cdef list group_ids  # group id -> _Group (None: free)
    cdef list free_gids
    cdef list spare_groups  # dropped groups, their stacks kept for the next running request
    cdef Py_ssize_t group_entries
    cdef int32_t gseq
    cdef public object events  # (removed, keys) raw events while KV events are on, else None
    cdef public bint report_evictions  # False: ``evicted_keys`` left empty (nothing reads it)

    def __cinit__(self, int num_chunks, int tokens_per_chunk, bint report_evictions=True) -> None:
        if num_chunks < 1:
            raise ValueError(f"the CPU tier needs at least one chunk, got {num_chunks}")
        self.num_chunks = num_chunks
        self.tokens_per_chunk = tokens_per_chunk
        cdef size_t size = 16
        while size < 2 * <size_t>num_chunks:
            size *= 2
        self.tbl_mask = size - 1
        self.tbl = <Bucket*>malloc(size * sizeof(Bucket))
        self.sl = <Slot*>malloc(num_chunks * sizeof(Slot))
        self.protected = <char*>malloc(num_chunks)
        self.free_stack = <int32_t*>malloc(num_chunks * sizeof(int32_t))
        self.fifo_cap = 1024
        self.fifo = <Entry*>malloc(self.fifo_cap * sizeof(Entry))
        self.buf_cap = 1024
        self.buf = <int32_t*>malloc(self.buf_cap * sizeof(int32_t))
        self.hbuf = <uint32_t*>malloc(self.buf_cap * sizeof(uint32_t))
        if not (self.sl and self.protected and self.free_stack and self.fifo and self.buf and self.hbuf and self.tbl):
            raise MemoryError()
        cdef size_t i
        for i in range(size):
            self.tbl[i].slot = -1
        for i in range(num_chunks):
            self.sl[i].key = NULL
            self.sl[i].version = 0
            self.protected[i] = 0
        self.events = None
        self.report_evictions = report_evictions
        self.groups, self.group_ids, self.free_gids, self.spare_groups = {}, [], [], []

    def __dealloc__(self) -> None:
        cdef Py_ssize_t s
        if self.sl:
            for s in range(self.num_allocated):
                if self.sl[s].key:
                    Py_DECREF(<object>self.sl[s].key)
        free(self.gheap.data); free(self.heap.data)
        free(self.sl); free(self.protected); free(self.free_stack); free(self.fifo); free(self.buf); free(self.hbuf)
        free(self.tbl)

    # -- the entries: a FIFO of ascending ranks, the groups' stacks and a heap of the rest -------
    # A finish gives fresh ranks, larger than every rank before: they are appended to the FIFO,
    # already in order, and popped from its head; a completed store out of the FIFO's order may go
    # on its request's stack instead (_push_stored, chunk_table_groups.pxi); the other entries (a
    # running request's rank, a load's unpin) go to the heap. The smallest of the FIFO's head, the
    # heap's top and the groups' tops is the next candidate (_pop_min).
    @cython.final
    cdef int _fifo_append(self, Entry e) except -1:
        if self.fifo_tail == self.fifo_cap:
            if self.fifo_head * 2 >= self.fifo_cap:  # the popped half: move the rest down
                self.fifo_tail -= self.fifo_head
                memmove(self.fifo, self.fifo + self.fifo_head, self.fifo_tail * sizeof(Entry))
                self.fifo_head = 0
            else:
                self.fifo_cap *= 2
                self.fifo = <Entry*>realloc(self.fifo, self.fifo_cap * sizeof(Entry))
                if not self.fifo:
                    raise MemoryError()
        self.fifo[self.fifo_tail] = e
        self.fifo_tail += 1
        return 0

    @cython.final
    cdef inline Py_ssize_t _num_entries(self) noexcept:
        return self.heap.size + self.fifo_tail - self.fifo_head + self.group_entries

    @cython.final
    cdef inline bint _group_top_first(self) noexcept:
        """Query: the groups' heap top is below the FIFO's head and the heap's top."""
        cdef Entry* g = &self.gheap.data[0]
        return (self.fifo_head == self.fifo_tail or _less(g, &self.fifo[self.fifo_head])) and (
            self.heap.size == 0 or _less(g, &self.heap.data[0]))

    @cython.final
    cdef int _pop_min(self, Entry* out) except -1:
        """The smallest entry, removed into ``out`` (there must be one)."""
        # (the groups' heap top, live or stale, is at most every live group top: when it is not below
        # the FIFO's head and the heap's top, neither is any group, and _group_head's check is
        # skipped; after _group_head the top is live and is compared again)
        if (self.group_entries and self.gheap.size and self._group_top_first() and _group_head(self)
                and self._group_top_first()):
            return _group_pop(self, out)
        if self.fifo_head < self.fifo_tail and (
            self.heap.size == 0 or _less(&self.fifo[self.fifo_head], &self.heap.data[0])
        ):
            out[0] = self.fifo[self.fifo_head]
            self.fifo_head += 1
            if self.fifo_head == self.fifo_tail:
                self.fifo_head = self.fifo_tail = 0
            return 0
        out[0] = _heap_pop(&self.heap)
        return 0

    @cython.final
    cdef inline Entry _entry(self, int32_t s) noexcept:
        """``s``'s entry at its current rank, its version renewed (the only live one from now)."""
        cdef Entry e
        cdef Slot* c = &self.sl[s]
        c.version += 1
        e.major, e.minor, e.slot, e.version = c.major, c.minor, s, c.version
        return e

    @cython.final
    cdef int _push(self, int32_t s) except -1:
        """``s`` is evictable at its current rank: its entry (the only live one from now), on the
        FIFO when it goes there in order, else on the heap (``_push_stored`` with no group)."""
        return _push_stored(self, s, None)

    cdef int _rebuild(self) except -1:
        """Drop the stale entries: one live entry per evictable chunk, sorted into the FIFO."""
        cdef Py_ssize_t i, n = 0
        cdef Entry e
        if self.fifo_cap < self.num_evictable:
            self.fifo_cap = self.num_evictable
            self.fifo = <Entry*>realloc(self.fifo, self.fifo_cap * sizeof(Entry))
            if not self.fifo:
                raise MemoryError()
        for i in range(self.num_allocated):
            if self.sl[i].ref_cnt == 0 and self.sl[i].key:
                e.major, e.minor, e.slot, e.version = self.sl[i].major, self.sl[i].minor, <int32_t>i, self.sl[i].version
                self.fifo[n] = e
                n += 1
        qsort(self.fifo, n, sizeof(Entry), _compare)
        self.fifo_head, self.fifo_tail, self.heap.size = 0, n, 0
        _groups_clear(self)
        return 0

    @cython.final
    cdef inline bint _live(self, Entry* e) noexcept:
        cdef Slot* c = &self.sl[e.slot]
        return c.version == e.version and c.ref_cnt == 0 and c.key != NULL

    # -- helpers ------------------------------------------------------------------------------
    cdef inline object _key(self, Py_ssize_t s):
        """Query: chunk ``s``'s key, or None."""
        return None if self.sl[s].key == NULL else <object>self.sl[s].key

    def _slot_keys(self) -> list:
        """Query: chunk id -> its key (None: free)."""
        return [self._key(s) for s in range(self.num_chunks)]

    @cython.final
    cdef inline int32_t _slot(self, object key) except -2:
        """Query: ``key``'s chunk id, or -1."""
        return self._slot_h(key, <uint32_t>_key_hash(key))

    @cython.final
    cdef int32_t* _slots(self, list keys) except NULL:
        """Query: every key's chunk id (or -1) into the scratch buffer ``buf``, returned, their hashes
        into ``hbuf`` (``_scratch`` sizes both): the hashes first, each key's bucket fetched ahead,
        then the probes -- the buckets' cache misses overlap instead of following one another."""
        cdef Py_ssize_t i, n = PyList_GET_SIZE(keys)
        cdef int32_t* out = self._scratch(n)
        cdef uint32_t h
        for i in range(n):
            h = <uint32_t>_key_hash(<object>PyList_GET_ITEM(keys, i))
            self.hbuf[i] = h
            APC_PREFETCH(&self.tbl[<size_t>h & self.tbl_mask])
        for i in range(n):
            out[i] = self._slot_h(<object>PyList_GET_ITEM(keys, i), self.hbuf[i])
        return out

    @cython.final
    cdef inline int32_t _slot_h(self, object key, uint32_t h) except -2:
        """Query: ``key``'s chunk id, or -1 (``h``: its hash)."""
        cdef size_t i = <size_t>h & self.tbl_mask
        cdef int32_t s
        cdef PyObject* other
        while True:
            s = self.tbl[i].slot
            if s < 0:
                return -1
            if self.tbl[i].hash == h:
                other = self.sl[s].key
                if other == <PyObject*>key or <object>other == key:
                    return s
            i = (i + 1) & self.tbl_mask

    @cython.final
    cdef int _index_add(self, object key, int32_t s, uint32_t h) except -1:
        """``key`` (absent; ``h``: its hash) is now held by chunk ``s`` (the table takes a reference)."""
        cdef size_t i = <size_t>h & self.tbl_mask
        while self.tbl[i].slot >= 0:
            i = (i + 1) & self.tbl_mask
        self.tbl[i].slot, self.tbl[i].hash = s, h
        Py_INCREF(key)
        self.sl[s].key = <PyObject*>key
        self.sl[s].hash = h
        return 0

    @cython.final
    cdef int _index_del(self, int32_t s) except -1:
        """Chunk ``s``'s key leaves the table (and its reference); the entries after it in its probe
        run move back where their own probe would find them first."""
        cdef size_t mask = self.tbl_mask, i = <size_t>self.sl[s].hash & mask, j, home
        cdef PyObject* key = self.sl[s].key
        while self.tbl[i].slot != s:
            i = (i + 1) & mask
        j = i
        while True:
            j = (j + 1) & mask
            if self.tbl[j].slot < 0:
                break
            home = <size_t>self.tbl[j].hash & mask
            if ((j - home) & mask) < ((j - i) & mask):
                continue  # (its home lies after the hole: it stays)
            self.tbl[i] = self.tbl[j]
            i = j
        self.tbl[i].slot = -1
        self.sl[s].key = NULL
        Py_DECREF(<object>key)
        return 0

    cdef int32_t* _scratch(self, Py_ssize_t n) except NULL:
        if n > self.buf_cap:
            self.buf_cap = max(n, 2 * self.buf_cap)
            self.buf = <int32_t*>realloc(self.buf, self.buf_cap * sizeof(int32_t))
            self.hbuf = <uint32_t*>realloc(self.hbuf, self.buf_cap * sizeof(uint32_t))
            if not (self.buf and self.hbuf):
                raise MemoryError()
        return self.buf

    cdef _Access _access(self, object ctx):
        acc = ctx.access
        if acc is None:
            acc = _Access()
            ctx.access = acc
        return <_Access?>acc

    cdef int64_t _rank(self, _Access acc):
        """The request's rank, taken at its first access (vLLM ``_get_request_rank``)."""
        if acc.rank == 0:
            self.next_rank += 1
            acc.rank = self.next_rank
        return acc.rank

    cdef bint _see(self, _Access acc, Py_ssize_t i, object key) except -1:
        """Record chunk index ``i`` as observed; False when it already was."""
        cdef list seen = acc.seen
        cdef Py_ssize_t n = PyList_GET_SIZE(seen)
        if i == n:  # (the usual case: offers run head to tail)
            seen.append(key)
            return True
        if i > n:
            seen.extend([None] * (i - n))
            seen.append(key)
            return True
        if <object>PyList_GET_ITEM(seen, i) is not None:
            return False
        seen[i] = key
        return True

    @cython.final
    cdef inline bint _seen(self, _Access acc, Py_ssize_t i) noexcept:
        return i < PyList_GET_SIZE(acc.seen) and <object>PyList_GET_ITEM(acc.seen, i) is not None

    @cython.final
    cdef int32_t _minor(self, Py_ssize_t index) except? -1:
        """Chunk index ``index``'s minor rank (minus its end position), checked to fit 32 bits."""
        cdef int64_t pos = (index + 1) * self.tokens_per_chunk
        if pos > 0x7FFFFFFF:
            raise OverflowError(f"a chunk ending at token {pos} is past the CPU tier's 2**31 - 1 tokens")
        return <int32_t>-pos

    @cython.final
    cdef int _touch(self, int32_t s, int64_t rank, int64_t minor) except -1:
        """vLLM ``on_request_access`` of one resident key: a touch only raises its rank."""
        cdef Slot* c = &self.sl[s]
        if c.major > rank or (c.major == rank and c.minor >= minor):
            return 0
        c.major, c.minor = rank, <int32_t>minor
        if c.ref_cnt == 0:
            self._push(s)
        return 0


include "chunk_table_group_ops.pxi"
include "chunk_table_ops.pxi"
include "chunk_table_evict.pxi"
