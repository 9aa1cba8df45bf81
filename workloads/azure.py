"""Loader for the Azure LLM inference trace 2023 (mirrors its published CSV; Splitwise): arrival
times and lengths only.

CSV with header ``TIMESTAMP,ContextTokens,GeneratedTokens``; ``TIMESTAMP`` is a wall-clock time
``YYYY-MM-DD HH:MM:SS[.fraction]`` (any number of fraction digits). Files must be sorted by time.

Two uses:

* a workload of its own (``load_azure``): request i gets ``ContextTokens`` *distinct* prompt ids
  ``region(K_AZURE, i) + k`` -- the trace has no content information, so there is no prefix
  sharing at all (the infinite-cache bound is 0) -- and ``GeneratedTokens`` output tokens;
  arrival = seconds since the first row;
* an arrival process for any other workload (``azure_times``: the relative times as an array,
  see ``workloads.arrivals.cycled``).

Bad rows (wrong column count, unparsable time, non-int or < 1 lengths, time going backwards)
raise ``TraceFormatError`` with the file, the 1-based line (the header is line 1) and the column,
or are skipped and counted with ``skip_bad_lines``.

Invariants: no two requests share a prompt id. Imports neither simpy nor torch.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from workloads.errors import SkipLog
from workloads.tokens import K_AZURE, RunTokens, region
from workloads.trace_format import TraceFormatError, TraceRequest

HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_TS = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)$")


_EPOCH = _dt.date(1970, 1, 1).toordinal()


def parse_timestamp(text: str) -> float:
    """Seconds since 1970-01-01 (float64: sub-microsecond resolution for present-day dates)."""
    m = _TS.match(text.strip())
    if m is None:
        raise ValueError(f"expected 'YYYY-MM-DD HH:MM:SS.f', got {text!r}")
    y, mo, d, h, mi = (int(m.group(i)) for i in range(1, 6))
    sec = float(m.group(6))
    if not (0 <= h < 24 and 0 <= mi < 60 and 0 <= sec < 61):
        raise ValueError(f"time out of range: {text!r}")
    try:
        _dt.date(y, mo, d)
    except ValueError as exc:
        raise ValueError(f"bad date in {text!r}: {exc}") from None
    return (_dt.date(y, mo, d).toordinal() - _EPOCH) * 86400.0 + h * 3600 + mi * 60 + sec


def _rows(path: Path, skip_bad_lines: bool, log: SkipLog) -> Iterator[tuple[int, float, int, int]]:
    """``(line, absolute_seconds, context_tokens, generated_tokens)`` of every good row."""
    name = os.fspath(path)
    last = -np.inf
    with open(path, encoding="utf-8") as fh:
        first = fh.readline()
        cols = tuple(c.strip() for c in first.strip().split(","))
        if cols != HEADER:
            raise TraceFormatError(name, 1, None, f"expected header {','.join(HEADER)}, got {first.strip()!r}")
        for lineno, line in enumerate(fh, start=2):
            if not line.strip():
                continue
            try:
                parts = line.rstrip("\r\n").split(",")
                if len(parts) != 3:
                    raise TraceFormatError(name, lineno, None, f"expected 3 columns, got {len(parts)}")
                try:
                    ts = parse_timestamp(parts[0])
                except ValueError as exc:
                    raise TraceFormatError(name, lineno, "TIMESTAMP", str(exc)) from None
                vals = []
                for col, raw in zip(HEADER[1:], parts[1:]):
                    raw = raw.strip()
                    if not raw.isdigit() or int(raw) < 1:
                        raise TraceFormatError(name, lineno, col, f"expected int >= 1, got {raw!r}")
                    vals.append(int(raw))
                if ts < last:
                    raise TraceFormatError(name, lineno, "TIMESTAMP", "before the previous row (file must be sorted)")
            except TraceFormatError as err:
                log.handle(err, skip_bad_lines)
                continue
            last = ts
            yield lineno, ts, vals[0], vals[1]


def azure_times(path: str | os.PathLike[str], *, skip_bad_lines: bool = False,
                skip_log: SkipLog | None = None) -> np.ndarray:
    """Arrival times of the trace in seconds since its first row (sorted float64 array)."""
    log = skip_log if skip_log is not None else SkipLog()
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"Azure trace not found: {p}")
    ts = np.fromiter((r[1] for r in _rows(p, skip_bad_lines, log)), dtype=np.float64)
    return ts - ts[0] if ts.size else ts


def load_azure(
    path: str | os.PathLike[str],
    *,
    limit: int | None = None,
    max_output_tokens: int | None = None,
    skip_bad_lines: bool = False,
    skip_log: SkipLog | None = None,
) -> Iterator[TraceRequest]:
    """Stream the trace as requests with unique prompts (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"Azure trace not found: {p}")
    log = skip_log if skip_log is not None else SkipLog()
    return _generate(p, limit, max_output_tokens, skip_bad_lines, log)


def _generate(p: Path, limit: int | None, max_out: int | None, skip: bool, log: SkipLog) -> Iterator[TraceRequest]:
    t0: float | None = None
    for i, (_, ts, n_in, n_out) in enumerate(_rows(p, skip, log)):
        if limit is not None and i >= limit:
            return
        t0 = ts if t0 is None else t0
        yield TraceRequest(
            id=f"az-{i}",
            arrival=ts - t0,
            tokens=RunTokens.of((region(K_AZURE, i), n_in)),
            output_tokens=n_out if max_out is None else min(n_out, max_out),
        )
