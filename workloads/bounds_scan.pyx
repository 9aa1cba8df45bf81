# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled policy loops of ``workloads.bounds`` over a block reference string (mirrors nothing
in vLLM: the offline references, at C speed).

Each function takes the arrays of a :class:`~workloads.bounds.BlockReferences` (dense block ids,
per-request start, length and lookup count) and returns the number of hit *blocks*; the caller
turns it into a rate. They are the Python loops of ``workloads.bounds`` (the oracle, kept and
property-tested against these) move for move:

* ``infinite_hits``: a seen flag per block;
* ``lru_hits``: vLLM's LRU as an intrusive doubly-linked list over block ids (head = next to
  evict); a request's blocks are touched tail first, then the list is cut to ``capacity``;
* ``next_lookups``: :meth:`~workloads.bounds.BlockReferences.next_lookup` in one backward scan;
* ``belady_hits``: MIN with bypass, a binary min-heap of ``(-next lookup, block)`` with stale
  entries skipped lazily, encoded as one int64 ``(never - next) * num_blocks + block``, which
  orders exactly as the oracle's tuples (so the same block is evicted on every tie).

Invariant: equal hit counts to the Python loops on every input. Imports numpy.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int64_t

cnp.import_array()


cdef inline int64_t _leading(const int64_t[::1] ids, int64_t s, int64_t lk, const char* cached) noexcept nogil:
    """vLLM's first-miss rule over ``ids[s:s + lk]``."""
    cdef int64_t p, hits = 0
    for p in range(s, s + lk):
        if not cached[ids[p]]:
            break
        hits += 1
    return hits


def infinite_hits(const int64_t[::1] ids, const int64_t[::1] start, const int64_t[::1] length,
                  const int64_t[::1] lookup, int64_t num_blocks):
    """Hit blocks of the cache that never evicts."""
    cdef cnp.ndarray[cnp.int8_t, ndim=1] seen_arr = np.zeros(max(num_blocks, 1), dtype=np.int8)
    cdef char* seen = <char*> seen_arr.data
    cdef int64_t r, p, s, hits = 0
    with nogil:
        for r in range(start.shape[0]):
            s = start[r]
            hits += _leading(ids, s, lookup[r], seen)
            for p in range(s, s + length[r]):
                seen[ids[p]] = 1
    return hits


def next_lookups(const int64_t[::1] ids, const int64_t[::1] start, const int64_t[::1] length,
                 const int64_t[::1] lookup, int64_t num_blocks):
    """For each reference position: the position of the next lookup reference of its block
    (``len(ids)`` when there is none), scanning backwards with the last lookup seen per block."""
    cdef int64_t n = ids.shape[0]
    cdef cnp.ndarray[cnp.int64_t, ndim=1] out_arr = np.empty(n, dtype=np.int64)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] seen_arr = np.full(max(num_blocks, 1), n, dtype=np.int64)
    cdef int64_t* out = <int64_t*> out_arr.data
    cdef int64_t* seen = <int64_t*> seen_arr.data
    cdef int64_t r, p, s, b
    with nogil:
        for r in range(start.shape[0] - 1, -1, -1):
            s = start[r]
            for p in range(s + length[r] - 1, s - 1, -1):
                b = ids[p]
                out[p] = seen[b]
                if p < s + lookup[r]:
                    seen[b] = p
    return out_arr


