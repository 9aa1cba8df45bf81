"""The compiled loops of the convert caches (``workloads/convert/word_scan.pyx``) equal their
interpreted definitions (``word_cache.known_words``, ``tokenizer.missing_parts`` /
``joined_parts``) on random texts: spaces before letters, digits, punctuation, newlines, accents,
empty pieces and words, words in one table only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.convert.tokenizer import Encoded, joined_parts, missing_parts
from workloads.convert.word_cache import known_words, split_words

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
