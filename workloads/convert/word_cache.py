"""The word cache of ``apcsim convert``'s tokenizer: a text piece that the segment cache has not seen
(``workloads.convert.tokenizer``) is cut before every space followed by an ASCII letter, and each
cut part ("word": ``" cache"``, ``" prefix."``) takes its ids from a cache, the library tokenizing
only the words never seen. Natural language repeats its words, so on new text the library's
pre-tokenizer regex (most of its time: a few MB per CPU-second) is replaced by one ``str.split``
(``re.split`` when some space is not followed by a letter) and a dict lookup per word.

**Why it is exact.** A Hugging Face tokenizer runs normalizer, pre-tokenizer, model; the model
(BPE here) tokenizes each pre-token alone, so a text's ids are the concatenation of its
pre-tokens' ids. The cut is exact when the pre-tokenizer's regex, run on the whole text, ends a
pre-token at every cut point and runs the same on each part alone. For the regexes recognized here
-- GPT-2's byte-level one (``ByteLevel(use_regex=True)``) and the cl100k one of Llama 3
(``Split`` + ``ByteLevel(use_regex=False)``) -- at a cut point ``p`` (``text[p] == " "``,
``text[p+1]`` a letter):

* no match crosses ``p``: letter, number and symbol runs stop at a space (a symbol run's
  ``[^\\s...]`` excludes it, cl100k's optional one-character prefix of a word must be followed by a
  letter, not by the space); the whitespace alternatives stop before ``p``: ``\\s+(?!\\S)`` takes
  the longest run not followed by a non-space, which ends at ``p`` (ending at ``p+1`` is followed
  by the letter), the plain ``\\s+`` is tried only when that one fails, and cl100k's
  ``\\s*[\\r\\n]+`` must end on a newline;
* the match at ``p`` is the space and the letters after it (`` ?\\p{L}+``, or cl100k's prefixed
  word), whatever came before; and a part ending at ``p`` scans as in the whole text, the only
  look-ahead (``(?!\\S)``) seeing a space there and the end of the part alone, neither a non-space.

Only those pre-tokenizer configurations are recognized (exact JSON), with no normalizer (NFC could
join across a cut) and a model without dropout (random merges); any other tokenizer keeps the
library's whole-piece path. ``tests/test_convert_words.py`` checks the cut against the library's
own pre-tokenizer and the ids against the library on random texts (letters, digits, spaces, tabs,
newlines, accents, contractions, added-token spellings).

Invariants: :meth:`WordCache.encode` is a pure function of its pieces: each result is
``",".join(map(str, ids))`` of the library's ids for the piece. Imports the ``tokenizers`` object
it is given, nothing else of the project.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

CUT = re.compile(r" (?=[A-Za-z])")
"""A cut point: a space followed by an ASCII letter (a letter for every regex); the space starts the
word after it."""
NOT_CUT = re.compile(r" (?![A-Za-z])")
"""A space that is no cut point."""

GPT2_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
"""GPT-2's pre-tokenizer (its regex is the library's built-in one); ``trim_offsets`` does not matter."""

CL100K_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
"""The Split regex of Llama 3's ``tokenizer.json`` (cl100k's pattern)."""

WORDS_LIMIT = 1 << 18
"""Words the cache keeps (emptied when full)."""


def _matches(spec: Any, want: dict[str, Any]) -> bool:
    return isinstance(spec, dict) and all(spec.get(k) == v for k, v in want.items())


def words_safe(data: dict[str, Any]) -> bool:
    """Whether a parsed ``tokenizer.json`` is one the cut is proved for (see the module docstring)."""
    model = data.get("model")
    if data.get("normalizer") is not None or not isinstance(model, dict) or model.get("dropout") is not None:
        return False
    pre = data.get("pre_tokenizer")
    if _matches(pre, GPT2_BYTE_LEVEL):
        return True
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else None
    if not isinstance(steps, list):
        return False
    return len(steps) == 2 and _matches(steps[0], {
        "type": "Split", "pattern": {"Regex": CL100K_REGEX}, "behavior": "Isolated", "invert": False,
    }) and _matches(steps[1], {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False})


def split_words(piece: str) -> list[str]:
    """``piece`` cut at its cut points: its first word, then every later word without the space it
    starts with (``str.split(" ")`` when every space is a cut point: twice the speed of the regex)."""
    return piece.split(" ") if NOT_CUT.search(piece) is None else CUT.split(piece)


class WordCache:
    """Pieces to their ids' JSON text through a cache of words; ``hf`` is the library's tokenizer,
    ``id_text[i]`` is ``str(i)``."""

    def __init__(self, hf: Any, id_text: list[str]) -> None:
        self._hf = hf
        self._id_text = id_text
        # a word -> its ids' text, each id followed by a comma: a piece's first word, and the later
        # words keyed without the space they start with
        self._first: dict[str, str] = {}
        self._later: dict[str, str] = {}
        # compiled mirrors of the two dicts, looked up without a str per word (None: not built)
        self._tables: tuple[Any, Any] | None = (_WordTable(), _WordTable()) if _WordTable is not None else None

    def _learn(self, first: list[str], later: list[str]) -> None:
        """Tokenize words not seen yet (one library call)."""
        text = self._id_text
        encs = self._hf.encode_batch_fast(first + [" " + w for w in later], add_special_tokens=False)
        for words, table, at in ((first, self._first, 0), (later, self._later, len(first))):
            for word, enc in zip(words, encs[at:at + len(words)], strict=True):
                try:
                    table[word] = "".join([text[i] + "," for i in enc.ids])
                except IndexError:  # an id beyond the vocabulary's table (not from a well-formed tokenizer)
                    table[word] = "".join([f"{i}," for i in enc.ids])
        if self._tables is not None:
            for words, table, mirror in ((first, self._first, self._tables[0]), (later, self._later, self._tables[1])):
                for word in words:
                    mirror.add(word, table[word])

    def encode(self, pieces: Sequence[str]) -> list[str]:
        """Each piece's ids as ``",".join(map(str, ids))`` (a lookup but for new words)."""
        first, later = self._first, self._later
        out = _known(list(pieces), first, later)
        new = [(k, split_words(p)) for k, (p, text) in enumerate(zip(pieces, out, strict=True)) if text is None]
        if not new:
            return out  # type: ignore[return-value]  # no None left
        new_first = list({c[0] for _, c in new if c[0] not in first})
        new_later = list({w for _, c in new for w in c[1:] if w not in later})
        if len(first) + len(later) + len(new_first) + len(new_later) > WORDS_LIMIT:
            first.clear()
            later.clear()
            for mirror in self._tables or ():
                mirror.clear()
            new_first, new_later = list({c[0] for _, c in new}), list({w for _, c in new for w in c[1:]})
        self._learn(new_first, new_later)
        for k, c in new:
            out[k] = (first[c[0]] + "".join([later[w] for w in c[1:]]))[:-1]
        return out  # type: ignore[return-value]  # every piece filled

    def fill(self, cuts: list[list[str]], cache: dict[str, tuple[str, int, Any]]) -> None:
        """Put every part of ``cuts`` missing from the segment cache ``cache`` in it as
        ``(ids text, count, None)``: parts whose words are all known in one compiled pass, the
        others through :meth:`encode` (which learns their new words)."""
        if self._tables is not None:
            unknown = _fill_tables(cuts, cache, *self._tables)
        else:
            unknown = _fill(cuts, cache, self._first, self._later)
        for part, text in zip(unknown, self.encode(unknown), strict=True):
            cache[part] = (text, text.count(",") + 1 if text else 0, None)


