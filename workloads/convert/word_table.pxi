# The compiled word tables of ``word_scan.pyx`` (included there): ``WordTable``, a word -> ids text
# table looked up by a slice of a text's code points (FNV-1a over the code points, open addressing),
# so that a piece's words are looked up without a str object per word; ``fill_tables``, ``fill``
# over two such tables (the mirrors of ``WordCache``'s dicts). Equal to ``word_cache.fill_known``
# over the dicts (tests/test_convert_word_scan.py).

cdef extern from "Python.h":
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    unsigned int PyUnicode_READ(int kind, void* data, Py_ssize_t index)  # a code point (Py_UCS4) as a number
    object PyUnicode_DecodeASCII(const char* s, Py_ssize_t size, const char* errors)

from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy


cdef struct Slot:
    unsigned long long h  # the word's hash (never 0); 0: an empty slot
    Py_ssize_t klen
    unsigned int* key  # the word's code points
    char* val  # its ids text (ASCII)
    Py_ssize_t vlen


cdef unsigned long long FNV_START = 14695981039346656037ULL


cdef inline unsigned long long _mix(unsigned long long h, unsigned int c):
    return (h ^ c) * 1099511628211ULL


cdef inline unsigned long long _final(unsigned long long h):
    return h if h else 1


cdef class WordTable:
    """A word -> ids text table looked up by a slice of a text's code points, without a str per
    word (``fill_tables``); a mirror of one of ``WordCache``'s dicts."""

    cdef Slot* slots
    cdef Py_ssize_t mask, size

    def __cinit__(self):
        self.slots = <Slot*>calloc(1024, sizeof(Slot))
        if self.slots is NULL:
            raise MemoryError()
        self.mask = 1023
        self.size = 0

    def __dealloc__(self):
        if self.slots is not NULL:
            self._release()
            free(self.slots)

    cdef void _release(self):
        cdef Py_ssize_t i
        for i in range(self.mask + 1):
            if self.slots[i].h:
                free(self.slots[i].key)
                free(self.slots[i].val)
                self.slots[i].h = 0

    def clear(self):
        self._release()
        self.size = 0

    def __len__(self):
        return self.size

    cdef Slot* _find(self, int kind, void* data, Py_ssize_t start, Py_ssize_t end, unsigned long long h):
        cdef Py_ssize_t i = <Py_ssize_t>(h & <unsigned long long>self.mask), k
        cdef Slot* s
        while self.slots[i].h:
            s = &self.slots[i]
            if s.h == h and s.klen == end - start:
                for k in range(s.klen):
                    if s.key[k] != PyUnicode_READ(kind, data, start + k):
                        break
                else:
                    return s
            i = (i + 1) & self.mask
        return NULL

    cdef void _grow(self) except *:
        cdef Slot* old = self.slots
        cdef Py_ssize_t n = self.mask + 1, i, j
        self.slots = <Slot*>calloc(2 * n, sizeof(Slot))
        if self.slots is NULL:
            self.slots = old
            raise MemoryError()
        self.mask = 2 * n - 1
        for i in range(n):
            if old[i].h:
                j = <Py_ssize_t>(old[i].h & <unsigned long long>self.mask)
                while self.slots[j].h:
                    j = (j + 1) & self.mask
                self.slots[j] = old[i]
        free(old)

    def add(self, str word, str text):
        """Set ``word``'s ids text (ASCII)."""
        cdef bytes raw = text.encode("ascii")
        cdef int kind = PyUnicode_KIND(word)
        cdef void* data = PyUnicode_DATA(word)
        cdef Py_ssize_t n = len(word), k
        cdef unsigned long long h = FNV_START
        cdef Slot* s
        cdef char* val
        for k in range(n):
            h = _mix(h, PyUnicode_READ(kind, data, k))
        h = _final(h)
        val = <char*>malloc(len(raw) + 1)
        if val is NULL:
            raise MemoryError()
        memcpy(val, <const char*>raw, len(raw))
        s = self._find(kind, data, 0, n, h)
        if s is not NULL:
            free(s.val)
            s.val, s.vlen = val, len(raw)
            return
        if 2 * (self.size + 1) > self.mask + 1:
            self._grow()
        k = <Py_ssize_t>(h & <unsigned long long>self.mask)
        while self.slots[k].h:
            k = (k + 1) & self.mask
        s = &self.slots[k]
        s.key = <unsigned int*>malloc((n + 1) * sizeof(unsigned int))
        if s.key is NULL:
            free(val)
            raise MemoryError()
        for k in range(n):
            s.key[k] = PyUnicode_READ(kind, data, k)
        s.h, s.klen, s.val, s.vlen = h, n, val, len(raw)
        self.size += 1


cdef object _known_table(str piece, WordTable first, WordTable later, char** buf, Py_ssize_t* cap):
    """``_known_one`` over the tables: the ids text, or None (a word in neither)."""
    cdef int kind = PyUnicode_KIND(piece)
    cdef void* data = PyUnicode_DATA(piece)
    cdef Py_ssize_t n = len(piece), i, start = 0, used = 0
    cdef unsigned long long h = FNV_START
    cdef unsigned int c
    cdef WordTable table = first
    cdef Slot* s
    cdef char* grown
    i = 0
    while True:
        if i == n:
            c = 0
        else:
            c = PyUnicode_READ(kind, data, i)
        if i == n or (c == 32 and i + 1 < n and (
                (97 <= PyUnicode_READ(kind, data, i + 1) <= 122) or (65 <= PyUnicode_READ(kind, data, i + 1) <= 90))):
            s = table._find(kind, data, start, i, _final(h))
            if s is NULL:
                return None
            if used + s.vlen > cap[0]:
                grown = <char*>realloc(buf[0], 2 * (used + s.vlen))
                if grown is NULL:
                    raise MemoryError()
                buf[0], cap[0] = grown, 2 * (used + s.vlen)
            memcpy(buf[0] + used, s.val, s.vlen)
            used += s.vlen
            if i == n:
                break
            table = later
            start = i + 1
            h = FNV_START
        else:
            h = _mix(h, c)
        i += 1
    return PyUnicode_DecodeASCII(buf[0], used - 1 if used else 0, NULL)  # less the trailing comma


def fill_tables(list cuts, dict cache, WordTable first, WordTable later):
    """``fill`` with the words looked up in :class:`WordTable` mirrors of the two dicts."""
    cdef dict unknown = {}
    cdef list parts
    cdef str part
    cdef object text
    cdef Py_ssize_t cap = 4096
    cdef char* buf = <char*>malloc(cap)
    if buf is NULL:
        raise MemoryError()
    try:
        for parts in cuts:
            for part in parts:
                if not part or PyDict_GetItem(cache, part) is not NULL or PyDict_GetItem(unknown, part) is not NULL:
                    continue
                text = _known_table(part, first, later, &buf, &cap)
                if text is None:
                    unknown[part] = None
                else:
                    cache[part] = (text, (<str>text).count(u",") + 1 if text else 0, None)
    finally:
        free(buf)
    return list(unknown)
