"""Loader for the Mooncake (FAST'25) traces (mirrors their published JSONL): ``timestamp`` (ms), ``input_length``,
``output_length``, ``hash_ids`` (one id per 512-token block, prefix-chained, last block partial).

Re-blocking: hash id ``h`` expands into ``tokens_per_id`` distinct token ids
``h * tokens_per_id + k`` (k = 0 .. tokens_per_id-1); the prompt is their concatenation truncated
to ``input_length``. Replayed at block sizes finer than the trace's 512 this gives a *lower bound*
on the real hit rate (different ids may really share leading tokens).

Decisions:

* ``output_length`` must be >= 1 (vLLM needs ``max_tokens >= 1``): 0 or negative raises
  :class:`TraceFormatError` rather than being clamped. The two shipped traces have no 0.
* ``len(hash_ids)`` must equal ``ceil(input_length / tokens_per_id)`` (true for both traces at
  512); a mismatch raises, which also catches a wrong ``tokens_per_id``.
* Unknown fields, non-int lengths, negative ids, ids whose expansion reaches 2**62 and
  decreasing timestamps raise ``TraceFormatError`` (``file:line: field 'x': problem``); with
  ``skip_bad_lines`` such lines are skipped and counted in the ``SkipLog`` passed in instead.

Invariants: a prompt is exactly ``input_length`` tokens, ids of one hash id are consecutive.
Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from workloads.errors import SkipLog
from workloads.tokens import RunTokens
from workloads.trace_codecs import check_trace_path
from workloads.trace_format import (
    MAX_OUTPUT_TOKENS,
    TOKEN_ID_LIMIT,
    TraceFormatError,
    TraceRequest,
    decode_json_line,
    is_int,
)
from workloads.trace_lines import trace_lines

TRACE_BLOCK_SIZE = 512
"""Tokens per hash id in the Mooncake traces."""

_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def _bad(path: str, lineno: int, field: str | None, problem: str) -> TraceFormatError:
    return TraceFormatError(path, lineno, field, problem)



def _parse_line(
    line: bytes, path: str, lineno: int, tokens_per_id: int
) -> tuple[float, int, int, list[int]]:
    """Validate one Mooncake line: ``(timestamp_ms, input_length, output_length, hash_ids)``."""
    obj = decode_json_line(line, path, lineno)  # strict UTF-8, no duplicate keys
    if not isinstance(obj, dict):
        raise _bad(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
    for key in obj:
        if key not in _FIELDS:
            raise _bad(path, lineno, key, "unknown field")
    for key in _FIELDS:
        if key not in obj:
            raise _bad(path, lineno, key, "missing required field")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise _bad(path, lineno, "timestamp", f"expected finite number >= 0 (ms), got {ts!r}")
    n_in = obj["input_length"]
    if not is_int(n_in) or n_in < 1:
        raise _bad(path, lineno, "input_length", f"expected int >= 1, got {n_in!r}")
    n_out = obj["output_length"]
    if not is_int(n_out) or n_out < 1:
        raise _bad(
            path, lineno, "output_length", f"expected int >= 1 (vLLM needs max_tokens >= 1), got {n_out!r}"
        )
    if n_out >= MAX_OUTPUT_TOKENS:
        raise _bad(path, lineno, "output_length", f"expected int < 2**24 ({MAX_OUTPUT_TOKENS}), got {n_out}")
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise _bad(path, lineno, "hash_ids", f"expected a list of ints, got {type(ids).__name__}")
    want = -(-n_in // tokens_per_id)
    if len(ids) != want:
        raise _bad(
            path,
            lineno,
            "hash_ids",
            f"expected ceil(input_length / {tokens_per_id}) = {want} ids, got {len(ids)}",
        )
    limit = TOKEN_ID_LIMIT // tokens_per_id
    if all(type(v) is int for v in ids) and min(ids) >= 0 and max(ids) < limit:
        return float(ts), n_in, n_out, ids  # the common case, without numpy's per-call cost
    arr = np.asarray(ids)  # what is wrong, or (bools) what numpy takes as ints
    if arr.ndim != 1 or arr.dtype.kind != "i":
        for i, v in enumerate(ids):
            if not is_int(v):
                raise _bad(path, lineno, "hash_ids", f"id at index {i}: expected int, got {v!r}")
        raise _bad(path, lineno, "hash_ids", "id out of range")  # ints too large for int64
    arr = arr.astype(np.int64, copy=False)
    bad = (arr < 0) | (arr >= limit)
    if bad.any():
        i = int(np.argmax(bad))
        raise _bad(path, lineno, "hash_ids", f"id at index {i} out of range [0, {limit}): {int(arr[i])}")
    return float(ts), n_in, n_out, arr.tolist()


def expand_hash_ids(hash_ids: np.ndarray, length: int, tokens_per_id: int) -> np.ndarray:
    """Token ids ``h * tokens_per_id + k`` for each id, concatenated and cut to ``length``."""
    ids = np.asarray(hash_ids, dtype=np.int64)
    base = ids * tokens_per_id
    return (base[:, None] + np.arange(tokens_per_id, dtype=np.int64)[None, :]).ravel()[:length]


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines, 1-based, decompressed by suffix (``workloads.trace_lines``)."""
    for lineno, raw, _ in trace_lines(path, scan=False):
        yield lineno, raw


