# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled line scanner of canonical JSONL traces (mirrors nothing in vLLM: it is how
``workloads.trace_format`` reads 50 M token ids without building Python ints).

``scan_lines(buf, final)`` splits a chunk of the file into lines and, on each line, walks the top
level of the JSON object just far enough to find the ``tokens`` and ``output_token_ids`` arrays. An
array of plain non-negative decimal ints is parsed here, straight into runs of consecutive ids
(``starts``, ``lengths``) or, when runs are short, one int64 array; its bytes are then replaced by
``0`` so that ``json`` parses only the small rest of the line. Anything unusual -- a minus sign, a
float, a leading zero, an id of 2**62 or more, an escaped key, an empty or nested array, a
structural surprise -- sends the whole line to the slow path (``json`` over the line, then the
field checks of ``workloads.trace_format``), which reports the precise error; so this scanner
never decides that a line is bad, only that it is plain.

Invariant: a line the scanner accepts parses, after the substitution, to exactly the object
``json.loads`` gives for the original line, with the arrays' values as returned. Imports numpy.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memchr, memcmp, memcpy

cnp.import_array()

cdef uint64_t ID_LIMIT = (<uint64_t>1) << 62

# what a line's top-level value scan found
cdef enum:
    BLANK = 0
    FAST = 1
    SLOW = 2

TARGET_KEYS = ("tokens", "output_token_ids")
"""The keys whose int arrays are parsed here, by ``key_index``."""


