# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled policy loops of ``workloads.bounds`` over a block reference string (mirrors nothing
in vLLM: the offline references, at C speed).

Each function takes the arrays of a :class:`~workloads.bounds.BlockReferences` (dense block ids,
per-request start, length and lookup count) and returns the number of hit *blocks*; the caller
turns it into a rate. They are the Python loops of ``workloads.bounds`` (the oracle, kept and
property-tested against these) move for move:

* ``infinite_hits``: a seen flag per block;
* ``next_lookups``: :meth:`~workloads.bounds.BlockReferences.next_lookup` in one backward scan;
* ``all_hits``: the three policies side by side in one pass over the requests -- the infinite
  cache's seen flags; Belady's MIN with bypass as a binary min-heap of ``(-next lookup, block)``
  with stale entries skipped lazily, encoded as one int64 ``(never - next) * num_blocks + block``,
  which orders exactly as the oracle's tuples (so the same block is evicted on every tie); vLLM's
  LRU as an intrusive doubly-linked list over block ids (head = next to evict), a request's blocks
  touched tail first, then the list cut to ``capacity``;
* ``stream_ids``: the whole reference string's dense block ids straight from each request's token
  runs: a 128-bit chained key per full block computed here (no Python object per block), with the
  equality structure of ``sim.core.hashing.FastBlockHasher`` (a key is a function of its parent's
  key, its tokens and its extra keys: a block of consecutive ids is digested from its first id,
  others token by token, so where the runs are cut never matters), numbered by first appearance
  through an open-addressing table (equal keys, equal ids: the policies see the same equality, so
  the same hit counts as with ``workloads.bounds._dense_ids``' byte-order ranks of the engine
  hasher's keys; and a request's new blocks get consecutive ids, which keeps the policies' arrays
  local in memory).

Invariant: equal hit counts to the Python loops on every input. Imports numpy.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint64_t

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


def all_hits(const int64_t[::1] ids, const int64_t[::1] next_lookup, const int64_t[::1] start,
             const int64_t[::1] length, const int64_t[::1] lookup, int64_t num_blocks, int64_t capacity):
    """Hit blocks ``(infinite, belady, lru)`` in one pass over the requests, the three caches side
    by side: each request looked up in all three, then cached in all three (the moves of the three
    Python loops of ``workloads.bounds``, so the same counts); ``capacity`` bounds Belady and LRU."""
    cdef int64_t n = ids.shape[0]
    cdef int64_t never = n
    cdef int64_t m = max(num_blocks, 1)
    cdef cnp.ndarray[cnp.int8_t, ndim=1] seen_arr = np.zeros(m, dtype=np.int8)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] nu_arr = np.full(m, -1, dtype=np.int64)
    cdef cnp.ndarray[cnp.int8_t, ndim=1] bin_arr = np.zeros(m, dtype=np.int8)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] heap_arr = np.empty(n + 1, dtype=np.int64)
    cdef cnp.ndarray[cnp.int8_t, ndim=1] lin_arr = np.zeros(m, dtype=np.int8)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] prev_arr = np.full(m, -1, dtype=np.int64)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] next_arr = np.full(m, -1, dtype=np.int64)
    cdef char* seen = <char*> seen_arr.data
    cdef int64_t* cached_nu = <int64_t*> nu_arr.data
    cdef char* b_in = <char*> bin_arr.data
    cdef int64_t* heap = <int64_t*> heap_arr.data
    cdef char* l_in = <char*> lin_arr.data
    cdef int64_t* prv = <int64_t*> prev_arr.data
    cdef int64_t* nxt = <int64_t*> next_arr.data
    cdef int64_t inf_hits = 0, bel_hits = 0, lru_hit = 0
    cdef int64_t heap_size = 0, b_size = 0, head = -1, tail = -1, l_size = 0
    cdef int64_t r, p, s, e, b, nu, old, top, top_b, top_nu, a, c
    with nogil:
        for r in range(start.shape[0]):
            s = start[r]
            e = s + length[r]
            inf_hits += _leading(ids, s, lookup[r], seen)
            bel_hits += _leading(ids, s, lookup[r], b_in)
            lru_hit += _leading(ids, s, lookup[r], l_in)
            for p in range(s, e):  # the infinite cache and Belady, head first
                b = ids[p]
                seen[b] = 1
                nu = next_lookup[p]
                old = cached_nu[b]
                if old >= 0:
                    if old != nu:
                        cached_nu[b] = nu
                        _push(heap, &heap_size, (never - nu) * m + b)
                    continue
                if nu == never or capacity == 0:
                    continue
                if b_size < capacity:
                    cached_nu[b] = nu
                    b_in[b] = 1
                    b_size += 1
                    _push(heap, &heap_size, (never - nu) * m + b)
                    continue
                while True:
                    top = heap[0]
                    top_b = top % m
                    top_nu = never - top // m
                    if cached_nu[top_b] == top_nu:
                        break
                    _pop(heap, &heap_size)
                if top_nu > nu:
                    _pop(heap, &heap_size)
                    cached_nu[top_b] = -1
                    b_in[top_b] = 0
                    cached_nu[b] = nu
                    b_in[b] = 1
                    _push(heap, &heap_size, (never - nu) * m + b)
            if capacity == 0:
                continue
            p = e - 1
            while p >= s:  # the sequential LRU, tail first
                b = ids[p]
                p -= 1
                if l_in[b]:
                    if b == tail:
                        continue
                    a = prv[b]
                    c = nxt[b]
                    if a >= 0:
                        nxt[a] = c
                    else:
                        head = c
                    prv[c] = a
                else:
                    l_in[b] = 1
                    l_size += 1
                prv[b] = tail
                nxt[b] = -1
                if tail >= 0:
                    nxt[tail] = b
                else:
                    head = b
                tail = b
            while l_size > capacity:
                b = head
                head = nxt[b]
                if head >= 0:
                    prv[head] = -1
                else:
                    tail = -1
                l_in[b] = 0
                l_size -= 1
    return inf_hits, bel_hits, lru_hit


