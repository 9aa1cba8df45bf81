"""The canonical token-level trace record (one request per JSONL line), its reader and writer
(mirrors the request fields vLLM takes).

Fields: ``id`` (str; an int in the file is converted), ``arrival`` (seconds, finite, >= 0),
``tokens`` (prompt token ids, a non-empty list of ints in [0, 2**62)), ``output_tokens`` (count
in [1, 2**24)); optional ``output_token_ids`` (the ids the model will produce, so a later turn may contain
an earlier answer; length >= ``output_tokens``), ``salt`` (vLLM ``cache_salt``, str or null),
``lora`` (LoRA adapter name, str or null), ``priority`` (int, smaller first), ``prompt_logprobs``
(bool), ``tenant`` and ``session`` (str or null, bookkeeping only), ``system_tokens`` (int >= 0:
how many leading prompt tokens are a shared system prompt; used by the ``shared_system_prompt``
salt policy of ``workloads.tenants``, default 0).

What each field does to caching (vLLM 0.25.1's rules; docs/workloads.md, "Replaying your own traffic"
has the table): only full blocks of ``tokens`` are cached and hit, as a chain from token 0, and the
last prompt token is always recomputed; ``output_token_ids`` lets a later request hit this answer;
``salt`` (hashed into block 0, chained) and ``lora`` (hashed into every block) separate namespaces
that share no block; a ``prompt_logprobs`` request never reads the cache but still caches its
blocks; ``priority``, ``tenant`` and ``session`` do not touch hashes.

Token ids >= 2**62 are reserved for simulator-generated outputs. A file must be sorted by arrival
(ties allowed), ids must be unique and a line must not repeat a key. Every violation raises
:class:`TraceFormatError` naming the file, the 1-based line and the field, e.g.
``trace.jsonl:17: field 'output_tokens': expected int >= 1, got -3``; a line that is not UTF-8 is
``trace.jsonl:17: not UTF-8``. With ``skip_bad_lines`` such lines are skipped and counted instead.

Reading (:class:`TraceReader`): ``.gz``, ``.xz`` and ``.zst`` files are decompressed on the fly
(``workloads.trace_lines``); token arrays are parsed by a compiled scanner without building Python
ints, and a prompt of runs of consecutive ids is kept as :class:`~workloads.tokens.RunTokens`.
**Arrivals are relative to the first request's**: its arrival is subtracted exactly (in decimal,
before rounding to a float), so a trace with epoch timestamps (1.7e12 s) replays exactly like the
same trace starting at 0; the first request arrives at 0 and :attr:`TraceReader.origin_s` keeps the
offset. An arrival more than ``2**32`` s after the first is an error (a float clock there has no
microseconds left). An empty trace is an error; so is one whose every line was skipped, unless
``allow_empty`` is set.

Known leniency: a JSON ``true``/``false`` mixed into an int token list is read as 1/0 (numpy's
type inference; a per-token check would cost more than the parse). A list of only booleans is
rejected.

Invariants: a record read back equals the record written (arrivals relative to the first). Imports
sim.core and ``workloads.tokens`` / ``workloads.trace_lines`` only (neither simpy nor torch).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Context, Decimal
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from sim.core.errors import ApcsimError
from sim.core.lazy_tokens import LazyTokens
from sim.core.request import token_array
from workloads.tokens import RunTokens
from workloads.trace_codecs import check_trace_path
from workloads.trace_json import FieldProblem as _FieldError
from workloads.trace_json import decode_line, exact_number
from workloads.trace_lines import trace_lines

TOKEN_ID_LIMIT = 1 << 62
"""Prompt/output token ids must lie in ``[0, TOKEN_ID_LIMIT)``; larger ids are simulator-generated."""

MAX_SKIPPED_LINES_KEPT = 20
"""How many skipped line numbers :attr:`TraceReader.skipped_lines` keeps."""

MAX_OUTPUT_TOKENS = 1 << 24
"""``output_tokens`` must be below this (the simulator's generated-id layout, ``sim.core.request``)."""

MAX_ARRIVAL_SPAN_S = float(1 << 32)
"""Arrivals may lie at most this many seconds after the first one (a float clock keeps about a
microsecond of resolution there)."""

HEADER_KEY = "apcsim_trace"
"""Line 1 may be ``{"apcsim_trace": {...}}``: a header (``apcsim convert`` / ``anonymize``), not a request."""

_EXACT = Context(prec=200)  # arrival differences in decimal, exact for any JSON number of up to 200 digits


@dataclass(slots=True)
class TraceRequest:
    """One request of a replayable workload.

    ``tokens`` is an int64 numpy array, or a :class:`~sim.core.request.LazyTokens` that expands to one
    (loaders of block-id traces use it to keep queued requests compact); ``token_array`` expands.
    """

    id: str
    arrival: float
    tokens: np.ndarray | LazyTokens
    output_tokens: int
    output_token_ids: np.ndarray | None = None
    salt: str | None = None
    lora: str | None = None
    priority: int = 0
    prompt_logprobs: bool = False
    tenant: str | None = None
    session: str | None = None
    system_tokens: int = 0


class TraceFormatError(ApcsimError, ValueError):
    """A trace line that breaks the format; ``str()`` is ``file:line: field 'name': problem``."""

    def __init__(self, path: str, line: int, field: str | None, problem: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem
        where = f"{path}:{line}:"
        super().__init__(f"{where} field {field!r}: {problem}" if field else f"{where} {problem}")


_REQUIRED = ("id", "arrival", "tokens", "output_tokens")
_OPTIONAL = (
    "output_token_ids", "salt", "lora", "priority", "prompt_logprobs", "tenant", "session", "system_tokens",
)
_KNOWN = frozenset(_REQUIRED + _OPTIONAL)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_int(value: Any) -> TypeGuard[int]:
    """True for a JSON integer (an ``int`` that is not a ``bool``); every loader checks fields with it."""
    return isinstance(value, int) and not isinstance(value, bool)


def parse_token_list(values: Any, field: str, *, min_len: int = 1) -> np.ndarray:
    """A JSON list of token ids as an int64 array, checked vectorised; raises ``_FieldError``."""
    if not isinstance(values, list):
        raise _FieldError(field, f"expected a list of ints, got {_short(values)}")
    if len(values) < min_len:
        raise _FieldError(field, f"expected at least {min_len} token id(s), got {len(values)}")
    if not values:
        return np.empty(0, dtype=np.int64)
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError):  # ragged nesting
        arr = np.asarray([0.5])  # force the slow diagnosis below
    if arr.ndim == 1 and arr.dtype.kind == "i" and not any(v.__class__ is bool for v in values):  # true is no id
        if arr.dtype != np.int64:
            arr = arr.astype(np.int64)
        bad = (arr < 0) | (arr >= TOKEN_ID_LIMIT)
        if bad.any():
            i = int(np.argmax(bad))
            raise _FieldError(field, f"token id at index {i} out of range [0, 2**62): {int(arr[i])}")
        return arr
    # Slow path, errors only: find the first offending element for a precise message.
    for i, v in enumerate(values):
        if not is_int(v):
            raise _FieldError(field, f"token id at index {i}: expected int, got {_short(v)}")
        if not 0 <= v < TOKEN_ID_LIMIT:
            raise _FieldError(field, f"token id at index {i} out of range [0, 2**62): {v}")
    raise _FieldError(field, "not a flat list of ints")  # pragma: no cover - defensive


def _finite(value: int | float) -> bool:
    """A finite number that a float can hold (an int beyond the float range is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _opt_str(obj: dict[str, Any], key: str) -> str | None:
    v = obj.get(key)
    if v is not None and not isinstance(v, str):
        raise _FieldError(key, f"expected str or null, got {_short(v)}")
    return v


def parse_request(obj: Any) -> TraceRequest:
    """Validate one decoded JSON line and build the request; raises ``_FieldError``."""
    return _request(obj, None)


def _request(obj: Any, arrays: dict[str, Any] | None) -> TraceRequest:
    """:func:`parse_request`, with the ``tokens`` / ``output_token_ids`` values the compiled scanner
    already parsed (``arrays``; their placeholders in ``obj`` are ignored)."""
    if not isinstance(obj, dict):
        raise _FieldError(None, f"expected a JSON object, got {type(obj).__name__}")
    for key in obj:
        if key not in _KNOWN:
            raise _FieldError(key, "unknown field")
    for key in _REQUIRED:
        if key not in obj:
            raise _FieldError(key, "missing required field")

    rid = obj["id"]
    if is_int(rid):
        rid = str(rid)
    elif not isinstance(rid, str) or not rid:
        raise _FieldError("id", f"expected non-empty str or int, got {_short(rid)}")

    arrival = obj["arrival"]
    if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not _finite(arrival):
        raise _FieldError("arrival", f"expected finite number >= 0, got {_short(arrival)}")
    if arrival < 0:
        raise _FieldError("arrival", f"expected finite number >= 0, got {arrival!r}")

    out = obj["output_tokens"]
    if not is_int(out) or out < 1:
        raise _FieldError("output_tokens", f"expected int >= 1, got {_short(out)}")
    if out >= MAX_OUTPUT_TOKENS:
        raise _FieldError("output_tokens", f"expected int < 2**24 ({MAX_OUTPUT_TOKENS}), got {out}")

    given = arrays or {}
    tokens: np.ndarray | RunTokens
    if "tokens" in given:
        value = given["tokens"]
        tokens = RunTokens(*value) if isinstance(value, tuple) else value
    else:
        tokens = parse_token_list(obj["tokens"], "tokens")

    out_ids = obj.get("output_token_ids")
    if "output_token_ids" in given:
        value = given["output_token_ids"]
        out_ids = RunTokens(*value).materialize() if isinstance(value, tuple) else value
    elif out_ids is not None:
        out_ids = parse_token_list(out_ids, "output_token_ids", min_len=0)
    if out_ids is not None and len(out_ids) < out:
        raise _FieldError("output_token_ids", f"expected length >= output_tokens ({out}), got {len(out_ids)}")

    priority = obj.get("priority", 0)
    if not is_int(priority):
        raise _FieldError("priority", f"expected int, got {_short(priority)}")
    plp = obj.get("prompt_logprobs", False)
    if not isinstance(plp, bool):
        raise _FieldError("prompt_logprobs", f"expected bool, got {_short(plp)}")
    sys_tokens = obj.get("system_tokens", 0)
    if not is_int(sys_tokens) or not 0 <= sys_tokens <= len(tokens):
        raise _FieldError("system_tokens", f"expected int in [0, len(tokens)], got {_short(sys_tokens)}")

    return TraceRequest(
        id=rid,
        arrival=float(arrival),
        tokens=tokens,
        output_tokens=out,
        output_token_ids=out_ids,
        salt=_opt_str(obj, "salt"),
        lora=_opt_str(obj, "lora"),
        priority=priority,
        prompt_logprobs=plp,
        tenant=_opt_str(obj, "tenant"),
        session=_opt_str(obj, "session"),
        system_tokens=sys_tokens,
    )


def _header(obj: dict[str, Any]) -> dict[str, Any]:
    """The header object of line 1 (see :data:`HEADER_KEY`); a hashed trace is not read here."""
    head = obj[HEADER_KEY]
    if len(obj) != 1 or not isinstance(head, dict):
        raise _FieldError(HEADER_KEY, "expected a header line {\"apcsim_trace\": {...}} and nothing else")
    if head.get("kind", "tokens") != "tokens":
        raise _FieldError(HEADER_KEY, f"a {head.get('kind')!r} trace, not token ids: replay it with "
                                      "workload kind 'trace' (its format is detected)")
    return head


def decode_json_line(raw: bytes, path: str, lineno: int) -> Any:
    """:func:`decode_line` for any JSONL loader: raises ``TraceFormatError`` (``path:lineno: ...``)."""
    try:
        return decode_line(raw)
    except _FieldError as exc:
        raise TraceFormatError(path, lineno, exc.field, exc.problem) from None


class TraceReader:
    """Streams the requests of a canonical JSONL trace (see the module docstring); one chunk of the
    file is in memory at a time.

    After (or during) iteration, ``skipped`` is the number of bad lines skipped (only with
    ``skip_bad_lines=True``; callers must report it), ``skipped_lines`` holds the first
    ``MAX_SKIPPED_LINES_KEPT`` of their 1-based line numbers, and ``origin_s`` is the first
    request's arrival in the file (what was subtracted from every arrival), ``header`` the header
    object of line 1 if the file has one (:data:`HEADER_KEY`). Iterating again re-reads
    the file and resets them. ``allow_empty`` lets a trace whose every line was skipped replay no
    requests instead of raising.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, skip_bad_lines: bool = False, allow_empty: bool = False
    ) -> None:
        self.path = Path(path)
        self.skip_bad_lines = skip_bad_lines
        self.allow_empty = allow_empty
        self.skipped = 0
        self.skipped_lines: list[int] = []
        self.origin_s: float | None = None
        self.header: dict[str, Any] | None = None
        check_trace_path(self.path)  # missing, a directory, a FIFO: refused by kind, before any read

    def __iter__(self) -> Iterator[TraceRequest]:
        self.skipped = 0
        self.skipped_lines = []
        self.origin_s = None
        self.header = None
        name = os.fspath(self.path)
        seen: dict[str, int] = {}
        origin: Decimal | None = None  # the first accepted arrival, exact
        last = Decimal(0)  # the previous accepted arrival, exact
        lineno = 0
        for lineno, raw, arrays in trace_lines(self.path):
            try:
                obj = decode_line(raw)
                if lineno == 1 and isinstance(obj, dict) and HEADER_KEY in obj:
                    self.header = _header(obj)  # written by apcsim convert / anonymize; not a request
                    continue
                req = _request(obj, arrays)
                exact = exact_number(obj["arrival"])
                rel = float(_EXACT.subtract(exact, exact if origin is None else origin))
                if exact < last:
                    raise _FieldError(
                        "arrival",
                        f"{req.arrival!r} is before the previous arrival {float(last)!r} "
                        "(the file must be sorted by arrival)",
                    )
                if rel > MAX_ARRIVAL_SPAN_S:
                    raise _FieldError("arrival", f"{req.arrival!r} is more than 2**32 s after the first arrival "
                                                 f"{float(origin)!r}")  # type: ignore[arg-type]
                if req.id in seen:
                    raise _FieldError("id", f"duplicate id {req.id!r} (first on line {seen[req.id]})")
            except _FieldError as exc:
                if not self.skip_bad_lines:
                    raise TraceFormatError(name, lineno, exc.field, exc.problem) from None
                self.skipped += 1
                if len(self.skipped_lines) < MAX_SKIPPED_LINES_KEPT:
                    self.skipped_lines.append(lineno)
                continue
            if origin is None:
                origin = exact
                self.origin_s = float(exact)
            seen[req.id] = lineno
            last = exact
            req.arrival = rel  # correctly rounded, so sorted exact arrivals stay sorted
            yield req
        if not seen:
            if not self.skipped:
                raise TraceFormatError(name, max(lineno, 1), None, "empty trace: no request lines")
            if not self.allow_empty:
                raise TraceFormatError(
                    name, self.skipped_lines[0], None,
                    f"every line was skipped as bad ({self.skipped} lines, the first here); "
                    "set allow_empty: true to replay no requests",
                )


