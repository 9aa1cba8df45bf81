# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled fast-hash chain over runs of consecutive ids (mirrors nothing in vLLM: it computes
exactly the keys of :class:`sim.core.hashing.FastBlockHasher`, its numpy oracle, for the common
case of a prompt held as runs and no extra keys).

Per block, in one pass: the block's digest -- from its first id when the block lies in one run of
consecutive ids, else from its tokens, told apart by the tokens themselves (as the numpy code
does) -- then the polynomial chain ``h = P * h + c (mod 2^64)`` per lane (the numpy code's closed
form is the same value) and the splitmix64 finalisation, written as the 16-byte key (lane 0 then
lane 1, little-endian, as numpy's ``view("V16")``), and with ``chain_runs_external`` each key's
event form too. Equality with the numpy path is a test.
Imports neither simpy nor torch.
"""

from cpython cimport array as carray
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

import numpy as np

include "be64.pxi"

cdef carray.array _WORDS = carray.array("Q")  # the template of chain_runs_external's arrays


cdef inline uint64_t _splitmix(uint64_t x) noexcept nogil:
    x = x + <uint64_t>0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * <uint64_t>0x94D049BB133111EB
    return x ^ (x >> 31)


def chain_runs(const int64_t[:] starts, const int64_t[:] lengths, Py_ssize_t n, int bs,
               const uint64_t[:, :] run_keys, const uint64_t[:] pos_key, const uint64_t[:] pos_mult,
               const uint64_t[:, :] lane_keys, const uint64_t[:] mult, uint64_t state0, uint64_t state1):
    """Keys of the first ``n`` full blocks of tokens given as runs ``(starts, lengths)``, chained
    from ``(state0, state1)`` with the hasher's constants; returns ``(keys, (h0, h1))``."""
    return _chain_runs(starts, lengths, n, bs, run_keys, pos_key, pos_mult, lane_keys, mult, state0, state1, None)


def chain_runs_external(const int64_t[:] starts, const int64_t[:] lengths, Py_ssize_t n, int bs,
                        const uint64_t[:, :] run_keys, const uint64_t[:] pos_key, const uint64_t[:] pos_mult,
                        const uint64_t[:, :] lane_keys, const uint64_t[:] mult, uint64_t state0,
                        uint64_t state1):
    """:func:`chain_runs`, and each key's event form (``sim.core.hashing.external_block_hash``: the
    key's last 8 bytes read big-endian) in the same pass, as an ``array('Q')`` (no int object per
    block: the router's index and active blocks read the words in place); returns
    ``(keys, externals, (h0, h1))``. A router needs the event form of every prompt hash it matches
    against KV events."""
    cdef carray.array ext
    if n < 0:
        raise ValueError(f"{n} blocks of {bs} exceed the runs' tokens")
    ext = carray.clone(_WORDS, n, False)
    keys, state = _chain_runs(starts, lengths, n, bs, run_keys, pos_key, pos_mult, lane_keys, mult, state0, state1,
                              ext)
    return keys, ext, state


cdef tuple _chain_runs(const int64_t[:] starts, const int64_t[:] lengths, Py_ssize_t n, int bs,
                       const uint64_t[:, :] run_keys, const uint64_t[:] pos_key, const uint64_t[:] pos_mult,
                       const uint64_t[:, :] lane_keys, const uint64_t[:] mult, uint64_t state0, uint64_t state1,
                       carray.array ext):
    """The chain (``ext``: an ``array('Q')`` of ``n`` words to fill with the event forms, or None)."""
    cdef unsigned long long* words = ext.data.as_ulonglongs if ext is not None else NULL
    cdef Py_ssize_t i, k, r = 0, rr
    cdef int64_t b0, t0, t
    cdef uint64_t c0, c1, m, s0, s1, h0 = state0, h1 = state1, f0, f1
    cdef bint cons
    cdef list keys = PyList_New(n)
    cdef object key
    cdef char* out
    cdef int64_t[:] ends = _cumsum(lengths)  # end (exclusive) of each run
    cdef uint64_t ka0 = run_keys[0, 0], kb0 = run_keys[0, 1], ka1 = run_keys[1, 0], kb1 = run_keys[1, 1]
    cdef uint64_t l0 = lane_keys[0, 0], l1 = lane_keys[1, 0], p0 = mult[0], p1 = mult[1]
    if n < 0 or (n and (starts.shape[0] == 0 or n * bs > ends[ends.shape[0] - 1])) or pos_key.shape[0] < bs:
        raise ValueError(f"{n} blocks of {bs} exceed the runs' tokens")
    for i in range(n):
        b0 = i * bs
        while ends[r] <= b0:
            r += 1
        t0 = starts[r] + (b0 - (ends[r] - lengths[r]))
        if ends[r] >= b0 + bs:
            cons = True  # the block lies in one run of consecutive ids
        else:
            # across runs: consecutive only if the tokens happen to be; the token digest decides
            cons = True
            rr = r
            for k in range(bs):
                while ends[rr] <= b0 + k:
                    rr += 1
                t = starts[rr] + (b0 + k - (ends[rr] - lengths[rr]))
                if t != t0 + k:
                    cons = False
                    break
        if cons:
            c0 = _splitmix(_splitmix(<uint64_t>t0 ^ ka0) ^ kb0)
            c1 = _splitmix(_splitmix(<uint64_t>t0 ^ ka1) ^ kb1)
        else:
            s0 = 0
            s1 = 0
            rr = r
            for k in range(bs):
                while ends[rr] <= b0 + k:
                    rr += 1
                t = starts[rr] + (b0 + k - (ends[rr] - lengths[rr]))
                m = _splitmix(<uint64_t>t ^ pos_key[k])
                s0 += m
                s1 += m * pos_mult[k]
            c0 = _splitmix(s0 ^ l0)
            c1 = _splitmix(s1 ^ l1)
        h0 = p0 * h0 + c0
        h1 = p1 * h1 + c1
        f0 = _splitmix(h0)
        f1 = _splitmix(h1)
        key = PyBytes_FromStringAndSize(NULL, 16)
        out = PyBytes_AS_STRING(key)
        memcpy(out, &f0, 8)
        memcpy(out + 8, &f1, 8)
        Py_INCREF(key)  # PyList_SET_ITEM steals a reference
        PyList_SET_ITEM(keys, i, key)
        if words != NULL:  # the event form: bytes 8..15 read big-endian (be64.pxi)
            words[i] = _be64(<const unsigned char*>out + 8)
    return keys, (h0, h1)


cdef int64_t[:] _cumsum(const int64_t[:] lengths):
    cdef int64_t[:] out = np.empty(lengths.shape[0], dtype=np.int64)
    cdef int64_t acc = 0
    cdef Py_ssize_t i
    for i in range(lengths.shape[0]):
        acc += lengths[i]
        out[i] = acc
    return out
