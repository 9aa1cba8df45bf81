# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled active blocks: :class:`sim.cluster.active_blocks.ActiveBlocks` with its state in C
(mirrors the same product: ``ai-dynamo/dynamo`` ``lib/kv-router/src/sequences/``, Dynamo's
per-worker count of the prompt blocks its active requests hold).

Same answers, call for call, as the Python class, its oracle (a property test drives both with the
same random calls): ``acquire``, ``release``, ``clear``, ``num_active`` and ``overlaps``. Dynamo's
router asks, for every request, how many of the prompt's blocks each worker already holds active;
in Python that was a set intersection per worker (16 per request in a 16-replica fleet, half a
millisecond for a Mooncake prompt of 500 blocks), or a holder mask kept by a Python loop per block.
Here one pass over the prompt reads each hash's holder mask from a C table.

Layout: two open-addressing tables (linear probing, power-of-two sizes, keys mixed):

* ``holders``: hash -> the bitmask of the workers holding it (never 0: the last holder deletes it),
  ``mask_table.pxi``'s table, shared with ``sim.cluster.compiled_index``; a worker's bit stands for
  its first reference to the block. Up to ``FLAGGED`` workers, bit ``32 + w`` says that worker
  ``w`` holds it more than once (has an ``extra`` entry), so a release looks in ``extra`` only
  for those hashes (before: for every released hash while ``extra`` was not empty);
* ``extra``: (hash, worker) -> the worker's references beyond the first (never 0; tombstones for
  deletions, rebuilt when live plus tombstone slots pass half the size), for blocks that several
  active requests of one worker share (a common prefix).

Dynamo's logit per worker (``logits``: the formula of :meth:`sim.cluster.active_blocks.ActiveBlocks.logits`,
its oracle) is computed here in one call per request: the prompt's held blocks per worker in one pass
over its hashes, then the arithmetic per worker on C doubles, operation for operation as the Python
floats do it (IEEE double, same order; no fused multiply-add: the build targets no FMA unit), so the
logits -- and the choices made from them -- are equal, not close.

Hashes come as a list of ints or as an ``array('Q')`` (read in place: a request's hashes converted
once serve its logits, acquire and release). A prompt's hash counts once however often it occurs
(``overlaps`` of a list equals ``overlaps`` of its set): a found slot is marked with the mask's top
bit while the pass runs (no worker has it below 64 workers; with 64, the list is made a set first).