def lru_hits(const int64_t[::1] ids, const int64_t[::1] start, const int64_t[::1] length,
             const int64_t[::1] lookup, int64_t num_blocks, int64_t capacity):
    """Hit blocks of the sequential LRU holding at most ``capacity`` blocks."""
    cdef int64_t n = max(num_blocks, 1)
    cdef cnp.ndarray[cnp.int8_t, ndim=1] in_arr = np.zeros(n, dtype=np.int8)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] prev_arr = np.full(n, -1, dtype=np.int64)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] next_arr = np.full(n, -1, dtype=np.int64)
    cdef char* inside = <char*> in_arr.data
    cdef int64_t* prv = <int64_t*> prev_arr.data
    cdef int64_t* nxt = <int64_t*> next_arr.data
    cdef int64_t head = -1, tail = -1, size = 0, hits = 0
    cdef int64_t r, p, s, b, a, c
    with nogil:
        for r in range(start.shape[0]):
            s = start[r]
            hits += _leading(ids, s, lookup[r], inside)
            if capacity == 0:
                continue
            p = s + length[r] - 1
            while p >= s:  # tail first, as vLLM's kv_cache_manager.free frees a request's blocks
                b = ids[p]
                p -= 1
                if inside[b]:
                    if b == tail:
                        continue
                    a = prv[b]
                    c = nxt[b]
                    if a >= 0:
                        nxt[a] = c
                    else:
                        head = c
                    prv[c] = a  # c exists: b is not the tail
                else:
                    inside[b] = 1
                    size += 1
                prv[b] = tail
                nxt[b] = -1
                if tail >= 0:
                    nxt[tail] = b
                else:
                    head = b
                tail = b
            while size > capacity:  # evict from the head (least recently used)
                b = head
                head = nxt[b]
                if head >= 0:
                    prv[head] = -1
                else:
                    tail = -1
                inside[b] = 0
                size -= 1
    return hits


cdef inline void _push(int64_t* heap, int64_t* size, int64_t key) noexcept nogil:
    cdef int64_t i = size[0], parent
    size[0] += 1
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= key:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = key


cdef inline void _pop(int64_t* heap, int64_t* size) noexcept nogil:
    cdef int64_t n = size[0] - 1, i = 0, child, last
    size[0] = n
    if n == 0:
        return
    last = heap[n]
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= last:
            break
        heap[i] = heap[child]
        i = child
    heap[i] = last


def belady_hits(const int64_t[::1] ids, const int64_t[::1] next_lookup, const int64_t[::1] start,
                const int64_t[::1] length, const int64_t[::1] lookup, int64_t num_blocks, int64_t capacity):
    """Hit blocks of Belady's MIN with bypass holding at most ``capacity`` blocks
    (``next_lookup``: :meth:`~workloads.bounds.BlockReferences.next_lookup`)."""
    cdef int64_t n = ids.shape[0]
    cdef int64_t never = n
    cdef int64_t m = max(num_blocks, 1)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] nu_arr = np.full(m, -1, dtype=np.int64)  # -1: not cached
    cdef cnp.ndarray[cnp.int8_t, ndim=1] in_arr = np.zeros(m, dtype=np.int8)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] heap_arr = np.empty(n + 1, dtype=np.int64)
    cdef int64_t* cached_nu = <int64_t*> nu_arr.data
    cdef char* inside = <char*> in_arr.data
    cdef int64_t* heap = <int64_t*> heap_arr.data
    cdef int64_t heap_size = 0, size = 0, hits = 0
    cdef int64_t r, p, s, b, nu, old, top, top_b, top_nu
    with nogil:
        for r in range(start.shape[0]):
            s = start[r]
            hits += _leading(ids, s, lookup[r], inside)
            for p in range(s, s + length[r]):
                b = ids[p]
                nu = next_lookup[p]
                old = cached_nu[b]
                if old >= 0:
                    if old != nu:
                        cached_nu[b] = nu
                        _push(heap, &heap_size, (never - nu) * m + b)
                    continue
                if nu == never or capacity == 0:
                    continue  # bypass: no future lookup
                if size < capacity:
                    cached_nu[b] = nu
                    inside[b] = 1
                    size += 1
                    _push(heap, &heap_size, (never - nu) * m + b)
                    continue
                while True:  # the cached block looked up furthest in the future
                    top = heap[0]
                    top_b = top % m
                    top_nu = never - top // m
                    if cached_nu[top_b] == top_nu:
                        break
                    _pop(heap, &heap_size)
                if top_nu > nu:
                    _pop(heap, &heap_size)
                    cached_nu[top_b] = -1
                    inside[top_b] = 0
                    cached_nu[b] = nu
                    inside[b] = 1
                    _push(heap, &heap_size, (never - nu) * m + b)
    return hits
