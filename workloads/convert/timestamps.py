"""Request timestamps of text logs: ISO-8601, epoch seconds, epoch milliseconds, or none
(mirrors nothing in vLLM).

``--timestamps auto`` (the default) reads a string as ISO-8601 (``2026-12-07T12:00:00Z``,
``2026-12-07 12:00:00.250+01:00``; no zone means UTC) and a number as epoch seconds when below
``1e11`` (year 5138) and milliseconds otherwise (an epoch in milliseconds today is about 1.7e12);
``s`` / ``ms`` / ``iso`` force one reading, ``none`` ignores every timestamp (the replay's arrival
process then places the requests, and its summary says so). Results are epoch seconds as floats.
Imports nothing from the project but the field-problem type.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any, Literal

from workloads.trace_json import FieldProblem

TimestampMode = Literal["auto", "iso", "s", "ms", "none"]
TIMESTAMP_MODES: tuple[str, ...] = ("auto", "iso", "s", "ms", "none")
MS_THRESHOLD = 1e11
"""``auto``: a number at or above this is milliseconds."""


def parse_timestamp(value: Any, mode: TimestampMode, field: str) -> float | None:
    """Epoch seconds of ``value`` under ``mode`` (None for ``none`` or a null value); raises
    ``FieldProblem`` naming ``field``."""
    if mode == "none" or value is None:
        return None
    if isinstance(value, str):
        if mode not in ("auto", "iso"):
            raise FieldProblem(field, f"expected a number ({mode}), got {value!r}")
        try:
            stamp = datetime.fromisoformat(value)
        except ValueError:
            raise FieldProblem(field, f"not an ISO-8601 time: {value!r}") from None
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        return stamp.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise FieldProblem(field, f"expected an ISO-8601 string or an epoch number >= 0, got {value!r}")
    if mode == "iso":
        raise FieldProblem(field, f"expected an ISO-8601 string, got {value!r}")
    if mode == "ms" or (mode == "auto" and value >= MS_THRESHOLD):
        return float(value) / 1000.0
    return float(value)
