"""Typed command-line numbers (mirrors nothing in vLLM): every number a command takes is checked
when the arguments are parsed, before anything runs.

``--max-replicas -5`` once printed ``round_robin > -5`` and wrote ``sizing.json``; now each number
option names its range in its ``type``: :func:`int_at_least` builds the parser of an int with a
lower bound, :func:`int_list` of a comma-separated list of them. A bad value is argparse's
``invalid value`` error naming the option (exit code 2).

Invariants: the parsers return plain ints; their messages name the bound and the value given.
Imports only argparse.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(minimum: int, *, maximum: int | None = None) -> Callable[[str], int]:
    """A parser of an int in ``[minimum, maximum]`` for ``add_argument(type=...)``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum:,}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"  # argparse names the type in some messages
    return parse


def int_list(minimum: int) -> Callable[[str], list[int]]:
    """A parser of ``16,32,64`` (each ``>= minimum``) for ``add_argument(type=...)``."""
    one = int_at_least(minimum)

    def parse(text: str) -> list[int]:
        values = [one(part) for part in text.split(",") if part.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}")
        return values

    return parse
