"""One validation error as one line a user can act on (mirrors nothing in vLLM).

Pydantic's :class:`~pydantic_core.ErrorDetails` carry a location, a message and the bad input.
:func:`error_line` turns one into ``source: key.path: problem (got <excerpt>)``:

* **The user's key path only.** Tagged-union tags (``roofline``, ``mooncake``) and pydantic's own
  wrappers (``function-after[_keys_match_dist(), DelayConfig]``) are dropped from the location; a
  key that is not plain (a space, a dot, a control character) is quoted.
* **Never more than a short excerpt of a bad value.** The input is shown as its ``repr`` cut to
  :data:`MAX_EXCERPT` characters (a list of a million items, or an alias-expanded one, prints as
  ``[0, 0, ... (1,000,000 items)``), built without formatting the whole value first.
* **One line** per error. Control characters are escaped, so a value cannot break the line; at
  most :data:`MAX_LINES` errors are listed, the rest counted.

Invariants: the line is at most a few hundred characters whatever the input. Imports pydantic_core
types only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic_core import ErrorDetails

MAX_EXCERPT = 80
"""Characters of a bad value shown in a message."""
MAX_PROBLEM = 400
"""Characters of a validator's own message (which may quote the value) shown in a message."""
MAX_LINES = 20
"""Errors listed for one config; the rest are counted."""

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]+")
_PYDANTIC_STEP = re.compile(r"(function-(after|before|wrap|plain)|tagged-union|union|chain|nullable|"
                            r"lax-or-strict|json-or-python|definition-ref|model|list|tuple|dict)\[.*\]\Z"
                            r"|constrained-\w+\Z|(int|float|str|bool|none)\Z")
"""Pydantic's names for a union's members in an error location (``function-after[...]``,
``constrained-float``, ``int``): not keys the user wrote."""


def format_loc(loc: tuple[Any, ...], union_tags: frozenset[str] = frozenset()) -> str:
    """``loc`` as a dotted key path, without union tags and pydantic's validator wrappers."""
    parts = [p if not isinstance(p, str) or _PLAIN_KEY.fullmatch(p) else repr(p)
             for p in loc if not (isinstance(p, str) and (p in union_tags or _PYDANTIC_STEP.match(p)))]
    return ".".join(str(p) for p in parts) or "<top level>"


def one_line(text: str) -> str:
    """``text`` with control characters escaped (a value quoted in a message cannot break its line)."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def excerpt(value: Any, limit: int = MAX_EXCERPT) -> str:
    """A ``repr`` of ``value`` of at most about ``limit`` characters, built from its first items only
    (formatting a huge or alias-shared list whole would take gigabytes)."""
    text = _bounded_repr(value, limit + 1)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, (list, tuple, dict, str, bytes)) else None
    return text[:limit] + "..." + (f" ({size:,} {'characters' if isinstance(value, str) else 'items'})"
                                   if size is not None else "")


def _bounded_repr(value: Any, budget: int) -> str:
    """``repr(value)``, stopped once it is longer than ``budget`` characters."""
    if isinstance(value, (list, tuple)):
        opener, closer, items = ("[", "]", value) if isinstance(value, list) else ("(", ")", value)
        return _join(opener, closer, (_bounded_repr(v, budget) for v in items), budget)
    if isinstance(value, Mapping):
        pairs = (f"{_bounded_repr(k, budget)}: {_bounded_repr(v, budget)}" for k, v in value.items())
        return _join("{", "}", pairs, budget)
    if isinstance(value, (str, bytes)) and len(value) > budget:
        return repr(value[:budget])
    return repr(value)[: budget + 1]


def _join(opener: str, closer: str, parts: Any, budget: int) -> str:
    out = opener
    for i, part in enumerate(parts):
        out += (", " if i else "") + part
        if len(out) > budget:
            return out
    return out + closer


def describe(err: ErrorDetails) -> str:
    """The problem of one error: pydantic's message, ``(got <excerpt>)`` unless the message is ours."""
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "required key is missing"
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if len(msg) > MAX_PROBLEM:
        msg = msg[:MAX_PROBLEM] + "..."
    return f"{msg} (got {excerpt(err['input'])})" if err["type"] != "value_error" else msg


def error_line(source: str, err: ErrorDetails, union_tags: frozenset[str] = frozenset()) -> str:
    """``source: key.path: problem`` on one line (see the module docstring)."""
    return one_line(f"{source}: {format_loc(err['loc'], union_tags)}: {describe(err)}")


def error_lines(source: str, errors: list[ErrorDetails], union_tags: frozenset[str] = frozenset()) -> list[str]:
    """The first :data:`MAX_LINES` errors as lines, then one line counting the rest."""
    lines = [error_line(source, e, union_tags) for e in errors[:MAX_LINES]]
    if len(errors) > MAX_LINES:
        lines.append(f"{source}: ... and {len(errors) - MAX_LINES:,} more problems")
    return lines
