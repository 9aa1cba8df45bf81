"""One JSONL record of a text log decoded fast, with the strict decoder's result (mirrors nothing in
vLLM): ``msgspec`` decodes the line (several times the speed of the stdlib decoder with its
per-object hook), and its value is taken only where it provably equals what
``workloads.trace_json.decode_line`` returns; otherwise the strict decoder runs and gives its value,
or its error (the same ``FieldProblem`` text as before).

**Why the values are equal.** Both decoders accept the same JSON texts but for NaN/Infinity, lone
surrogates and numbers beyond a double, which msgspec refuses (the strict decoder then runs); ints
are exact in both, floats go through the strict decoder's own float hook (its ``_Float``, which keeps
the number's text), strings and key order are the same. What msgspec does not check is a key given
twice in one object (the last one wins silently, where the strict decoder refuses the line). So the
value is kept only when the line has no repeated key, proved by counting: every key of the text is
a string followed by ``:``; when no ``"`` is followed by whitespace and then ``:`` (``key_marks``
says -1 otherwise), each key ends in its own ``":`` of the text, so the count of ``":`` is at least
the number of keys written (a ``":`` inside a string only adds to it). The decoded objects hold the
distinct keys of each object (``count_keys``), so when both counts are equal no key was repeated.
A ``":`` inside a string value or a spaced colon only sends the line to the strict decoder.

The two checks run compiled (``word_scan.key_marks`` / ``count_keys``); their definitions here are
the fallback and the tests' oracle (``tests/test_convert_json_record.py``). Without msgspec
installed every line takes the strict decoder. Imports ``workloads.trace_json`` and msgspec.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from workloads.trace_json import _parse_float, decode_line  # the strict decoder and its float hook

try:
    import msgspec

    _FAST: Any = msgspec.json.Decoder(float_hook=_parse_float)
except ImportError:  # pragma: no cover - msgspec is a dependency; without it every line is decoded strictly
    _FAST = None

_SPACED_COLON = re.compile(rb'"[ \t\r\n]+:')
MAX_DEPTH = 200
"""Nesting beyond which ``count_keys`` gives up (-1: the strict decoder decides)."""


def key_marks(raw: bytes) -> int:
    """The number of ``":`` in ``raw``, or -1 when a ``"`` is followed by JSON whitespace and ``:``."""
    return -1 if _SPACED_COLON.search(raw) else raw.count(b'":')


def count_keys(value: Any, depth: int = 0) -> int:
    """The keys of every object in a decoded JSON value (-1 past :data:`MAX_DEPTH` levels)."""
    if depth > MAX_DEPTH:
        return -1
    items: Any
    if type(value) is dict:
        total, items = len(value), value.values()
    elif type(value) is list:
        total, items = 0, value
    else:
        return 0
    for item in items:
        if type(item) is dict or type(item) is list:
            sub = count_keys(item, depth + 1)
            if sub < 0:
                return -1
            total += sub
    return total


_key_marks: Callable[[bytes], int] = key_marks
_count_keys: Callable[[Any], int] = count_keys
try:
    from workloads.convert.word_scan import count_keys as _count_keys
    from workloads.convert.word_scan import key_marks as _key_marks
except ImportError:  # pragma: no cover - an extension built before these were added, or none
    pass


def decode_record(raw: bytes) -> Any:
    """``raw`` decoded as ``workloads.trace_json.decode_line`` decodes it (same value, same
    ``FieldProblem``), through msgspec where that is proved equal (see the module docstring)."""
    if _FAST is not None:
        try:
            value = _FAST.decode(raw)
        except Exception:  # any refusal: the strict decoder gives the result or the error
            pass
        else:
            marks = _key_marks(raw)
            if marks >= 0 and marks == _count_keys(value):
                return value
    return decode_line(raw)