def read_trace(
    path: str | os.PathLike[str], *, skip_bad_lines: bool = False, allow_empty: bool = False
) -> TraceReader:
    """A lazy reader of the canonical JSONL trace at ``path`` (see :class:`TraceReader`)."""
    return TraceReader(path, skip_bad_lines=skip_bad_lines, allow_empty=allow_empty)


def request_to_json(req: TraceRequest) -> str:
    """One compact JSON line (no newline); optional fields at their defaults are omitted."""
    obj: dict[str, Any] = {
        "id": str(req.id),
        "arrival": float(req.arrival),
        "tokens": token_array(req.tokens).tolist(),
        "output_tokens": int(req.output_tokens),
    }
    if req.output_token_ids is not None:
        obj["output_token_ids"] = np.asarray(req.output_token_ids, dtype=np.int64).tolist()
    for key in ("salt", "lora", "tenant", "session"):
        value = getattr(req, key)
        if value is not None:
            obj[key] = value
    if req.priority != 0:
        obj["priority"] = int(req.priority)
    if req.prompt_logprobs:
        obj["prompt_logprobs"] = True
    if req.system_tokens:
        obj["system_tokens"] = int(req.system_tokens)
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def write_trace(path: str | os.PathLike[str], requests: Iterable[TraceRequest]) -> int:
    """Write ``requests`` as canonical JSONL (one compact object per line); returns the count.

    Nothing is validated here beyond JSON-serialisability; read the file back with
    :func:`read_trace` to check it.
    """
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for req in requests:
            fh.write(request_to_json(req))
            fh.write("\n")
            n += 1
    return n