cdef extern from *:
    void _prefetch "__builtin_prefetch" (const void* p) noexcept nogil


cdef int64_t _AHEAD = 8  # how many blocks ahead a probe's table slot is fetched (memory-level parallelism)


cdef inline uint64_t _slot(uint64_t h0, uint64_t h1, int64_t bits) noexcept nogil:
    return ((h0 * <uint64_t> 0x9E3779B97F4A7C15) ^ h1) >> (64 - bits)


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    """splitmix64's finaliser: a bijection of 64-bit words."""
    x = (x ^ (x >> 30)) * <uint64_t> 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * <uint64_t> 0x94D049BB133111EB
    return x ^ (x >> 31)


def stream_ids(const int64_t[::1] run_start, const int64_t[::1] run_len, const int64_t[::1] req_run,
               const int64_t[::1] req_blocks, const uint64_t[:, ::1] extra, const char[::1] extra_on,
               int64_t block_size, int64_t total_blocks):
    """Dense ids (first appearance) of the chained keys of every request's first ``req_blocks[r]``
    full blocks, request ``r``'s tokens being the runs ``req_run[r]:req_run[r + 1]`` of
    ``(run_start, run_len)`` (``total_blocks``: the sum of ``req_blocks``). ``extra[r]`` holds the
    digests of the extra keys of block 0 (lanes 0, 1) and of every later block (lanes 2, 3), mixed
    in where ``extra_on[2r]`` / ``extra_on[2r + 1]`` is set (``sim.core.extra_keys
    .blocks_extra_keys``: the salt on block 0, the LoRA name on every block)."""
    cdef int64_t n = total_blocks
    cdef cnp.ndarray[cnp.int64_t, ndim=1] out_arr = np.empty(n, dtype=np.int64)
    cdef cnp.ndarray[cnp.uint64_t, ndim=1] key_arr = np.empty(2 * max(n, 1), dtype=np.uint64)
    cdef cnp.ndarray[cnp.uint64_t, ndim=1] pk_arr = np.empty(4 * max(block_size, 1), dtype=np.uint64)
    cdef cnp.ndarray[cnp.uint64_t, ndim=1] tok_arr = np.empty(max(block_size, 1), dtype=np.uint64)
    cdef cnp.ndarray[cnp.uint64_t, ndim=1] hb_arr = np.empty(2 * max(np.max(req_blocks) if n else 1, 1),
                                                             dtype=np.uint64)
    cdef uint64_t* hb = <uint64_t*> hb_arr.data  # one request's keys, then probed
    cdef int64_t nb
    cdef int64_t bits = 4
    while (1 << bits) < 2 * n:
        bits += 1
    cdef cnp.ndarray[cnp.int32_t, ndim=1] table_arr = np.zeros(1 << bits, dtype=np.int32)  # untouched pages stay unmapped
    cdef int64_t* out = <int64_t*> out_arr.data
    cdef uint64_t* keys = <uint64_t*> key_arr.data  # per id: its key's two lanes
    cdef uint64_t* pk = <uint64_t*> pk_arr.data  # per position: two keys, two odd multipliers
    cdef uint64_t* tok = <uint64_t*> tok_arr.data
    cdef int32_t* table = <int32_t*> table_arr.data  # slot -> id + 1, 0 empty (the caller keeps ids < 2**31 - 1)
    cdef uint64_t mask = (<uint64_t> 1 << bits) - 1, slot, h0, h1, d0, d1, x
    cdef int64_t r, k, i, q, ri, rend, off, take, pos = 0, next_id = 0, e, rr
    cdef bint cons
    for i in range(block_size):  # fixed constants: any keep the equality structure
        pk[4 * i] = _mix(<uint64_t> (2 * i + 1) * <uint64_t> 0x9E3779B97F4A7C15)
        pk[4 * i + 1] = _mix(<uint64_t> (2 * i + 2) * <uint64_t> 0xD1B54A32D192ED03)
        pk[4 * i + 2] = _mix(pk[4 * i] + 1) | 1
        pk[4 * i + 3] = _mix(pk[4 * i + 1] + 1) | 1
    with nogil:
        for r in range(req_blocks.shape[0]):
            h0 = <uint64_t> 0x243F6A8885A308D3
            h1 = <uint64_t> 0x13198A2E03707344
            ri = req_run[r]
            rend = req_run[r + 1]
            off = 0  # tokens of run ri already taken
            for k in range(req_blocks[r]):
                if run_len[ri] - off >= block_size:  # inside one run: consecutive ids
                    x = <uint64_t> (run_start[ri] + off)
                    cons = True
                    off += block_size
                else:  # across runs: expand the block; its ids may still be consecutive
                    i = 0
                    while i < block_size:
                        if off == run_len[ri]:
                            ri += 1
                            off = 0
                        take = run_len[ri] - off
                        if take > block_size - i:
                            take = block_size - i
                        for q in range(take):
                            tok[i + q] = <uint64_t> (run_start[ri] + off + q)
                        i += take
                        off += take
                    cons = True
                    for i in range(1, block_size):
                        if tok[i] != tok[0] + <uint64_t> i:
                            cons = False
                            break
                    x = tok[0]
                if off == run_len[ri] and ri + 1 < rend:
                    ri += 1
                    off = 0
                if cons:  # a block of consecutive ids: digested from its first id
                    d0 = _mix(_mix(x ^ <uint64_t> 0x452821E638D01377) + <uint64_t> 0xBE5466CF34E90C6C)
                    d1 = _mix(_mix(x ^ <uint64_t> 0xC0AC29B7C97C50DD) + <uint64_t> 0x3F84D5B5B5470917)
                else:  # token by token: two independent sums of keyed mixes of (position, token)
                    d0 = 0
                    d1 = 0
                    for i in range(block_size):
                        d0 += _mix(tok[i] ^ pk[4 * i]) * pk[4 * i + 2]
                        d1 += _mix(tok[i] ^ pk[4 * i + 1]) * pk[4 * i + 3]
                    d0 = _mix(d0 ^ <uint64_t> 0x9216D5D98979FB1B)
                    d1 = _mix(d1 ^ <uint64_t> 0xD1310BA698DFB5AC)
                e = 0 if k == 0 else 1
                if extra_on[2 * r + e]:
                    d0 = _mix(d0 ^ extra[r, 2 * e])
                    d1 = _mix(d1 ^ extra[r, 2 * e + 1])
                h0 = _mix(h0 * <uint64_t> 0x9FB21C651E98DF25 + d0)  # the chain: parent, then this block
                h1 = _mix((h1 ^ <uint64_t> 0x2FFD72DBD01ADFB7) * <uint64_t> 0xB7E151628AED2A6B + d1)
                hb[2 * k] = h0
                hb[2 * k + 1] = h1
            nb = req_blocks[r]
            for k in range(min(nb, _AHEAD)):  # the request's first slots on their way to the cache
                _prefetch(&table[_slot(hb[2 * k], hb[2 * k + 1], bits)])
            for k in range(nb):  # the table, each probe's slot fetched _AHEAD blocks earlier
                if k + _AHEAD < nb:
                    _prefetch(&table[_slot(hb[2 * (k + _AHEAD)], hb[2 * (k + _AHEAD) + 1], bits)])
                h0 = hb[2 * k]
                h1 = hb[2 * k + 1]
                slot = _slot(h0, h1, bits)
                while True:
                    rr = table[slot] - 1
                    if rr < 0:
                        table[slot] = <int32_t> (next_id + 1)
                        keys[2 * next_id] = h0
                        keys[2 * next_id + 1] = h1
                        out[pos] = next_id
                        next_id += 1
                        break
                    if keys[2 * rr] == h0 and keys[2 * rr + 1] == h1:
                        out[pos] = rr
                        break
                    slot = (slot + 1) & mask
                pos += 1
    return out_arr
