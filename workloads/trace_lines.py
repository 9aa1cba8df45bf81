"""The lines of a trace file, read fast (mirrors nothing in vLLM).

* **Compression** by suffix: ``.gz`` (stdlib ``gzip``), ``.xz`` (stdlib ``lzma``), ``.zst``
  (the ``zstandard`` package from PyPI); anything else is read as plain bytes. A missing path, a
  directory or FIFO, a missing codec, a truncated or corrupt compressed file and a read error raise
  :class:`TraceInputError` naming the file (``workloads.trace_codecs``).
* **Chunks**: the file is read in 16 MiB chunks into one reused buffer; a line longer than the
  buffer grows it. Nothing counts lines up front.
* **Scanning**: with the compiled scanner (``workloads.trace_scan``) a line of a canonical trace
  comes back with its ``tokens`` / ``output_token_ids`` int arrays already parsed (as runs of
  consecutive ids or one int64 array) and replaced by ``0`` in the line's bytes, so that ``json``
  parses only the rest; a line the scanner does not call plain comes back whole (the slow path).
  Without the compiled scanner every line takes the slow path (same results, slower).

Invariant: line numbers are 1-based and count every line, blank ones included (blank lines are not
yielded). Imports numpy only (and the optional compiled scanner).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import numpy as np

from workloads.trace_codecs import TraceInputError, open_checked

__all__ = ["ARRAY_KEYS", "CHUNK_BYTES", "ParsedIds", "TraceInputError", "open_trace", "trace_lines"]

_Scanner = Callable[[bytearray, int, bool], tuple[list[tuple[int, int, int, Any]], int]]
_scan_lines: _Scanner | None
try:
    from workloads.trace_scan import scan_lines as _scan_lines
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _scan_lines = None

CHUNK_BYTES = 1 << 24
_FAST, _SLOW = 1, 2
ARRAY_KEYS = ("tokens", "output_token_ids")
"""The keys whose int arrays the compiled scanner parses (``arrays`` of :func:`trace_lines`)."""

ParsedIds = np.ndarray | tuple[np.ndarray, np.ndarray]
"""A parsed id array: int64 ids, or ``(starts, lengths)`` runs of consecutive ids."""


def open_trace(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for binary reading, decompressed by suffix; truncated or corrupt data and
    read errors raise :class:`TraceInputError` naming the file (``workloads.trace_codecs``)."""
    return open_checked(path)


_JSON_WS = b" \t\r\n"  # RFC 8259 whitespace; a line of other control bytes is malformed JSON


def trace_lines(
    path: str | os.PathLike[str], *, scan: bool = True
) -> Iterator[tuple[int, bytes, dict[str, Any] | None]]:
    """``(lineno, text, arrays)`` per non-blank line.

    ``arrays`` is None on the slow path (``text`` is the whole line); on the fast path it maps the
    keys of :data:`ARRAY_KEYS` found in the line to their :data:`ParsedIds`, and ``text`` is the
    line with those arrays replaced by ``0``. ``scan=False`` forces the slow path.
    """
    scanner = _scan_lines if scan else None
    with open_trace(path) as fh:
        if scanner is None:
            for lineno, line in enumerate(fh, start=1):
                if line.strip(_JSON_WS):  # blank = JSON whitespace only, as the scanner's
                    yield lineno, line, None
            return
        buf = bytearray(CHUNK_BYTES)
        filled = 0
        lineno = 0
        final = False
        while not final:
            with memoryview(buf) as view:
                got = fh.readinto(view[filled:])  # type: ignore[attr-defined]
            final = not got
            filled += got or 0
            lines, used = scanner(buf, filled, final)
            for start, stop, kind, subs in lines:
                lineno += 1
                if kind == _FAST:
                    arrays: dict[str, Any] = {}
                    parts: list[bytes | bytearray] = []
                    at = start
                    for key_index, a, b, value in subs:
                        parts.append(buf[at:a])
                        parts.append(b"0")
                        at = b
                        arrays[ARRAY_KEYS[key_index]] = value
                    parts.append(buf[at:stop])
                    yield lineno, b"".join(parts), arrays
                elif kind == _SLOW:
                    yield lineno, bytes(buf[start:stop]), None
            rest = filled - used
            if used:
                buf[:rest] = buf[used:filled]
            elif rest == len(buf) and not final:  # one line longer than the buffer: grow it
                buf.extend(bytes(len(buf)))
            filled = rest
