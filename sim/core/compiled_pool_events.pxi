"""The compiled pool's raw KV-event log (included by ``compiled_pool.pyx``): what a fleet's
routers read of the pool's events, written in C without a Python object per event.

A router's KV-event index (``sim.cluster.compiled_index``, mirroring llm-d's ``kvblock`` index
and Dynamo's ``KvIndexer``) reads of each ``BlockStored`` / ``BlockRemoved`` only its kind and
its hashes (vLLM's event form: the low 64 bits of the hash bytes read big-endian), and of
``AllBlocksCleared`` only that it happened. :class:`KVEventLog` keeps exactly that, per replica,
in emission order: each event is a header word (its kind in the low byte, its hash count above)
followed by its hashes, tagged with the scheduler's ``step_index`` at the moment it was emitted
(the same tag ``sim.cluster.kv_event_pipeline`` gives an event object). The pool writes into it
directly (``CompiledBlockPool`` with a log as its ``event_sink``); anything else that calls the
sink hands it an event object, which is converted to the same words. :meth:`KVEventLog.take`
cuts the events of the steps up to one step into a :class:`RawEventBatch`, as the pipeline's
object collector cuts its lists.

Only GPU-medium events have a raw form: the CPU tier's events (``medium="CPU"``) carry what the
tiered index reads (parent hash, token count), so a replica with a tier keeps event objects (the
pipeline decides; a CPU event handed to a log is refused with one clear error).
"""

from array import array as _array

from cpython cimport array as carray
from sim.core.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored

cdef enum:
    EV_STORED = 0
    EV_REMOVED = 1
    EV_CLEARED = 2

EVENT_STORED = EV_STORED
EVENT_REMOVED = EV_REMOVED
EVENT_CLEARED = EV_CLEARED
cdef carray.array _WORDS = _array("Q")  # the template of a batch's words


cdef inline uint64_t _ext64(object raw) except? 0:
    """``sim.core.hashing.external_block_hash(raw)`` as a C integer (the bytes' last 8, big-endian)."""
    if not PyBytes_Check(raw):
        return <uint64_t>external_block_hash(raw)
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(raw), i = 0
    cdef uint64_t v = 0
    if n >= 8:  # (every key of the default hashes: the last 8 bytes, be64.pxi)
        return _be64(p + n - 8)
    while i < n:  # (a shorter key: all its bytes)
        v = (v << 8) | p[i]
        i += 1
    return v


cdef class RawEventBatch:
    """One published batch of a replica's events in raw form: ``words`` (an ``array('Q')``: per
    event a header word, ``kind | count << 8``, then its ``count`` hashes) and ``len()`` events."""

    cdef readonly object words
    cdef readonly Py_ssize_t num_events

    def __len__(self):
        return self.num_events

    def runs(self):
        """Query: the events as ``(kind, hashes)`` pairs (``EVENT_*`` kinds, hashes as ints)."""
        cdef list out = []
        cdef Py_ssize_t i = 0, n = len(self.words), k
        w = self.words
        while i < n:
            k = <Py_ssize_t>(w[i] >> 8)
            out.append((<int>(w[i] & 0xFF), list(w[i + 1:i + 1 + k])))
            i += 1 + k
        return out