Invariants: the worker's reference count of ``h`` is 0 when bit ``w`` of ``holders[h]`` is clear,
else ``1 + extra.get((h, w), 0)``; ``_distinct[w]`` is the number of hashes with bit ``w`` set.
Hashes are unsigned 64-bit ints (vLLM's event form,
``sim.cluster.router.external_block_hashes``). Limits: at most 64 workers (one bit each);
``sim.cluster.active_blocks.make_active_blocks`` gives the Python class above that. Imports nothing
from the project.
"""

from cpython cimport array as carray
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport Py_SIZE, PyObject
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport calloc, free

include "mask_table.pxi"

cdef extern from *:
    int __builtin_ctzll(unsigned long long x) nogil  # (GCC/Clang: the lowest set bit's index)

cdef enum:
    EMPTY = 0
    LIVE = 1
    TOMB = 2

cdef struct Ref:
    uint64_t key
    uint32_t worker
    uint32_t count
    unsigned char state

MAX_WORKERS = 64
FLAGGED = 31  # fleets of up to this many workers flag multiple references in the holder masks

cdef uint64_t SEEN = (<uint64_t>1) << 63  # a found slot's mark during one pass (see the module docstring)


cdef inline uint64_t _ref_slot(uint64_t key, uint32_t worker) noexcept nogil:
    # (key: a hash mixed, as the holders table keeps it) a worker's copy of a hash lands elsewhere
    # than another worker's (the golden ratio apart)
    return _mix(key ^ ((<uint64_t>worker + 1) * <uint64_t>0x9E3779B97F4A7C15))


cdef class CompiledActiveBlocks:
    """Per-worker reference counts of active prompt blocks and each block's holder mask (see the
    module docstring)."""

    cdef Ref* _refs
    cdef Py_ssize_t _rcap, _rlive, _rused
    cdef MaskTable _h  # hash -> the workers holding it (mask_table.pxi)
    cdef int _n
    cdef uint64_t _hmask         # the holder bits of a mask (the flags and SEEN are above them)
    cdef Py_ssize_t _distinct[64]
    cdef carray.array _words     # the hashes _keys handed out last (kept: its buffer is read)
    cdef Py_ssize_t* _found      # scratch: the slots marked SEEN in one pass (see _held)
    cdef Py_ssize_t _bufcap

    def __cinit__(self, int num_workers, Py_ssize_t initial_slots=1024):
        """``initial_slots``: each table's first size (rounded up to a power of two, at least 8);
        the tests start small so that probing, tombstones and rebuilds happen within a few calls."""
        cdef int w
        if num_workers < 0 or num_workers > MAX_WORKERS:
            raise ValueError(f"the compiled active blocks hold 0 to {MAX_WORKERS} workers, got {num_workers}")
        self._n = num_workers
        self._hmask = ((<uint64_t>1) << num_workers) - 1 if num_workers < 64 else ~(<uint64_t>0)
        self._rcap = 8
        while self._rcap < initial_slots:
            self._rcap *= 2
        self._refs = <Ref*>calloc(self._rcap, sizeof(Ref))
        if self._refs == NULL:
            raise MemoryError()
        _mt_init(&self._h, initial_slots)
        self._found = NULL
        self._bufcap = 0
        self._rlive = self._rused = 0
        for w in range(64):
            self._distinct[w] = 0

    def __dealloc__(self):
        free(self._refs)
        _mt_free(&self._h)
        free(self._found)

    # -- a prompt's hashes as C words -----------------------------------------------------------
    def words(self, hashes):
        """The hashes as an ``array('Q')``, the form every method here reads in place (a request's
        hashes converted once serve its logits, acquire and release; ``mask_table.pxi``'s
        ``_mt_words``)."""
        return _mt_words(hashes)

    cdef const uint64_t* _keys(self, object hashes, Py_ssize_t* n) except NULL:
        """The hashes as C words (``words``), their count in ``n``: an ``array('Q')``'s own buffer,
        else a list's (or iterable's) ints converted first, so that the table slots of the hashes
        ahead can be fetched while one is handled (a prompt's hashes are random keys in a table
        larger than the caches: each is a miss). Valid until the next call (the array is kept)."""
        self._words = _mt_words(hashes)
        n[0] = Py_SIZE(self._words)
        return <const uint64_t*>self._words.data.as_ulonglongs if n[0] else <const uint64_t*>&SEEN

    cdef int _held(self, object hashes, Py_ssize_t* counts) except -1:
        """``counts[w]``: how many distinct hashes of ``hashes`` are active on worker ``w``."""
        cdef Py_ssize_t i, j, n, found = 0
        cdef uint64_t mask
        cdef uint64_t ring[RING]
        cdef const uint64_t* ks
        cdef int w
        for w in range(self._n):
            counts[w] = 0
        if self._n == 64 and type(hashes) is not set:  # (SEEN is worker 63's bit: a set dedupes)
            hashes = set(hashes)
        ks = self._keys(hashes, &n)
        _mt_reserve(<void**>&self._found, &self._bufcap, n if n else 1, sizeof(Py_ssize_t))
        _mt_start(&self._h, ring, ks, n, False)
        for i in range(n):
            j = _mt_find(&self._h, _mt_next(&self._h, ring, ks, i, n, False))
            if j < 0:
                continue
            mask = self._h.slots[j].mask & self._hmask
            if self._n < 64:
                if self._h.slots[j].mask & SEEN:
                    continue  # a repeated hash: counted once
                self._h.slots[j].mask |= SEEN
                self._found[found] = j
                found += 1
            while mask:
                counts[__builtin_ctzll(mask)] += 1
                mask &= mask - 1
        for i in range(found):  # (no deletion ran: the marked slots are where they were)
            self._h.slots[self._found[i]].mask &= ~SEEN
        return 0

    # -- the (hash, worker) -> extra references table ---------------------------------------------------------
    cdef Ref* _ref_insert(self, uint64_t key, uint32_t worker) except NULL:
        """The live slot of ``(key, worker)``, made (count 0) when absent; may rebuild first."""
        cdef Py_ssize_t m, i, tomb = -1
        cdef Ref* s
        if (self._rused + 1) * 2 > self._rcap:
            self._ref_rebuild()
        m = self._rcap - 1
        i = <Py_ssize_t>(_ref_slot(key, worker) & <uint64_t>m)
        while True:
            s = &self._refs[i]
            if s.state == EMPTY:
                break
            if s.state == LIVE and s.key == key and s.worker == worker:
                return s
            if s.state == TOMB and tomb < 0:
                tomb = i
            i = (i + 1) & m
        if tomb >= 0:  # reuse the first tombstone on the probe path (the key is not further on)
            s = &self._refs[tomb]
        else:
            self._rused += 1
        s.key = key
        s.worker = worker
        s.count = 0
        s.state = LIVE
        self._rlive += 1
        return s

    cdef Ref* _ref_find(self, uint64_t key, uint32_t worker) noexcept:
        """The live slot of ``(key, worker)``, or NULL."""
        cdef Py_ssize_t m = self._rcap - 1
        cdef Py_ssize_t i = <Py_ssize_t>(_ref_slot(key, worker) & <uint64_t>m)
        cdef Ref* s
        while True:
            s = &self._refs[i]
            if s.state == EMPTY:
                return NULL
            if s.state == LIVE and s.key == key and s.worker == worker:
                return s
            i = (i + 1) & m

    cdef int _ref_rebuild(self) except -1:
        cdef Py_ssize_t cap = 8, old_cap = self._rcap, i, j, m
        cdef Ref* old = self._refs
        cdef Ref* new
        while cap < 4 * (self._rlive + 1):
            cap *= 2
        new = <Ref*>calloc(cap, sizeof(Ref))
        if new == NULL:
            raise MemoryError()
        m = cap - 1
        for i in range(old_cap):
            if old[i].state == LIVE:
                j = <Py_ssize_t>(_ref_slot(old[i].key, old[i].worker) & <uint64_t>m)
                while new[j].state != EMPTY:
                    j = (j + 1) & m
                new[j] = old[i]
        free(old)
        self._refs = new
        self._rcap = cap
        self._rused = self._rlive
        return 0

    # -- the ActiveBlocks interface ----------------------------------------------------------------
    def acquire(self, int worker, hashes):
        """Changes state: a request with these prompt hashes is active on ``worker``."""
        cdef uint32_t w = <uint32_t>self._check(worker)
        cdef uint64_t bit = (<uint64_t>1) << w, key, xbit = self._xbit(w)
        cdef uint64_t ring[RING]
        cdef Py_ssize_t i, n
        cdef Slot* s
        cdef const uint64_t* ks = self._keys(hashes, &n)
        _mt_start(&self._h, ring, ks, n, False)
        for i in range(n):
            key = _mt_next(&self._h, ring, ks, i, n, False)
            s = _mt_insert(&self._h, key)
            if s.mask & bit:  # held already: one more reference (flagged in the mask)
                self._ref_insert(key, w).count += 1
                s.mask |= xbit
            else:
                s.mask |= bit
                self._distinct[w] += 1

    def release(self, int worker, hashes):
        """Changes state: a request with these prompt hashes ended on ``worker`` (acquired before;
        a hash the worker does not hold raises KeyError, as the Python class's dict does)."""
        cdef uint32_t w = <uint32_t>self._check(worker)
        cdef uint64_t bit = (<uint64_t>1) << w, key, xbit = self._xbit(w)
        cdef uint64_t ring[RING]
        cdef Py_ssize_t i, n
        cdef Py_ssize_t j
        cdef Ref* r
        cdef const uint64_t* ks = self._keys(hashes, &n)
        for i in range(0, n, 8):  # (a request's words were made at its routing: cold by its end)
            __builtin_prefetch(&ks[i])
        _mt_start(&self._h, ring, ks, n, True)
        for i in range(n):
            key = _mt_next(&self._h, ring, ks, i, n, True)
            j = _mt_find(&self._h, key)
            if j < 0 or not (self._h.slots[j].mask & bit):
                raise KeyError(ks[i])
            if (self._h.slots[j].mask & xbit) if xbit else self._rlive:
                r = self._ref_find(key, w)
                if r != NULL:  # another reference stays
                    r.count -= 1
                    if r.count == 0:
                        r.state = TOMB
                        self._rlive -= 1
                        self._h.slots[j].mask &= ~xbit
                    continue
            _mt_drop_bit(&self._h, j, bit)
            self._distinct[w] -= 1

    def clear(self, int worker):
        """Changes state: ``worker`` holds nothing (it left the pool)."""
        cdef uint32_t w = <uint32_t>self._check(worker)
        cdef uint64_t bit = (<uint64_t>1) << w
        cdef Py_ssize_t i
        for i in range(self._rcap):
            if self._refs[i].state == LIVE and self._refs[i].worker == w:
                self._refs[i].state = TOMB
                self._rlive -= 1
        _mt_clear_bit(&self._h, bit | self._xbit(w))
        self._distinct[w] = 0

    def num_active(self, int worker):
        """Query: distinct blocks active on ``worker``."""
        return self._distinct[self._check(worker)]

    def overlaps(self, hashes):
        """Query: per worker holding any, how many of ``hashes`` (each distinct hash counted once)
        are active on it (absent: none), in worker order."""
        cdef Py_ssize_t counts[64]
        cdef int w
        cdef dict out = {}
        self._held(hashes, counts)
        for w in range(self._n):
            if counts[w]:
                out[w] = counts[w]
        return out

    def logits(self, hashes, list workers not None, dict overlaps not None, list prefill_tokens not None,
               Py_ssize_t isl,
               Py_ssize_t block_size, double overlap_credit, double prefill_load_scale, dict host=None,
               double host_weight=0.0):
        """Query: Dynamo's logit of each of ``workers``, in that order, for a prompt of ``isl``
        tokens with these block hashes -- :meth:`sim.cluster.active_blocks.ActiveBlocks.logits`
        (the formula and its arguments), in one call: its held blocks per worker in one pass, the
        arithmetic on C doubles in the same order (see the module docstring)."""
        cdef Py_ssize_t held[64]
        cdef Py_ssize_t blocks, w
        cdef double raw, credit, d
        cdef PyObject* v
        cdef bint tiers = bool(host)
        cdef list out = []
        if block_size <= 0 or isl < 0:
            raise ValueError(f"block size {block_size} and prompt length {isl}: a positive size, a length >= 0")
        self._held(hashes, held)
        blocks = (isl + block_size - 1) // block_size  # -(-isl // bs): the partial last block counts
        for x in workers:
            w = self._check(x)
            v = PyDict_GetItem(overlaps, x)
            raw = <double>(<Py_ssize_t>prefill_tokens[w] + isl) / <double>block_size
            credit = overlap_credit * <double>(0 if v == NULL else <Py_ssize_t><object>v)
            if tiers:
                v = PyDict_GetItem(host, x)
                credit += host_weight * <double>(0 if v == NULL else <Py_ssize_t><object>v)
            d = raw - credit
            if 0.0 > d:  # max(d, 0.0): d unless 0.0 is greater
                d = 0.0
            d = prefill_load_scale * d
            d = d + <double>self._distinct[w]
            out.append(d + <double>(blocks - held[w]))
        return out

    cdef inline uint64_t _xbit(self, uint32_t w) noexcept:
        """Worker ``w``'s more-than-once flag in a holder mask (0: not flagged in this fleet)."""
        return (<uint64_t>1) << (32 + w) if self._n <= FLAGGED else 0

    cdef int _check(self, int worker) except -1:
        if worker < 0 or worker >= self._n:
            raise IndexError(f"worker {worker} out of range 0..{self._n - 1}")
        return worker
