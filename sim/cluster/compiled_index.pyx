# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled KV-event index: :class:`sim.cluster.prefix_index.KVEventIndex` with its state in C
(mirrors the same products: llm-d-kv-cache-manager's ``kvblock`` index, Dynamo's ``KvIndexer``).

Same answers, call for call, as the Python index, its oracle (a property test drives both with
the same random calls): ``store``, ``remove``, ``clear``, ``match`` and ``num_entries``. A fleet's
routers apply every replica's ``BlockStored`` and ``BlockRemoved`` here, one hash at a time; in
Python that was a dict and a set operation per hash, about a fifth of a 16-replica run.

Layout: ``mask_table.pxi``'s table (shared with ``compiled_active``): each 64-bit hash with the
bitmask of the replicas that hold it, in an open-addressing table whose hashes leave by
backward-shift deletion (no tombstones), so a fleet's constant store/remove churn never forces a
rebuild. Hashes are vLLM's event form, unsigned 64-bit ints
(``sim.core.hashing.external_block_hash``).

Limits: at most 64 replicas (one bit each); ``make_kv_event_index`` gives the Python index above
that. Imports nothing from the project.
"""

from cpython cimport array as carray
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport Py_SIZE
from libc.stdint cimport uint64_t
from libc.stdlib cimport free

include "mask_table.pxi"

cdef enum:
    EV_STORED = 0  # the raw event kinds of sim.core.compiled_pool's KVEventLog
    EV_REMOVED = 1
    EV_CLEARED = 2

MAX_REPLICAS = 64


cdef class CompiledKVEventIndex:
    """Hash -> replicas holding it, from KV events (see the module docstring)."""

    cdef MaskTable _t             # hash -> the replicas holding it (mask_table.pxi)
    cdef int _n
    cdef list _entries            # per replica: hashes it holds
    cdef uint64_t* _keys          # scratch: a raw batch's hashes without their headers (apply_raw)
    cdef Py_ssize_t _kcap

    def __cinit__(self, int num_replicas, Py_ssize_t initial_slots=1024):
        """``initial_slots``: the table's first size (rounded up to a power of two, at least 8);
        the tests start small so that probing, deletions and rebuilds happen within a few calls."""
        if num_replicas < 0 or num_replicas > MAX_REPLICAS:
            raise ValueError(f"the compiled KV-event index holds 0 to {MAX_REPLICAS} replicas, got {num_replicas}")
        self._n = num_replicas
        _mt_init(&self._t, initial_slots)
        self._entries = [0] * num_replicas
        self._keys = NULL
        self._kcap = 0

    def __dealloc__(self):
        _mt_free(&self._t)
        free(self._keys)

    def store(self, int replica, hashes):
        """Changes state: ``BlockStored``."""
        cdef uint64_t bit = (<uint64_t>1) << self._check(replica)
        self._store(replica, bit, hashes if type(hashes) is list else list(hashes))

    def remove(self, int replica, hashes):
        """Changes state: ``BlockRemoved``."""
        cdef uint64_t bit = (<uint64_t>1) << self._check(replica)
        self._remove(replica, bit, hashes if type(hashes) is list else list(hashes))

    def apply(self, int replica, list events, Py_ssize_t start, stored_type, removed_type, gpu_medium):
        """Changes state: ``store`` or ``remove`` each event's hashes, in order from ``start``, while
        the event is a ``stored_type`` or ``removed_type`` on ``gpu_medium`` (or None); returns the
        index of the first event left to the caller (``len(events)``: all applied). A batch's
        events are dispatched here in C, where a Python loop cost a call per event."""
        cdef uint64_t bit = (<uint64_t>1) << self._check(replica)
        cdef Py_ssize_t i, n = PyList_GET_SIZE(events)
        cdef object ev, medium, hs
        for i in range(start, n):
            ev = <object>PyList_GET_ITEM(events, i)
            if type(ev) is removed_type:
                medium = ev.medium
                if medium is not None and medium is not gpu_medium and medium != gpu_medium:
                    return i
                hs = ev.block_hashes
                self._remove(replica, bit, hs if type(hs) is list else list(hs))
            elif type(ev) is stored_type:
                medium = ev.medium
                if medium is not None and medium is not gpu_medium and medium != gpu_medium:
                    return i
                hs = ev.block_hashes
                self._store(replica, bit, hs if type(hs) is list else list(hs))
            else:
                return i
        return n

    def apply_raw(self, int replica, carray.array words):
        """Changes state: apply a raw batch (``sim.core.compiled_pool.RawEventBatch.words``: per
        event a header word, ``kind | count << 8``, then its hashes) in order -- ``store`` for a
        stored event, ``remove`` for a removed one, ``clear`` for a cleared one: the calls
        ``apply`` makes for the same events as objects, without an object or a list per event.
        A first pass checks the headers (a malformed batch changes nothing) and gathers the
        hashes apart from them; each hash's table slot is then fetched ``RING`` hashes before its
        turn (``mask_table.pxi``: the hashes are random, one cache miss at a time would dominate;
        a header fetched a slot for nothing, and most events are one removed hash)."""
        cdef uint64_t bit = (<uint64_t>1) << self._check(replica)
        if words.ob_descr.typecode != b'Q':
            raise TypeError(f"raw KV-event words are an array('Q'), got typecode {words.typecode!r}")
        cdef const uint64_t* w = <const uint64_t*>words.data.as_ulonglongs
        cdef Py_ssize_t n = len(words), i = 0, j, k = 0, nk = 0, count, delta = 0
        cdef uint64_t key
        cdef uint64_t ring[RING]
        cdef int kind
        cdef Slot* s
        _mt_reserve(<void**>&self._keys, &self._kcap, n, sizeof(uint64_t))
        while i < n:  # (the batch's words, written at its step: cold by its delivery; read in order)
            kind = <int>(w[i] & 0xFF)
            count = <Py_ssize_t>(w[i] >> 8)
            if count > n - 1 - i or kind > EV_CLEARED:
                raise ValueError(f"malformed raw KV-event words at word {i} of {n}")
            i += 1
            if kind == EV_CLEARED:  # (a cleared event's words, if it had any, say nothing: skipped,
                i += count          # as RawEventBatch.runs does)
                continue
            while count:  # (mostly one hash: a loop, not a memcpy call)
                self._keys[nk] = w[i]
                nk += 1
                i += 1
                count -= 1
        _mt_start(&self._t, ring, self._keys, nk, True)
        i = 0
        while i < n:
            kind = <int>(w[i] & 0xFF)
            count = <Py_ssize_t>(w[i] >> 8)
            i += 1 + count
            if kind == EV_CLEARED:
                self._entries[replica] += delta
                delta = 0
                self.clear(replica)
                continue
            while count:
                count -= 1
                key = _mt_next(&self._t, ring, self._keys, k, nk, True)
                k += 1
                if kind == EV_STORED:
                    s = _mt_insert(&self._t, key)
                    if not (s.mask & bit):
                        s.mask |= bit
                        delta += 1
                else:
                    j = _mt_find(&self._t, key)
                    if j >= 0 and self._t.slots[j].mask & bit:
                        _mt_drop_bit(&self._t, j, bit)
                        delta -= 1
        self._entries[replica] += delta

    cdef int _store(self, int replica, uint64_t bit, list hs) except -1:
        cdef Py_ssize_t i, n = PyList_GET_SIZE(hs), added = 0
        cdef Slot* s
        for i in range(n):
            s = _mt_insert(&self._t, _mix(<uint64_t>(<object>PyList_GET_ITEM(hs, i))))
            if not (s.mask & bit):
                s.mask |= bit
                added += 1
        self._entries[replica] += added
        return 0

    cdef int _remove(self, int replica, uint64_t bit, list hs) except -1:
        cdef Py_ssize_t i, j, n = PyList_GET_SIZE(hs), removed = 0
        for i in range(n):
            j = _mt_find(&self._t, _mix(<uint64_t>(<object>PyList_GET_ITEM(hs, i))))
            if j >= 0 and self._t.slots[j].mask & bit:
                _mt_drop_bit(&self._t, j, bit)
                removed += 1
        self._entries[replica] -= removed
        return 0

    def clear(self, int replica):
        """Changes state: ``AllBlocksCleared`` or the replica left the pool."""
        cdef uint64_t bit = (<uint64_t>1) << self._check(replica)
        _mt_clear_bit(&self._t, bit)
        self._entries[replica] = 0

    def match(self, hashes, candidates):
        """Query: leading hashes held per candidate replica (only those holding block 0). ``hashes``:
        a list of ints, or an ``array('Q')`` read in place (``RouterRequest.words``)."""
        cdef uint64_t active = 0, held, dropped, mask
        cdef carray.array a = _mt_words(hashes)
        cdef const uint64_t* words = <const uint64_t*>a.data.as_ulonglongs
        cdef Py_ssize_t i, j, n = Py_SIZE(a)
        cdef dict out = {}
        for r in candidates:
            active |= (<uint64_t>1) << self._check(r)
        for i in range(n):
            if not active:
                return out
            j = _mt_find(&self._t, _mix(words[i]))
            mask = self._t.slots[j].mask if j >= 0 else 0
            held = active & mask
            dropped = active & ~held
            if dropped and i:
                _bits_to(out, dropped, i)
            active = held
        if active:
            _bits_to(out, active, n)
        return out

    def num_entries(self, int replica):
        """Query: how many hashes ``replica`` holds."""
        return self._entries[self._check(replica)]

    cdef int _check(self, int replica) except -1:
        if replica < 0 or replica >= self._n:
            raise IndexError(f"replica {replica} out of range 0..{self._n - 1}")
        return replica


cdef int _bits_to(dict out, uint64_t mask, Py_ssize_t value) except -1:
    """``out[r] = value`` for each replica bit ``r`` of ``mask``, lowest first (the Python
    index's order)."""
    cdef uint64_t low
    cdef int r
    while mask:
        low = mask & (~mask + 1)
        r = 0
        while (low >> r) != 1:
            r += 1
        out[r] = value
        mask ^= low
    return 0


cdef class StepTagger:
    """A block pool's KV-event sink for ``sim.cluster.kv_event_pipeline``: each event is appended to
    ``events`` and tagged in ``steps`` with the scheduler's ``step_index`` at that moment -- what
    the pipeline's Python closure does, without a Python frame per event (a 16-replica Dynamo
    fleet on 2,000 Mooncake requests emits a million, almost all one ``BlockRemoved`` per
    evicted block)."""

    cdef list _steps
    cdef list _events
    cdef object _scheduler

    def __cinit__(self, list steps, list events, scheduler):
        self._steps = steps
        self._events = events
        self._scheduler = scheduler

    def __call__(self, event):
        self._steps.append(self._scheduler.step_index)
        self._events.append(event)
