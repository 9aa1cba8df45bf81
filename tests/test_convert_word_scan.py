"""The compiled loops of the convert caches (``workloads/convert/word_scan.pyx``) equal their
interpreted definitions (``word_cache.known_words`` / ``fill_known``, ``tokenizer.missing_parts`` /
``joined_parts``, ``re.split`` for the cut at added tokens) on random texts: spaces before
letters, digits, punctuation, newlines, accents, empty pieces and words, words in one table only,
added tokens that overlap, nest or share a first character."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.convert.tokenizer import Encoded, joined_parts, missing_parts
from workloads.convert.word_cache import fill_known, known_words, split_words

word_scan = pytest.importorskip("workloads.convert.word_scan")

_text = st.lists(st.sampled_from(["a", "Z", " ", "  ", "\n", "é", ",", "1", "x y", " q", "ü "]),
                 max_size=8).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(_text, max_size=6), st.data())
def test_known_equals_the_interpreted_lookup(pieces: list[str], data: st.DataObject) -> None:
    words = [split_words(p) for p in pieces]
    first = {c[0]: f"{len(c[0])}," for c in words if data.draw(st.booleans())}
    later = {w: f"{len(w)},{len(w)}," for c in words for w in c[1:] if data.draw(st.integers(0, 5))}
    first[data.draw(_text)] = "9,"  # a word no piece has
    assert word_scan.known(pieces, first, later) == known_words(pieces, first, later)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_text, max_size=5), max_size=5), st.data())
def test_missing_and_joined_equal_the_interpreted_loops(cuts: list[list[str]], data: st.DataObject) -> None:
    parts = sorted({p for c in cuts for p in c})
    cache: dict[str, Encoded] = {p: (str(len(p)), data.draw(st.integers(0, 3)), None)
                                 for p in parts if data.draw(st.booleans())}
    assert sorted(word_scan.missing(cuts, cache)) == sorted(missing_parts(cuts, cache))
    full: dict[str, Encoded] = {p: cache.get(p, ("7,8", 2, None)) for p in parts}
    assert word_scan.joined(cuts, full) == joined_parts(cuts, full)


@settings(max_examples=300, deadline=None)
@given(st.lists(_text, max_size=6), st.data())
def test_fill_equals_the_interpreted_fill(pieces: list[str], data: st.DataObject) -> None:
    cuts = [split_words(p) for p in pieces]  # lists of parts (words as parts: spaces inside some)
    words = [split_words(part) for c in cuts for part in c]
    first = {c[0]: f"{len(c[0])}," for c in words if data.draw(st.booleans())}
    later = {w: f"{len(w)},{len(w)}," for c in words for w in c[1:] if data.draw(st.integers(0, 5))}
    first[""] = ""  # a word without ids
    cache: dict[str, Encoded] = {p: ("5", 1, None) for c in cuts for p in c if data.draw(st.integers(0, 3)) == 0}
    mine = dict(cache)
    assert word_scan.fill(cuts, cache, first, later) == fill_known(cuts, mine, first, later)
    assert cache == mine


_tokens = st.lists(st.sampled_from(["<a>", "<a", "<ab>", "<", "[x]", "[x]]", "é>", "<a><a>", "aa", "a"]),
                   min_size=1, max_size=5, unique=True)
_marked = st.lists(st.sampled_from(["<a>", "<a", "<ab>", "<", "[x]", "]", "é", ">", "a", " b", "<a><a>", "\n"]),
                   max_size=10).map("".join)


@settings(max_examples=400, deadline=None)
@given(_tokens, st.lists(_marked, max_size=5))
def test_cut_equals_the_regex_split(tokens: list[str], texts: list[str]) -> None:
    alternatives = sorted(tokens, key=len, reverse=True)  # as the tokenizer orders them
    split = re.compile("(" + "|".join(re.escape(a) for a in alternatives) + ")")
    firsts: dict[str, list[str]] = {}
    for token in alternatives:
        firsts.setdefault(token[0], []).append(token)
    assert word_scan.cut(texts, {c: tuple(t) for c, t in firsts.items()}) == [split.split(t) for t in texts]


def test_cut_with_many_first_characters() -> None:
    tokens = [f"{chr(0x41 + k)}{k}>" for k in range(40)]  # more first characters than the compiled marks hold
    split = re.compile("(" + "|".join(re.escape(a) for a in sorted(tokens, key=len, reverse=True)) + ")")
    firsts = {t[0]: (t,) for t in tokens}
    texts = ["A0>xB1>" + "".join(tokens[::3]) + "zz", "", "plain", "Z25>Z26>"]
    assert word_scan.cut(texts, firsts) == [split.split(t) for t in texts]


def _tables(first: dict[str, str], later: dict[str, str]) -> tuple[Any, Any]:
    tables = (word_scan.WordTable(), word_scan.WordTable())
    for table, words in zip(tables, (first, later), strict=True):
        for word, text in words.items():
            table.add(word, text)
    return tables


@settings(max_examples=300, deadline=None)
@given(st.lists(_text, max_size=6), st.data())
def test_fill_over_the_compiled_tables_equals_the_interpreted_fill(pieces: list[str], data: st.DataObject) -> None:
    cuts = [split_words(p) for p in pieces]
    words = [split_words(part) for c in cuts for part in c]
    first = {c[0]: f"{len(c[0])}," for c in words if data.draw(st.booleans())}
    later = {w: f"{len(w)},{len(w)}," for c in words for w in c[1:] if data.draw(st.integers(0, 5))}
    if data.draw(st.booleans()):
        first[""] = ""  # a word without ids
    cache: dict[str, Encoded] = {p: ("5", 1, None) for c in cuts for p in c if data.draw(st.integers(0, 3)) == 0}
    mine = dict(cache)
    assert word_scan.fill_tables(cuts, cache, *_tables(first, later)) == fill_known(cuts, mine, first, later)
    assert cache == mine


def test_word_tables_grow_replace_and_clear() -> None:
    words = {f"w{k}\u00e9{'x' * (k % 7)}" if k % 3 else f"w{k}\U0001f600": f"{k},{k + 1}," for k in range(5000)}
    first, later = _tables(words, {"b": "2,"})
    first.add("w3\U0001f600", "9,")  # replaced, not added
    words["w3\U0001f600"] = "9,"
    assert len(first) == 5000
    pieces = [[f"{w} b" for w in list(words)[::7]] + ["w1\u00e9x b b"]]
    cache: dict[str, Encoded] = {}
    mine: dict[str, Encoded] = {}
    assert word_scan.fill_tables(pieces, cache, first, later) == fill_known(pieces, mine, words, {"b": "2,"}) == []
    assert cache == mine
    first.clear()
    assert len(first) == 0 and word_scan.fill_tables([["b"]], {}, first, later) == ["b"]