cdef class KVEventLog:
    """A replica's raw KV events not yet batched (see the module docstring). Callable as an
    ``EventSink`` for event objects; the compiled pool writes into it in C."""

    cdef uint64_t* _words
    cdef int64_t* _steps  # per event: its step tag
    cdef int64_t* _at  # per event: the word index of its header
    cdef Py_ssize_t _nw, _capw, _ne, _cape, _start  # _start: the first event not yet taken
    cdef object _sched

    def __cinit__(self, scheduler=None):
        self._words = NULL
        self._steps = NULL
        self._at = NULL
        self._nw = self._capw = self._ne = self._cape = self._start = 0
        self._sched = scheduler

    def __dealloc__(self):
        PyMem_Free(self._words)
        PyMem_Free(self._steps)
        PyMem_Free(self._at)

    def bind(self, scheduler):
        """Changes state: tag the coming events with this scheduler's ``step_index`` (a replica's
        new incarnation writes into the same log)."""
        self._sched = scheduler

    cdef inline int64_t step(self) except? -1:
        return <int64_t>self._sched.step_index

    cdef int _reserve(self, Py_ssize_t events, Py_ssize_t words) except -1:
        cdef Py_ssize_t cap
        cdef void* p
        if self._ne + events > self._cape:
            cap = max(64, 2 * self._cape, self._ne + events)
            p = PyMem_Realloc(self._steps, cap * sizeof(int64_t))
            if p == NULL:
                raise MemoryError()
            self._steps = <int64_t*>p
            p = PyMem_Realloc(self._at, cap * sizeof(int64_t))
            if p == NULL:
                raise MemoryError()
            self._at = <int64_t*>p
            self._cape = cap
        if self._nw + words > self._capw:
            cap = max(256, 2 * self._capw, self._nw + words)
            p = PyMem_Realloc(self._words, cap * sizeof(uint64_t))
            if p == NULL:
                raise MemoryError()
            self._words = <uint64_t*>p
            self._capw = cap
        return 0

    cdef int begin(self, int64_t step, int kind, Py_ssize_t count) except -1:
        """Changes state: append an event's header (its ``count`` hashes follow with ``put``)."""
        # (the room checked here: a _reserve call per event was 23 M of the log's 78 M instructions)
        if self._ne >= self._cape or self._nw + 1 + count > self._capw:
            self._reserve(1, 1 + count)
        self._steps[self._ne] = step
        self._at[self._ne] = self._nw
        self._ne += 1
        self._words[self._nw] = <uint64_t>kind | (<uint64_t>count << 8)
        self._nw += 1
        return 0

    cdef inline void put(self, uint64_t h) noexcept:
        """Append a hash of the event just begun (its room was reserved by ``begin``)."""
        self._words[self._nw] = h
        self._nw += 1

    cdef int removed(self, int64_t step, uint64_t h) except -1:
        self.begin(step, EV_REMOVED, 1)
        self.put(h)
        return 0

    def __call__(self, event):
        """Changes state: append an event object (the sink protocol), tagged like the pool's."""
        cdef int64_t step = self.step()
        cdef Py_ssize_t i, n
        kind = type(event)
        if kind is AllBlocksCleared:
            self.begin(step, EV_CLEARED, 0)
            return
        if kind is not BlockStored and kind is not BlockRemoved:
            raise TypeError(f"a KV-event log takes BlockStored, BlockRemoved or AllBlocksCleared, got {kind.__name__}")
        if event.medium is not None and event.medium != MEDIUM_GPU:
            raise ValueError(f"a KV-event log holds GPU events only, got medium {event.medium!r} "
                             f"(a replica with a CPU tier keeps event objects)")
        hs = list(event.block_hashes)
        n = len(hs)
        self.begin(step, EV_STORED if kind is BlockStored else EV_REMOVED, n)
        for i in range(n):
            self.put(<uint64_t>hs[i])

    def __len__(self):
        """Query: events not yet taken."""
        return self._ne - self._start

    def tags(self):
        """Query: the step tags of the events not yet taken, in order."""
        return [self._steps[i] for i in range(self._start, self._ne)]

    def tags_upto(self, int64_t last):
        """Query: the distinct step tags up to ``last`` of the events not yet taken, in order --
        ``tags()`` deduplicated and cut, without an int per event (each next tag is found by
        bisection: the tags never decrease, see ``take``). A window publishes a batch per tag."""
        cdef list out = []
        cdef Py_ssize_t i = self._start
        cdef int64_t t
        while i < self._ne and self._steps[i] <= last:
            t = self._steps[i]
            out.append(t)
            i = self._cut(i + 1, t)
        return out

    def front(self):
        """Query: the step tag of the first event not yet taken (None: none left)."""
        return self._steps[self._start] if self._start < self._ne else None

    def take(self, int64_t step):
        """Changes state: the events from the front up to the first tagged after ``step``, as a
        :class:`RawEventBatch` (None: none). The tags never decrease (a scheduler's
        ``step_index`` only grows), so the cut is a bisection."""
        cdef Py_ssize_t lo = self._start, w0, w1
        if lo == self._ne or self._steps[lo] > step:
            return None
        lo = self._cut(lo, step)
        w0 = self._at[self._start]
        w1 = self._at[lo] if lo < self._ne else self._nw
        cdef RawEventBatch batch = RawEventBatch.__new__(RawEventBatch)
        cdef carray.array words = carray.clone(_WORDS, w1 - w0, False)
        memcpy(words.data.as_ulonglongs, self._words + w0, (w1 - w0) * sizeof(uint64_t))
        batch.words = words
        batch.num_events = lo - self._start
        self._start = lo
        if lo == self._ne:
            self._ne = self._nw = self._start = 0
        elif lo > 4096 and 2 * lo > self._ne:
            self._compact()
        return batch

    cdef inline Py_ssize_t _cut(self, Py_ssize_t lo, int64_t step) noexcept:
        """The first event from ``lo`` on tagged after ``step`` (``_ne``: none), by bisection."""
        cdef Py_ssize_t hi = self._ne, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self._steps[mid] <= step:
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef void _compact(self) noexcept:
        """Drop the taken front (events and words) by moving the rest down."""
        cdef Py_ssize_t i, s = self._start, w0 = self._at[s]
        memmove(self._words, self._words + w0, (self._nw - w0) * sizeof(uint64_t))
        memmove(self._steps, self._steps + s, (self._ne - s) * sizeof(int64_t))
        for i in range(self._ne - s):
            self._at[i] = self._at[s + i] - w0
        self._nw -= w0
        self._ne -= s
        self._start = 0

    def clear(self):
        """Changes state: drop every event not yet taken (the replica went down)."""
        self._ne = self._nw = self._start = 0