def load_mooncake(
    path: str | os.PathLike[str],
    *,
    tokens_per_id: int = TRACE_BLOCK_SIZE,
    time_scale: float = 1.0,
    start: int = 0,
    limit: int | None = None,
    max_output_tokens: int | None = None,
    skip_bad_lines: bool = False,
    skip_log: SkipLog | None = None,
    allow_empty: bool = False,
) -> Iterator[TraceRequest]:
    """Stream a Mooncake trace as :class:`TraceRequest` (a generator; one line in memory at a time).

    ``arrival = timestamp_ms / 1000 * time_scale``; ``output_tokens = output_length`` capped at
    ``max_output_tokens``; ids are ``mc-{line_index}`` (0-based line of the file). ``start`` skips
    the first ``start`` lines unparsed; ``limit`` caps the number of requests yielded. With
    ``skip_bad_lines`` a bad line is counted in ``skip_log`` (created if not given) and skipped.
    No request at all is an error (``TraceFormatError``) unless ``limit == 0``, or every line was
    skipped and ``allow_empty`` is set.
    """
    if not is_int(tokens_per_id) or tokens_per_id < 1:
        raise ValueError(f"tokens_per_id must be an int >= 1, got {tokens_per_id!r}")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise ValueError(f"time_scale must be finite and > 0, got {time_scale!r}")
    if not is_int(start) or start < 0:
        raise ValueError(f"start must be an int >= 0, got {start!r}")
    if limit is not None and (not is_int(limit) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    if max_output_tokens is not None and (not is_int(max_output_tokens) or max_output_tokens < 1):
        raise ValueError(f"max_output_tokens must be None or an int >= 1, got {max_output_tokens!r}")
    p = Path(path)
    check_trace_path(p)  # missing, a directory, a FIFO: refused by kind, before any read
    log = skip_log if skip_log is not None else SkipLog()
    return _generate(p, tokens_per_id, time_scale, start, limit, max_output_tokens, skip_bad_lines, log, allow_empty)


def _generate(
    path: Path,
    tokens_per_id: int,
    time_scale: float,
    start: int,
    limit: int | None,
    max_output_tokens: int | None,
    skip_bad_lines: bool,
    log: SkipLog,
    allow_empty: bool,
) -> Iterator[TraceRequest]:
    name = os.fspath(path)
    emitted = 0
    last_ts = -math.inf
    skipped_before = log.skipped
    lineno = 0
    if limit == 0:
        return
    for lineno, line in _lines(path):
        if lineno - 1 < start:
            continue
        try:
            ts, n_in, n_out, ids = _parse_line(line, name, lineno, tokens_per_id)
            if ts < last_ts:
                raise _bad(name, lineno, "timestamp", f"{ts!r} is before the previous timestamp {last_ts!r}")
        except TraceFormatError as err:
            log.handle(err, skip_bad_lines)
            continue
        last_ts = ts
        if max_output_tokens is not None:
            n_out = min(n_out, max_output_tokens)
        yield TraceRequest(
            id=f"mc-{lineno - 1}",
            arrival=ts / 1000.0 * time_scale,
            # runs of consecutive ids (RunTokens): a 12k-token prompt is a few runs, hashed without
            # expanding it (sim.core.hashing), so queued requests stay cheap
            tokens=RunTokens.from_id_list(ids, tokens_per_id, 0, n_in),
            output_tokens=n_out,
        )
        emitted += 1
        if limit is not None and emitted >= limit:
            return
    if emitted == 0:
        log.refuse_empty(name, lineno, skipped_before, allow_empty, f" after its first {start} lines" if start else "")


def mooncake_stats(path: str | os.PathLike[str], *, tokens_per_id: int = TRACE_BLOCK_SIZE) -> dict[str, Any]:
    """Summary of a Mooncake trace without expanding tokens.

    ``block_hit_bound``: infinite cache, arrival order, at the trace's own block size: the share of
    all hash ids (partial last blocks included) already seen in an earlier position of the trace.
    """
    p = Path(path)
    name = os.fspath(p)
    n_req = prompt = output = 0
    first_ts: float | None = None
    last_ts: float | None = None
    max_in = 0
    chunks: list[list[int]] = []
    for lineno, line in _lines(p):
        ts, n_in, n_out, ids = _parse_line(line, name, lineno, tokens_per_id)
        if last_ts is not None and ts < last_ts:
            raise _bad(name, lineno, "timestamp", f"{ts!r} is before the previous timestamp {last_ts!r}")
        if first_ts is None:
            first_ts = ts
        last_ts = ts
        n_req += 1
        prompt += n_in
        output += n_out
        max_in = max(max_in, n_in)
        chunks.append(ids)
    all_ids = np.fromiter((h for ids in chunks for h in ids), dtype=np.int64)
    total = int(all_ids.size)
    unique = int(np.unique(all_ids).size)
    return {
        "requests": n_req,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "max_input_length": max_in,
        "duration_s": ((last_ts - first_ts) / 1000.0) if first_ts is not None and last_ts is not None else 0.0,
        "block_ids": total,
        "unique_block_ids": unique,
        "block_hit_bound": (total - unique) / total if total else 0.0,
    }


def derive_sample(src: str | os.PathLike[str], dst: str | os.PathLike[str], num_requests: int) -> int:
    """Write the first ``num_requests`` lines of a Mooncake trace, validated, to ``dst``.

    This is how ``workloads/data/mooncake_conversation_sample.jsonl`` (the bundled default
    workload, Apache-2.0 like its source) was made:
    ``python -m workloads.mooncake SRC DST 1000``.
    """
    src_p, out_lines = Path(src), list[str]()
    for lineno, line in _lines(src_p):
        if len(out_lines) == num_requests:
            break
        _parse_line(line, str(src_p), lineno, TRACE_BLOCK_SIZE)
        out_lines.append(line.decode("utf-8").rstrip("\n") + "\n")
    Path(dst).write_text("".join(out_lines))
    return len(out_lines)


if __name__ == "__main__":  # pragma: no cover
    import sys

    n = derive_sample(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    print(f"wrote {n} requests to {sys.argv[2]}")
