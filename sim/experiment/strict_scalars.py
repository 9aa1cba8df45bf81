"""Quoted numbers and booleans, refused (mirrors vLLM's CLI, whose typed flags take no ``"8192"``).

Pydantic's lax mode turns the YAML string ``"8192"`` into the int 8192, ``"yes"`` into True, and
accepts ``true`` where an int is due (as 1) or ``1`` where a bool is due -- a config that says
something other than what it means runs without a word. Strict mode would refuse them but also
refuse a YAML list where a tuple is due, so instead :func:`scalar_problems` compares the data as
written with the validated config, value by value: where the config holds a number or a bool, the
data must have held a number or a bool of the same kind.

* a string became a number or bool: ``a quoted number ('8192'): write it without quotes``;
* ``true``/``false`` became a number: ``true/false where a number is due``;
* a number became a bool: ``a number (1) where true or false is due``.

A key's own conversions are untouched: a value whose validated form is a string, a mapping or a
model (``attribution: off``, a router given by name, a number as a fixed distribution) is not a
scalar here. Invariants: the walk follows only keys present in both; it never changes the config.
Imports only pydantic's BaseModel.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel

_SKIP = frozenset({"base_dir", "source"})  # set by the loader, not written by the user


def scalar_problems(raw: Any, value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """``(key path, problem)`` for every scalar whose written type differs from its validated one."""
    if isinstance(raw, Mapping):
        for key, item in raw.items():
            if not isinstance(key, str) or key in _SKIP:
                continue
            if isinstance(value, BaseModel) and key in type(value).model_fields:
                yield from scalar_problems(item, getattr(value, key), f"{path}.{key}" if path else key)
            elif isinstance(value, Mapping) and key in value:
                yield from scalar_problems(item, value[key], f"{path}.{key}" if path else key)
        return
    if isinstance(raw, list) and isinstance(value, (list, tuple)) and len(raw) == len(value):
        for i, (item, got) in enumerate(zip(raw, value)):
            yield from scalar_problems(item, got, f"{path}.{i}")
        return
    problem = _scalar_problem(raw, value)
    if problem:
        yield path or "<top level>", problem


def _scalar_problem(raw: Any, value: Any) -> str:
    if isinstance(raw, str) and isinstance(value, (bool, int, float)):
        what, plain = ("boolean", str(value).lower()) if isinstance(value, bool) else ("number", raw.strip())
        return f"a quoted {what} ({raw!r}): write {plain} without quotes"
    if isinstance(raw, bool) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{str(raw).lower()} where a number is due"
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and isinstance(value, bool):
        return f"a number ({raw!r}) where true or false is due"
    return ""
