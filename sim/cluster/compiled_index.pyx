# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled KV-event index: :class:`sim.cluster.prefix_index.KVEventIndex` with its state in C
(mirrors the same products: llm-d-kv-cache-manager's ``kvblock`` index, Dynamo's ``KvIndexer``).

Same answers, call for call, as the Python index, its oracle (a property test drives both with
the same random calls): ``store``, ``remove``, ``clear``, ``match`` and ``num_entries``. A fleet's
routers apply every replica's ``BlockStored`` and ``BlockRemoved`` here, one hash at a time; in
Python that was a dict and a set operation per hash, about a fifth of a 16-replica run.

Layout: an open-addressing table (linear probing, power-of-two size) of 64-bit hashes, each slot
holding the bitmask of the replicas that hold the hash (16 bytes; a slot is empty when its mask is
0: a hash is in the table while some replica holds it). A hash whose last replica removes it
leaves the table by backward-shift deletion (Knuth's algorithm R: the entries after it in its
probe run move up when their home allows), so no tombstone lengthens later probes and a fleet's
constant store/remove churn never forces a rebuild; the table is rebuilt (to at least four times
the live count, a power of two) only when the live hashes pass half its size, or after ``clear``.
Hashes are vLLM's event form, unsigned 64-bit ints (``sim.core.hashing.external_block_hash``); the
slot index mixes them (SplitMix64's finaliser), so no key pattern clusters the probes.

Limits: at most 64 replicas (one bit each); ``make_kv_event_index`` gives the Python index above
that. Imports nothing from the project.
"""

from cpython cimport array as carray
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport uint64_t
from libc.stdlib cimport calloc, free

cdef enum:
    EV_STORED = 0  # the raw event kinds of sim.core.compiled_pool's KVEventLog
    EV_REMOVED = 1
    EV_CLEARED = 2
    AHEAD = 16  # words whose table slots are fetched ahead of their turn in apply_raw

cdef extern from *:
    void __builtin_prefetch(const void* addr, ...) nogil

cdef struct Slot:
    uint64_t key
    uint64_t mask

MAX_REPLICAS = 64


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    x ^= x >> 30
    x *= <uint64_t>0xBF58476D1CE4E5B9
    x ^= x >> 27
    x *= <uint64_t>0x94D049BB133111EB
    x ^= x >> 31
    return x


cdef class CompiledKVEventIndex:
    """Hash -> replicas holding it, from KV events (see the module docstring)."""

    cdef Slot* _slots
    cdef Py_ssize_t _cap          # a power of two
    cdef Py_ssize_t _live
    cdef int _n
    cdef list _entries            # per replica: hashes it holds

    def __cinit__(self, int num_replicas, Py_ssize_t initial_slots=1024):
        """``initial_slots``: the table's first size (rounded up to a power of two, at least 8);
        the tests start small so that probing, deletions and rebuilds happen within a few calls."""
        if num_replicas < 0 or num_replicas > MAX_REPLICAS:
            raise ValueError(f"the compiled KV-event index holds 0 to {MAX_REPLICAS} replicas, got {num_replicas}")
        self._n = num_replicas
        self._cap = 8
        while self._cap < initial_slots:
            self._cap *= 2
        self._slots = <Slot*>calloc(self._cap, sizeof(Slot))
        if self._slots == NULL:
            raise MemoryError()
        self._live = 0
        self._entries = [0] * num_replicas

    def __dealloc__(self):
        free(self._slots)

    cdef Py_ssize_t _find(self, uint64_t key) noexcept:
        """The live slot of ``key``, or -1."""
        cdef Py_ssize_t m = self._cap - 1
        cdef Py_ssize_t i = <Py_ssize_t>(_mix(key) & <uint64_t>m)
        cdef Slot* s
        while True:
            s = &self._slots[i]
            if s.mask == 0:  # (an empty slot: a live hash has a replica)
                return -1
            if s.key == key:
                return i
            i = (i + 1) & m

    cdef Slot* _insert_slot(self, uint64_t key) except NULL:
        """The live slot of ``key``, made (mask 0) when absent; may rebuild the table first."""
        cdef Py_ssize_t m, i
        cdef Slot* s
        if (self._live + 1) * 2 > self._cap:
            self._rebuild()
        m = self._cap - 1
        i = <Py_ssize_t>(_mix(key) & <uint64_t>m)
        while True:
            s = &self._slots[i]
            if s.mask == 0:
                break
            if s.key == key:
                return s
            i = (i + 1) & m
        s.key = key
        s.mask = 0
        self._live += 1
        return s

    cdef int _rebuild(self) except -1:
        cdef Py_ssize_t cap = 8, old_cap = self._cap, i, j, m
        cdef Slot* old = self._slots
        cdef Slot* new
        while cap < 4 * (self._live + 1):
            cap *= 2
        new = <Slot*>calloc(cap, sizeof(Slot))
        if new == NULL:
            raise MemoryError()
        m = cap - 1
        for i in range(old_cap):
            if old[i].mask != 0:
                j = <Py_ssize_t>(_mix(old[i].key) & <uint64_t>m)
                while new[j].mask != 0:
                    j = (j + 1) & m
                new[j] = old[i]
        free(old)
        self._slots = new
        self._cap = cap
        return 0

    cdef inline void _drop_bit(self, Py_ssize_t i, uint64_t bit) noexcept:
        """Take ``bit`` off slot ``i``; the hash leaves the table with its last replica."""
        cdef Slot* s = &self._slots[i]
        s.mask &= ~bit
        if s.mask == 0:
            self._delete_at(i)
            self._live -= 1

    cdef void _delete_at(self, Py_ssize_t i) noexcept:
        """Empty slot ``i`` by backward shift: each later entry of the probe run moves into the
        hole when its home slot is not cyclically within (hole, entry], so every key stays
        reachable from its home without passing an empty slot."""
        cdef Py_ssize_t m = self._cap - 1, j = i, k
        while True:
            j = (j + 1) & m
            if self._slots[j].mask == 0:
                break
            k = <Py_ssize_t>(_mix(self._slots[j].key) & <uint64_t>m)
            if (i < k <= j) if i <= j else (k > i or k <= j):
                continue  # its home lies after the hole: it must stay
            self._slots[i] = self._slots[j]
            i = j
        self._slots[i].mask = 0

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
        Each word's table slot is fetched ``AHEAD`` words before its turn (the hashes are
        random: one cache miss at a time would dominate)."""
        cdef uint64_t bit = (<uint64_t>1) << self._check(replica)
        if words.ob_descr.typecode != b'Q':
            raise TypeError(f"raw KV-event words are an array('Q'), got typecode {words.typecode!r}")
        cdef const uint64_t* w = <const uint64_t*>words.data.as_ulonglongs
        cdef Py_ssize_t n = len(words), i = 0, j, k, end, delta = 0
        cdef uint64_t head
        cdef int kind
        cdef Slot* s
        for j in range(min(n, AHEAD)):
            __builtin_prefetch(&self._slots[_mix(w[j]) & <uint64_t>(self._cap - 1)])
        while i < n:
            head = w[i]
            kind = <int>(head & 0xFF)
            k = <Py_ssize_t>(head >> 8)
            i += 1
            end = i + k
            if end > n or kind > EV_CLEARED:
                raise ValueError(f"malformed raw KV-event words at word {i - 1} of {n}")
            if kind == EV_CLEARED:
                self._entries[replica] += delta
                delta = 0
                self.clear(replica)
                continue
            while i < end:
                if i + AHEAD < n:
                    __builtin_prefetch(&self._slots[_mix(w[i + AHEAD]) & <uint64_t>(self._cap - 1)])
                if kind == EV_STORED:
                    s = self._insert_slot(w[i])
                    if not (s.mask & bit):
                        s.mask |= bit
                        delta += 1
                else:
                    j = self._find(w[i])
                    if j >= 0 and self._slots[j].mask & bit:
                        self._drop_bit(j, bit)
                        delta -= 1
                i += 1
        self._entries[replica] += delta

    cdef int _store(self, int replica, uint64_t bit, list hs) except -1:
        cdef Py_ssize_t i, n = PyList_GET_SIZE(hs), added = 0
        cdef Slot* s
        for i in range(n):
            s = self._insert_slot(<uint64_t>(<object>PyList_GET_ITEM(hs, i)))
            if not (s.mask & bit):
                s.mask |= bit
                added += 1
        self._entries[replica] += added
        return 0

    cdef int _remove(self, int replica, uint64_t bit, list hs) except -1:
        cdef Py_ssize_t i, j, n = PyList_GET_SIZE(hs), removed = 0
        for i in range(n):
            j = self._find(<uint64_t>(<object>PyList_GET_ITEM(hs, i)))
            if j >= 0 and self._slots[j].mask & bit:
                self._drop_bit(j, bit)
                removed += 1
        self._entries[replica] -= removed
        return 0

    def clear(self, int replica):
        """Changes state: ``AllBlocksCleared`` or the replica left the pool."""
        cdef uint64_t bit = (<uint64_t>1) << self._check(replica)
        cdef Py_ssize_t i, dropped = 0
        cdef Slot* s
        for i in range(self._cap):  # (a deletion would shift entries under the scan: emptied
            s = &self._slots[i]     # in place, they are left out by the rebuild below)
            if s.mask & bit:
                s.mask &= ~bit
                if s.mask == 0:
                    dropped += 1
        if dropped:
            self._live -= dropped
            self._rebuild()
        self._entries[replica] = 0

    def match(self, hashes, candidates):
        """Query: leading hashes held per candidate replica (only those holding block 0)."""
        cdef uint64_t active = 0, held, dropped, mask
        cdef list hs = hashes if type(hashes) is list else list(hashes)
        cdef Py_ssize_t i, j, n = PyList_GET_SIZE(hs)
        cdef dict out = {}
        for r in candidates:
            active |= (<uint64_t>1) << self._check(r)
        for i in range(n):
            if not active:
                return out
            j = self._find(<uint64_t>(<object>PyList_GET_ITEM(hs, i)))
            mask = self._slots[j].mask if j >= 0 else 0
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