cdef class _Buffers:
    """Growable C buffers reused across arrays and calls: run starts and run lengths. The runs
    are all that is kept of an array while it is parsed (its ids are ``starts[i] + 0..lengths[i]``):
    storing every id as well would write 8 more bytes per id, most of them never read."""

    cdef int64_t* rs
    cdef int64_t* rl
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.cap = 0
        self.rs = self.rl = NULL

    cdef int grow(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap = self.cap if self.cap else 4096
        while cap < need:
            cap *= 2
        if cap == self.cap:
            return 0
        cdef int64_t* a = <int64_t*>realloc(self.rs, cap * sizeof(int64_t))
        if a == NULL:
            raise MemoryError()
        self.rs = a
        a = <int64_t*>realloc(self.rl, cap * sizeof(int64_t))
        if a == NULL:
            raise MemoryError()
        self.rl = a
        self.cap = cap
        return 0

    def __dealloc__(self):
        free(self.rs)
        free(self.rl)


cdef inline bint _ws(unsigned char c) noexcept nogil:
    return c == 32 or c == 9 or c == 13 or c == 10


cdef inline Py_ssize_t _skip_ws(const unsigned char* s, Py_ssize_t p, Py_ssize_t end) noexcept nogil:
    while p < end and _ws(s[p]):
        p += 1
    return p


cdef Py_ssize_t _skip_string(const unsigned char* s, Py_ssize_t p, Py_ssize_t end, bint* escaped) noexcept nogil:
    """``s[p]`` is the opening quote; the position after the closing one, or -1."""
    p += 1
    while p < end:
        if s[p] == 34:  # "
            return p + 1
        if s[p] == 92:  # backslash: skip the escaped character
            escaped[0] = True
            p += 2
            continue
        p += 1
    return -1


cdef Py_ssize_t _skip_value(const unsigned char* s, Py_ssize_t p, Py_ssize_t end) noexcept nogil:
    """Skip one JSON value starting at ``s[p]`` without validating it; -1 on a structural surprise."""
    cdef int depth = 0
    cdef bint esc = False
    cdef unsigned char c
    if p >= end:
        return -1
    c = s[p]
    if c == 34:
        return _skip_string(s, p, end, &esc)
    if c == 91 or c == 123:  # [ {
        while p < end:
            c = s[p]
            if c == 34:
                p = _skip_string(s, p, end, &esc)
                if p < 0:
                    return -1
                continue
            if c == 91 or c == 123:
                depth += 1
            elif c == 93 or c == 125:  # ] }
                depth -= 1
                if depth == 0:
                    return p + 1
            p += 1
        return -1
    # a number or a literal: up to the next delimiter
    while p < end and not (_ws(s[p]) or s[p] == 44 or s[p] == 125 or s[p] == 93):
        p += 1
    return p


cdef extern from *:
    int __builtin_ctzll(unsigned long long x) nogil

cdef uint64_t[9] POW10 = [1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000]


cdef inline int _digits8(uint64_t w) noexcept nogil:
    """How many of the 8 bytes of ``w`` (little-endian: first byte lowest) lead as ASCII digits.
    A digit byte has high nibble 3 and stays below 0x40 when 6 is added; carries run upwards, so
    the lowest non-digit byte is flagged exactly."""
    cdef uint64_t bad = ((w & <uint64_t>0xF0F0F0F0F0F0F0F0) ^ <uint64_t>0x3030303030303030) | (
        ((w + <uint64_t>0x0606060606060606) & <uint64_t>0xF0F0F0F0F0F0F0F0) ^ <uint64_t>0x3030303030303030)
    if bad == 0:
        return 8
    return __builtin_ctzll(bad) >> 3


cdef inline uint64_t _parse_digits(uint64_t w, int k) noexcept nogil:
    """The value of the first ``k`` (1..8) digit bytes of ``w``: shifted up so that zero bytes
    stand in as leading zeros, then the classic SWAR conversion of 8 digits."""
    w = (w - <uint64_t>0x3030303030303030) << (8 * (8 - k))
    w = w * 10 + (w >> 8)
    return (((w & <uint64_t>0x000000FF000000FF) * <uint64_t>0x000F424000000064)
            + (((w >> 16) & <uint64_t>0x000000FF000000FF) * <uint64_t>0x0000271000000001)) >> 32


cdef Py_ssize_t _scan_ints(const unsigned char* s, Py_ssize_t p, Py_ssize_t end, Py_ssize_t limit, _Buffers b,
                           Py_ssize_t* n_tok, Py_ssize_t* n_runs) except -2:
    """Parse ``[int, ...]`` at ``s[p]`` into ``b`` (as runs); the position after ``]``, or
    -1 when the array is not a plain non-empty list of ids in [0, 2**62). ``limit`` is where the
    buffer ends (8 bytes are read at a time while they fit; a line ends with a non-digit)."""
    cdef Py_ssize_t n = 0, r = 0, digits
    cdef uint64_t v, w
    cdef int k
    cdef int64_t prev = -2
    cdef unsigned char c
    b.grow((end - p) // 2 + 2)  # an id takes at least 2 bytes with its comma
    p = _skip_ws(s, p + 1, end)
    if p >= end or s[p] == 93:
        return -1  # empty: the slow path says so
    while True:
        if p >= end:
            return -1
        c = s[p]
        if c < 48 or c > 57:
            return -1
        if c == 48 and p + 1 < end and 48 <= s[p + 1] <= 57:
            return -1  # a leading zero is not JSON
        v = 0
        digits = 0
        while p + 8 <= limit:
            memcpy(&w, s + p, 8)
            k = _digits8(w)
            if k:
                v = v * POW10[k] + _parse_digits(w, k)
                digits += k
                p += k
            if k < 8 or digits > 19:
                break
        else:
            while p < end and 48 <= s[p] <= 57:
                v = v * 10 + (s[p] - 48)
                digits += 1
                p += 1
                if digits > 19:
                    return -1
        if digits > 19:
            return -1
        if v >= ID_LIMIT:
            return -1
        if p < end and (s[p] == 46 or s[p] == 101 or s[p] == 69):  # . e E: not an int
            return -1
        if <int64_t>v == prev + 1:
            b.rl[r - 1] += 1
        else:
            b.rs[r] = <int64_t>v
            b.rl[r] = 1
            r += 1
        prev = <int64_t>v
        n += 1
        p = _skip_ws(s, p, end)
        if p >= end:
            return -1
        if s[p] == 44:  # ,
            p = _skip_ws(s, p + 1, end)
            continue
        if s[p] == 93:  # ]
            n_tok[0] = n
            n_runs[0] = r
            return p + 1
        return -1


cdef object _array_value(_Buffers b, Py_ssize_t n, Py_ssize_t r):
    """The parsed ids: ``(starts, lengths)`` when runs average 4 ids or more, else the id array
    (the runs expanded)."""
    cdef cnp.ndarray out
    cdef cnp.ndarray lens
    cdef int64_t* dst
    cdef int64_t* dst2
    cdef Py_ssize_t i, j, k = 0
    cdef int64_t v
    if r * 4 <= n:
        out = np.empty(r, dtype=np.int64)
        lens = np.empty(r, dtype=np.int64)
        dst = <int64_t*>cnp.PyArray_DATA(out)
        dst2 = <int64_t*>cnp.PyArray_DATA(lens)
        for i in range(r):
            dst[i] = b.rs[i]
            dst2[i] = b.rl[i]
        return (out, lens)
    out = np.empty(n, dtype=np.int64)
    dst = <int64_t*>cnp.PyArray_DATA(out)
    for i in range(r):
        v = b.rs[i]
        for j in range(b.rl[i]):
            dst[k] = v + j
            k += 1
    return out


cdef object _scan_line(const unsigned char* s, Py_ssize_t p, Py_ssize_t end, Py_ssize_t limit, _Buffers b):
    """``(BLANK, None)``, ``(SLOW, None)`` or ``(FAST, [(key_index, start, stop, value), ...])``."""
    cdef Py_ssize_t ks, ke, vs, ve, n_tok = 0, n_runs = 0
    cdef bint esc
    cdef int key_index
    p = _skip_ws(s, p, end)
    if p >= end:
        return (BLANK, None)
    if s[p] != 123:
        return (SLOW, None)
    subs = []
    p = _skip_ws(s, p + 1, end)
    if p < end and s[p] == 125:
        p += 1
    else:
        while True:
            if p >= end or s[p] != 34:
                return (SLOW, None)
            esc = False
            ks = p + 1
            p = _skip_string(s, p, end, &esc)
            if p < 0:
                return (SLOW, None)
            ke = p - 1
            p = _skip_ws(s, p, end)
            if p >= end or s[p] != 58:  # :
                return (SLOW, None)
            p = _skip_ws(s, p + 1, end)
            key_index = -1
            if not esc and p < end and s[p] == 91:
                if ke - ks == 6 and memcmp(s + ks, b"tokens", 6) == 0:
                    key_index = 0
                elif ke - ks == 16 and memcmp(s + ks, b"output_token_ids", 16) == 0:
                    key_index = 1
            vs = p
            if key_index >= 0:
                p = _scan_ints(s, p, end, limit, b, &n_tok, &n_runs)
                if p < 0:
                    return (SLOW, None)
                subs.append((key_index, vs, p, _array_value(b, n_tok, n_runs)))
            else:
                p = _skip_value(s, p, end)
                if p < 0:
                    return (SLOW, None)
            p = _skip_ws(s, p, end)
            if p < end and s[p] == 44:
                p = _skip_ws(s, p + 1, end)
                continue
            if p < end and s[p] == 125:
                p += 1
                break
            return (SLOW, None)
    if _skip_ws(s, p, end) != end:
        return (SLOW, None)  # something after the object
    return (FAST, subs)


cdef _Buffers _SCRATCH = _Buffers()  # shared by every call: a call holds the GIL throughout and
# copies each array out (``_array_value``) before the next is parsed, so no two uses overlap


def scan_lines(const unsigned char[::1] buf, Py_ssize_t n, bint final):
    """Split ``buf[:n]`` into lines and scan each (see the module docstring).

    Returns ``(lines, consumed)``: ``lines`` is a list of ``(start, stop, kind, subs)`` per complete
    line (``stop`` excludes the newline; ``kind`` 0 blank, 1 fast, 2 slow; ``subs`` the parsed
    arrays of a fast line as ``(key_index, start, stop, value)``, offsets into ``buf``), and
    ``consumed`` the offset where the unfinished last line starts (``n`` if ``final``).
    """
    cdef const unsigned char* s = &buf[0] if buf.shape[0] else NULL
    cdef Py_ssize_t p = 0, q
    cdef const unsigned char* nl
    cdef _Buffers b = _SCRATCH  # reused: a fresh buffer per chunk would fault in new pages every time
    lines = []
    if n > buf.shape[0]:
        raise ValueError("n is past the end of the buffer")
    while p < n:
        nl = <const unsigned char*>memchr(s + p, 10, n - p)
        q = n if nl == NULL else nl - s
        if q == n and not final:
            break
        kind, subs = _scan_line(s, p, q, n, b)
        lines.append((p, q, kind, subs))
        p = q + 1
    return lines, min(p, n)
