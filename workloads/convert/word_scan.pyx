# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled loop of ``apcsim convert``'s word cache (``workloads.convert.word_cache``; mirrors
nothing in vLLM): each piece cut at its cut points -- a space followed by an ASCII letter, the space
starting the word after it -- and its words looked up in the two tables, in one pass over the
text, without the word list, the per-word Python loop or the join of the interpreted path.

``known(pieces, first, later)`` gives, per piece, the concatenation of ``first[word 0]`` and
``later[word k]`` (later words keyed without their space) with the last character (the trailing
comma) dropped, or None when some word is in neither table (the caller learns the piece's new words
and takes its interpreted path). ``known`` equals ``word_cache.known_words``, the interpreted
definition (``tests/test_convert_words.py`` checks both on random texts). Imports nothing.
"""

from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject


def known(list pieces, dict first, dict later):
    cdef list out = []
    cdef list acc
    cdef str piece, word
    cdef Py_ssize_t i, start, n
    cdef Py_UCS4 c
    cdef PyObject* hit
    cdef dict table
    cdef bint ok
    for piece in pieces:
        n = len(piece)
        start = 0
        table = first
        acc = []
        ok = True
        for i in range(n - 1):
            if piece[i] == u" ":
                c = piece[i + 1]
                if (u"a" <= c <= u"z") or (u"A" <= c <= u"Z"):
                    word = piece[start:i]
                    hit = PyDict_GetItem(table, word)
                    if hit is NULL:
                        ok = False
                        break
                    acc.append(<object>hit)
                    table = later
                    start = i + 1
        if ok:
            word = piece[start:n]
            hit = PyDict_GetItem(table, word)
            if hit is NULL:
                ok = False
            else:
                acc.append(<object>hit)
        out.append(u"".join(acc)[:-1] if ok else None)
    return out


def missing(list cuts, dict cache):
    """The distinct non-empty parts of ``cuts`` (lists of text parts) not in ``cache``, first seen
    first (``tokenizer.missing_parts``, the interpreted definition, gives the same set)."""
    cdef dict seen = {}
    cdef list parts
    cdef str part
    for parts in cuts:
        for part in parts:
            if part and PyDict_GetItem(cache, part) is NULL:
                seen[part] = None
    return list(seen)


def joined(list cuts, dict cache):
    """Per list of parts, ``(",".join of the parts' id texts, total count)`` from ``cache``'s
    ``(text, count, ids)`` entries, parts with no ids skipped (``tokenizer.joined_parts``, the
    interpreted definition)."""
    cdef list out = []
    cdef list parts, texts
    cdef str part
    cdef tuple entry
    cdef Py_ssize_t total, count
    for parts in cuts:
        texts = []
        total = 0
        for part in parts:
            if part:
                entry = <tuple>cache[part]
                count = entry[1]
                if count:
                    texts.append(entry[0])
                    total += count
        out.append((u",".join(texts), total))
    return out
