"""Decoding one JSONL trace line, strictly (mirrors nothing in vLLM).

* bytes must be UTF-8 (else ``not UTF-8``);
* a key given twice in an object is an error naming the key (``json`` would keep the last one);
* a number with a fraction or exponent stays a float but keeps its text, so that
  :func:`exact_number` can take it exactly (epoch arrivals: ``1700000000000.0137`` has no float);
* ``NaN`` / ``Infinity`` parse (as non-finite floats) and are refused by the field checks that need
  a finite number.

Problems raise :class:`FieldProblem` (field or None, problem), which the readers complete with file
and line (``workloads.trace_format.TraceFormatError``). Imports nothing from the project.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any


class FieldProblem(Exception):
    """A problem with one field of a line (or the whole line: ``field`` None); the reader adds
    file and line."""

    def __init__(self, field: str | None, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json`` object hook: a key given twice is an error (the last one would win silently)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise FieldProblem(key, f"duplicate key {key!r}")
            seen.add(key)
    return obj


class _Float(float):
    """A JSON number with a fraction or exponent: a float that keeps its text (``text``), so that
    arrivals can be taken exactly."""


def _parse_float(text: str) -> _Float:
    f = _Float(text)
    f.text = text  # type: ignore[attr-defined]
    return f


def exact_number(value: int | float) -> Decimal:
    """A parsed JSON number as an exact decimal (from its text when ``decode_line`` kept it)."""
    text = getattr(value, "text", None)
    return Decimal(text) if text is not None else Decimal(value)


# one decoder for every line: ``json.loads`` with hooks builds a new JSONDecoder per call, a third
# of a Mooncake line's decoding time
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys, parse_float=_parse_float)


def decode_line(raw: bytes) -> Any:
    """One trace line as JSON (strict UTF-8, duplicate keys refused, non-integral numbers kept with
    their text for :func:`exact_number`); raises ``FieldProblem``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FieldProblem(None, "not UTF-8") from None
    try:
        if text.startswith("\ufeff"):  # what json.loads refuses before decoding
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise FieldProblem(None, f"malformed JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise FieldProblem(None, "malformed JSON: nested too deeply") from None
