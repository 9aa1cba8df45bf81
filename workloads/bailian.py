"""Loader for the Qwen-Bailian usage traces (Alibaba, "KVCache cache in the wild", 2025; the
public ``qwen-bailian-usagetraces-anon`` JSONL): ``chat_id``, ``parent_chat_id`` (-1 for the first
turn of a session), ``timestamp`` (seconds), ``input_length``, ``output_length``, ``type``
(text/search/image/file), ``turn`` and ``hash_ids`` (salted hashes of 16-token blocks,
prefix-chained, the last block partial).

Re-blocking is Mooncake's (``workloads.mooncake``): hash id ``h`` expands into the token ids
``h * 16 + k``, the prompt is their concatenation cut to ``input_length``; replayed at a block
size below 16 the hit rate is a lower bound. The session of a request is the ``chat_id`` of its
root (the chain of ``parent_chat_id`` followed back; a parent not seen earlier in the file starts
a session of its own), so ``per_session`` salts and the session columns follow conversations; the
request type goes to ``tenant`` (``text``, ``search``, ...) only with ``type_as_tenant``.

Bad lines (``TraceFormatError`` ``file:line: field 'x': problem``, or skipped and counted with
``skip_bad_lines``): unknown or missing fields, non-int lengths, ``output_length < 1``,
``len(hash_ids) != ceil(input_length / 16)``, ids out of range, a repeated ``chat_id`` and a
timestamp before the previous one. Invariants: a prompt is exactly ``input_length`` tokens.
Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

BAILIAN_BLOCK_SIZE = 16
"""Tokens per hash id in the Qwen-Bailian traces."""

_REQUIRED = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "hash_ids")
_KNOWN = frozenset(_REQUIRED + ("type", "turn"))


def _parse(obj: Any, tokens_per_id: int) -> tuple[int, int, float, int, int, list[int], str | None]:
    """``(chat_id, parent, timestamp_s, input_length, output_length, hash_ids, type)``; raises
    ``(field, problem)`` as a tuple inside ``ValueError``."""
    if not isinstance(obj, dict):
        raise ValueError(None, f"expected a JSON object, got {type(obj).__name__}")
    for key in obj:
        if key not in _KNOWN:
            raise ValueError(key, "unknown field")
    for key in _REQUIRED:
        if key not in obj:
            raise ValueError(key, "missing required field")
    chat, parent = obj["chat_id"], obj["parent_chat_id"]
    if not is_int(chat) or chat < 0:
        raise ValueError("chat_id", f"expected an int >= 0, got {chat!r}")
    if not is_int(parent) or parent < -1:
        raise ValueError("parent_chat_id", f"expected an int >= -1, got {parent!r}")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise ValueError("timestamp", f"expected a finite number >= 0 (s), got {ts!r}")
    n_in, n_out = obj["input_length"], obj["output_length"]
    if not is_int(n_in) or n_in < 1:
        raise ValueError("input_length", f"expected an int >= 1, got {n_in!r}")
    if not is_int(n_out) or not 1 <= n_out < MAX_OUTPUT_TOKENS:
        raise ValueError("output_length", f"expected an int in [1, 2**24) (vLLM needs max_tokens >= 1), got {n_out!r}")
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise ValueError("hash_ids", f"expected a list of ints, got {type(ids).__name__}")
    want = -(-n_in // tokens_per_id)
    if len(ids) != want:
        raise ValueError("hash_ids", f"{len(ids)} ids for input_length {n_in}: expected ceil({n_in} / "
                                     f"{tokens_per_id}) = {want} at {tokens_per_id} tokens per id")
    limit = TOKEN_ID_LIMIT // tokens_per_id
    for i, h in enumerate(ids):
        if not is_int(h) or not 0 <= h < limit:
            raise ValueError("hash_ids", f"id at index {i}: expected an int in [0, {limit}), got {h!r}")
    kind = obj.get("type")
    if kind is not None and not isinstance(kind, str):
        raise ValueError("type", f"expected a string, got {kind!r}")
    turn = obj.get("turn", 1)
    if not is_int(turn) or turn < 1:
        raise ValueError("turn", f"expected an int >= 1, got {turn!r}")
    return chat, parent, float(ts), n_in, n_out, ids, kind


def load_bailian(
    path: str | os.PathLike[str],
    *,
    tokens_per_id: int = BAILIAN_BLOCK_SIZE,
    time_scale: float = 1.0,
    limit: int | None = None,
    max_output_tokens: int | None = None,
    type_as_tenant: bool = False,
    skip_bad_lines: bool = False,
    skip_log: SkipLog | None = None,
    allow_empty: bool = False,
) -> Iterator[TraceRequest]:
    """Stream a Bailian trace as :class:`TraceRequest` (ids ``bl-{chat_id}``, ``arrival =
    timestamp * time_scale``, sessions ``bl-s{root chat_id}``). An empty trace, or one whose every
    line was skipped without ``allow_empty``, raises ``TraceFormatError``."""
    p = Path(path)
    check_trace_path(p)  # missing, a directory, a FIFO: refused by kind before any read, as load_mooncake does
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise ValueError(f"time_scale must be finite and > 0, got {time_scale!r}")
    log = skip_log if skip_log is not None else SkipLog()
    return _generate(p, tokens_per_id, time_scale, limit, max_output_tokens, type_as_tenant, skip_bad_lines, log,
                     allow_empty)


def _generate(path: Path, tokens_per_id: int, time_scale: float, limit: int | None, max_output_tokens: int | None,
              type_as_tenant: bool, skip_bad_lines: bool, log: SkipLog, allow_empty: bool) -> Iterator[TraceRequest]:
    name = os.fspath(path)
    root: dict[int, int] = {}  # chat_id -> the chat_id of its session's first turn
    last_ts = -math.inf
    emitted = lineno = 0
    if limit == 0:
        return
    skipped_before = log.skipped
    for lineno, raw, _ in trace_lines(path, scan=False):
        try:
            obj = decode_json_line(raw, name, lineno)
            try:
                chat, parent, ts, n_in, n_out, ids, kind = _parse(obj, tokens_per_id)
            except ValueError as exc:
                field, problem = exc.args
                raise TraceFormatError(name, lineno, field, problem) from None
            if ts < last_ts:
                raise TraceFormatError(name, lineno, "timestamp", f"{ts!r} is before the previous timestamp "
                                                                  f"{last_ts!r}")
            if chat in root:
                raise TraceFormatError(name, lineno, "chat_id", f"duplicate chat_id {chat}")
        except TraceFormatError as err:
            log.handle(err, skip_bad_lines)
            continue
        last_ts = ts
        root[chat] = root.get(parent, parent) if parent >= 0 else chat
        if max_output_tokens is not None:
            n_out = min(n_out, max_output_tokens)
        yield TraceRequest(
            id=f"bl-{chat}", arrival=ts * time_scale, tokens=RunTokens.from_id_list(ids, tokens_per_id, 0, n_in),
            output_tokens=n_out, session=f"bl-s{root[chat]}", tenant=kind if type_as_tenant else None,
        )
        emitted += 1
        if limit is not None and emitted >= limit:
            return
    if emitted == 0:
        log.refuse_empty(name, lineno, skipped_before, allow_empty)
