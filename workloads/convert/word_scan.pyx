# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled loops of ``apcsim convert``'s tokenizer caches (``workloads.convert.word_cache``,
``workloads.convert.tokenizer``; mirrors nothing in vLLM), each equal to an interpreted definition
kept beside it (the fallback where this is not built, and the tests' oracle).

* ``known(pieces, first, later)``: each piece cut at its cut points -- a space followed by an
  ASCII letter, the space starting the word after it -- and its words looked up in the two tables
  in one pass over the text, giving per piece the concatenation of ``first[word 0]`` and
  ``later[word k]`` (later words keyed without their space) less the last character (the trailing
  comma), or None when some word is in neither table (``word_cache.known_words``).
* ``cut(texts, firsts)``: each text cut at the tokenizer's added tokens, leftmost first and the
  longest at a place, as ``re.split`` with the alternation of the tokens (longest first) cuts it:
  ``text, token, text, ..., text`` (``tokenizer.cut_texts``). ``firsts`` maps a token's first
  character to the tokens starting with it, longest first.
* ``fill(cuts, cache, first, later)``: every part of ``cuts`` missing from the segment cache whose
  words are all known is put in it as ``(ids text, count, None)``; the parts with a word in
  neither table are returned, first seen first (``word_cache.fill_known``).
* ``missing`` / ``joined``: the segment cache's missing parts, and each list of parts' ids text
  and count (``tokenizer.missing_parts`` / ``joined_parts``).
* ``WordTable`` / ``fill_tables`` (``word_table.pxi``): ``fill`` with the words looked up in
  compiled tables, without a str per word.
* ``message_rows`` / ``resolve_rows``: a batch's message texts from the split template's cache,
  and the keys left to render (``template_parts.message_rows`` / ``resolve_rows``).
* ``key_marks(raw)`` / ``count_keys(obj)``: the checks that let a record decoded by msgspec stand
  for the strict decoder's (``json_record.key_marks`` / ``count_keys``): the ``":`` in a JSON
  text (-1 when a quote is followed by whitespace and a colon), and the keys of a decoded value's
  objects (-1 past a depth).

``tests/test_convert_word_scan.py`` checks each against its definition on random texts. Imports
nothing.
"""

from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_Tailmatch
from libc.string cimport memchr


cdef object _known_one(str piece, dict first, dict later):
    """One piece's ids text from the word tables, or None (see ``known``)."""
    cdef list acc = []
    cdef str word
    cdef Py_ssize_t i, start = 0, n = len(piece)
    cdef Py_UCS4 c
    cdef PyObject* hit
    cdef dict table = first
    for i in range(n - 1):
        if piece[i] == u" ":
            c = piece[i + 1]
            if (u"a" <= c <= u"z") or (u"A" <= c <= u"Z"):
                word = piece[start:i]
                hit = PyDict_GetItem(table, word)
                if hit is NULL:
                    return None
                acc.append(<object>hit)
                table = later
                start = i + 1
    word = piece[start:n]
    hit = PyDict_GetItem(table, word)
    if hit is NULL:
        return None
    acc.append(<object>hit)
    word = u"".join(acc)
    n = len(word)
    return word[:n - 1] if n else word  # less the trailing comma (no negative index: wraparound is off)


def known(list pieces, dict first, dict later):
    cdef list out = []
    cdef str piece
    for piece in pieces:
        out.append(_known_one(piece, first, later))
    return out


def cut(list texts, dict firsts):
    cdef list out = []
    cdef list parts
    cdef str text, token, key
    cdef Py_ssize_t i, start, n
    cdef Py_UCS4 c
    cdef Py_UCS4 marks[32]
    cdef int count = 0, k
    cdef bint many = len(firsts) > 32, found
    cdef PyObject* hit
    if not many:
        for key in firsts:
            marks[count] = key[0]
            count += 1
    for text in texts:
        parts = []
        start = 0
        i = 0
        n = len(text)
        while i < n:
            c = text[i]
            found = many
            for k in range(count):
                if marks[k] == c:
                    found = True
                    break
            if found:
                hit = PyDict_GetItem(firsts, c)
                if hit is not NULL:
                    for token in <tuple>hit:
                        if PyUnicode_Tailmatch(text, token, i, n, -1):
                            parts.append(text[start:i])
                            parts.append(token)
                            i += len(token)
                            start = i
                            break
                    else:
                        i += 1
                    continue
            i += 1
        parts.append(text[start:n])
        out.append(parts)
    return out


def fill(list cuts, dict cache, dict first, dict later):
    cdef dict unknown = {}
    cdef list parts
    cdef str part
    cdef object text
    for parts in cuts:
        for part in parts:
            if not part or PyDict_GetItem(cache, part) is not NULL or PyDict_GetItem(unknown, part) is not NULL:
                continue
            text = _known_one(part, first, later)
            if text is None:
                unknown[part] = None
            else:
                cache[part] = (text, (<str>text).count(u",") + 1 if text else 0, None)
    return list(unknown)


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


def key_marks(bytes raw):
    cdef const char* s = raw
    cdef const char* hit
    cdef Py_ssize_t n = len(raw), i = 0, j, count = 0
    while i < n:
        hit = <const char*>memchr(s + i, 34, n - i)  # the next double quote
        if hit is NULL:
            break
        j = hit - s + 1
        if j < n and s[j] == 58:  # ':'
            count += 1
        else:
            while j < n and (s[j] == 32 or s[j] == 9 or s[j] == 10 or s[j] == 13):
                j += 1
            if j < n and s[j] == 58 and j > hit - s + 1:
                return -1
        i = hit - s + 1
    return count


cdef Py_ssize_t _keys(object value, int depth):
    cdef Py_ssize_t total = 0, sub
    cdef object item
    if depth > 200:
        return -1
    if type(value) is dict:
        total = len(<dict>value)
        for item in (<dict>value).values():
            if type(item) is dict or type(item) is list:
                sub = _keys(item, depth + 1)
                if sub < 0:
                    return -1
                total += sub
    elif type(value) is list:
        for item in <list>value:
            if type(item) is dict or type(item) is list:
                sub = _keys(item, depth + 1)
                if sub < 0:
                    return -1
                total += sub
    return total


def count_keys(value):
    return _keys(value, 0)



def message_rows(list chats, tuple keys, dict cache):
    cdef dict todo = {}
    cdef list rows = [], row, values
    cdef object messages, m, v, key
    cdef PyObject* hit
    cdef str k
    for messages in chats:
        row = []
        for m in messages:
            if type(m) is not dict:
                row = None
                break
            values = []
            for k in keys:
                hit = PyDict_GetItem(<dict>m, k)
                if hit is NULL or type(<object>hit) is not str:
                    row = None
                    break
                values.append(<object>hit)
            if row is None:
                break
            key = tuple(values)
            hit = PyDict_GetItem(cache, key)
            if hit is NULL:
                if PyDict_GetItem(todo, key) is NULL:
                    todo[key] = m
                row.append(key)
            else:
                row.append(<object>hit)
        rows.append(row)
    return rows, todo


def resolve_rows(list rows, dict rendered):
    cdef list out = [], row, done
    cdef object entry
    cdef PyObject* hit
    for row in rows:
        if row is not None:
            done = []
            for entry in row:
                if type(entry) is str:
                    done.append(entry)
                else:
                    hit = PyDict_GetItem(rendered, entry)
                    if hit is NULL:
                        done = None
                        break
                    done.append(<object>hit)
            row = done
        out.append(row)
    return out


include "word_table.pxi"