def known_words(pieces: list[str], first: dict[str, str], later: dict[str, str]) -> list[str | None]:
    """Each piece's ids text from the tables (``first[word 0] + later[word 1] + ...`` less the last
    comma), or None when a word is in neither: the definition the compiled ``word_scan.known``
    runs (faster: one pass, no word list)."""
    out: list[str | None] = []
    for c in map(split_words, pieces):
        try:
            out.append((first[c[0]] + "".join([later[w] for w in c[1:]]))[:-1])
        except KeyError:
            out.append(None)
    return out


def fill_known(cuts: list[list[str]], cache: dict[str, tuple[str, int, Any]], first: dict[str, str],
               later: dict[str, str]) -> list[str]:
    """Every non-empty part of ``cuts`` missing from ``cache`` whose words are all in the tables
    put in it as ``(ids text, count, None)``; the others returned, distinct, first seen first: the
    definition the compiled ``word_scan.fill`` runs."""
    unknown: dict[str, None] = {}
    for parts in cuts:
        for part in parts:
            if not part or part in cache or part in unknown:
                continue
            text = known_words([part], first, later)[0]
            if text is None:
                unknown[part] = None
            else:
                cache[part] = (text, text.count(",") + 1 if text else 0, None)
    return list(unknown)


_known: Callable[[list[str], dict[str, str], dict[str, str]], list[str | None]]
try:
    from workloads.convert.word_scan import known as _known
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _known = known_words
_WordTable: Any = None
_fill_tables: Any = None
try:
    from workloads.convert.word_scan import WordTable as _WordTable
    from workloads.convert.word_scan import fill_tables as _fill_tables
except ImportError:  # pragma: no cover - an extension built before the tables were added, or none
    pass
_fill: Callable[[list[list[str]], dict[str, tuple[str, int, Any]], dict[str, str], dict[str, str]], list[str]]
try:
    from workloads.convert.word_scan import fill as _fill
except ImportError:  # pragma: no cover - an extension built before fill was added, or none
    _fill = fill_known
