"""Loader for the RAGPulse trace (mirrors flashserve/RAGPulse's files): RAG requests made of content
components.

Files (one folder): ``0_trace.jsonl`` -- one request per line: ``timestamp`` (seconds, a string
or a number), ``input_length``, ``output_length``, ``session_id``, ``hash_ids`` = an object of
ordered id lists ``sys_prompt``, ``passages_ids``, ``history``, ``web_search``, ``user_input``;
and one length table per component (``1_sys_prompt.jsonl`` ``{"sys_prompt_id", "token_length"}``,
``2_passages.jsonl`` ``passage_id``, ``3_history.jsonl`` ``history_id``, ``4_user_input.jsonl``
``user_input_id``, ``5_web_search.jsonl`` ``web_search_id``).

Re-blocking: component id ``c`` expands to ``token_length(c)`` distinct ids
``region(K_RAGPULSE, 0) + c * 512 + k``; the prompt is sys_prompt, passages, history, web_search,
user_input in that order, then ``input_length - sum(component lengths)`` (6..12 in the shipped
trace) template tokens with fixed shared ids at the end. Components are not fixed-size blocks, so
this is exact at every block size *given* that distinct ids are distinct content (a lower bound
where two ids really share leading tokens). Checked fact: the token-weighted infinite-cache bound
in arrival order at block 16 is 0.3143 (published: 0.314). Putting the template tokens first
instead would give 0.311; dropping them 0.315.

Order: the file is not sorted (one inversion in the shipped trace); requests are replayed sorted
by timestamp, file order breaking ties. This needs the whole file read first: the loader keeps
only compact per-request id arrays (about 12 ids each), not tokens. Ids are ``rp-{line_index}``
(0-based line of ``0_trace.jsonl``); ``session`` is ``session_id``; ``system_tokens`` is the
sys_prompt length.

Invariants: a component id expands to the same ids, of its table length, in every request.
Imports neither simpy nor torch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workloads.errors import SkipLog
from workloads.tokens import K_RAGPULSE, RAG_TEMPLATE, RunTokens, region
from workloads.trace_format import TraceFormatError, TraceRequest, is_int

COMPONENTS = ("sys_prompt", "passages_ids", "history", "web_search", "user_input")
TABLES = {
    "sys_prompt": ("1_sys_prompt.jsonl", "sys_prompt_id"),
    "passages_ids": ("2_passages.jsonl", "passage_id"),
    "history": ("3_history.jsonl", "history_id"),
    "user_input": ("4_user_input.jsonl", "user_input_id"),
    "web_search": ("5_web_search.jsonl", "web_search_id"),
}
MAX_COMPONENT_TOKENS = 512
"""Components are at most 512 tokens; id ``c`` owns ids ``c*512 .. c*512+511``."""
_FIELDS = ("timestamp", "input_length", "output_length", "session_id", "hash_ids")
_BASE = region(K_RAGPULSE, 0)
_MAX_ID = ((1 << 32) // MAX_COMPONENT_TOKENS) - 1



def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                yield lineno, line


def load_tables(folder: Path, skip_bad_lines: bool, log: SkipLog) -> dict[str, dict[int, int]]:
    """Component id -> token length, per component; every line checked."""
    tables: dict[str, dict[int, int]] = {}
    for comp, (fname, key) in TABLES.items():
        path = folder / fname
        if not path.is_file():
            raise FileNotFoundError(f"RAGPulse table not found: {path}")
        table: dict[int, int] = {}
        for lineno, line in _lines(path):
            try:
                obj = _json(line, str(path), lineno)
                for k in obj:
                    if k not in (key, "token_length"):
                        raise TraceFormatError(str(path), lineno, k, "unknown field")
                cid = _bounded_int(obj, key, 0, _MAX_ID, str(path), lineno)
                n = _bounded_int(obj, "token_length", 1, MAX_COMPONENT_TOKENS, str(path), lineno)
                if cid in table:
                    raise TraceFormatError(str(path), lineno, key, f"duplicate id {cid}")
            except TraceFormatError as err:
                log.handle(err, skip_bad_lines)
                continue
            table[cid] = n
        tables[comp] = table
    return tables


def _bounded_int(obj: dict[str, Any], name: str, lo: int, hi: int, path: str, lineno: int) -> int:
    """``obj[name]``, an int in ``[lo, hi]``, or a TraceFormatError naming the field."""
    v = obj.get(name)
    if v is None:
        raise TraceFormatError(path, lineno, name, "missing required field")
    if not is_int(v) or not lo <= v <= hi:
        raise TraceFormatError(path, lineno, name, f"expected int in [{lo}, {hi}], got {v!r}")
    return v


def _json(line: str, path: str, lineno: int) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, lineno, None, f"malformed JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
    return obj


@dataclass(slots=True)
class _Row:
    """One parsed trace line, compact: component ids in prompt order and their lengths."""

    ts: float
    index: int
    input_length: int
    output_length: int
    session: str
    ids: np.ndarray
    lengths: np.ndarray
    system_tokens: int


def _parse(line: str, path: str, lineno: int, tables: dict[str, dict[int, int]]) -> _Row:
    obj = _json(line, path, lineno)

    def bad(field: str, problem: str) -> TraceFormatError:
        return TraceFormatError(path, lineno, field, problem)

    for k in obj:
        if k not in _FIELDS:
            raise bad(k, "unknown field")
    for k in _FIELDS:
        if k not in obj:
            raise bad(k, "missing required field")
    raw_ts = obj["timestamp"]
    try:
        numeric = not isinstance(raw_ts, bool) and isinstance(raw_ts, (int, float))
        ts = float(raw_ts) if isinstance(raw_ts, str) or numeric else math.nan
    except ValueError:
        ts = math.nan
    if not (math.isfinite(ts) and ts >= 0):
        raise bad("timestamp", f"expected a finite number >= 0 (seconds, may be a string), got {raw_ts!r}")
    n_in, n_out = obj["input_length"], obj["output_length"]
    if not is_int(n_in) or n_in < 1:
        raise bad("input_length", f"expected int >= 1, got {n_in!r}")
    if not is_int(n_out) or n_out < 1:
        raise bad("output_length", f"expected int >= 1 (vLLM needs max_tokens >= 1), got {n_out!r}")
    if not isinstance(obj["session_id"], str):
        raise bad("session_id", f"expected str, got {obj['session_id']!r}")
    comps = obj["hash_ids"]
    if not isinstance(comps, dict):
        raise bad("hash_ids", f"expected an object of component lists, got {type(comps).__name__}")
    for k in comps:
        if k not in COMPONENTS:
            raise bad(f"hash_ids.{k}", "unknown component")
    ids: list[int] = []
    lengths: list[int] = []
    system_tokens = 0
    for comp in COMPONENTS:
        field = f"hash_ids.{comp}"
        values = comps.get(comp)
        if values is None:
            raise bad(field, "missing required component")
        if not isinstance(values, list):
            raise bad(field, f"expected a list of ints, got {type(values).__name__}")
        table = tables[comp]
        for i, v in enumerate(values):
            if not is_int(v):
                raise bad(field, f"id at index {i}: expected int, got {v!r}")
            n = table.get(v)
            if n is None:
                raise bad(field, f"id {v} at index {i} is not in {TABLES[comp][0]}")
            ids.append(v)
            lengths.append(n)
        if comp == "sys_prompt":
            system_tokens = sum(lengths)
    total = sum(lengths)
    if total > n_in:
        raise bad("input_length", f"{n_in} is less than the summed component lengths {total}")
    return _Row(ts, lineno - 1, n_in, n_out, obj["session_id"],
                np.asarray(ids, dtype=np.int64), np.asarray(lengths, dtype=np.int64), system_tokens)


def prompt_tokens(ids: np.ndarray, lengths: np.ndarray, input_length: int) -> RunTokens:
    """The compact prompt: one run per component, then the template tokens."""
    return RunTokens.of(RunTokens(_BASE + ids * MAX_COMPONENT_TOKENS, lengths),
                        (RAG_TEMPLATE, input_length - int(lengths.sum())))


def load_ragpulse(
    folder: str | os.PathLike[str],
    *,
    limit: int | None = None,
    max_output_tokens: int | None = None,
    skip_bad_lines: bool = False,
    skip_log: SkipLog | None = None,
) -> Iterator[TraceRequest]:
    """Requests of a RAGPulse folder in timestamp order (see the module docstring).

    Reads and checks every table and trace line before yielding the first request (the trace is
    not sorted). ``limit`` caps the requests yielded (the first ones in arrival order).
    """
    root = Path(folder)
    trace = root / "0_trace.jsonl"
    if not trace.is_file():
        raise FileNotFoundError(f"RAGPulse trace not found: {trace}")
    log = skip_log if skip_log is not None else SkipLog(with_file=True)
    tables = load_tables(root, skip_bad_lines, log)
    rows: list[_Row] = []
    for lineno, line in _lines(trace):
        try:
            rows.append(_parse(line, str(trace), lineno, tables))
        except TraceFormatError as err:
            log.handle(err, skip_bad_lines)
    rows.sort(key=lambda r: (r.ts, r.index))
    if limit is not None:
        rows = rows[:limit]
    return _emit(rows, max_output_tokens)


def _emit(rows: list[_Row], max_output_tokens: int | None) -> Iterator[TraceRequest]:
    for row in rows:
        n_out = row.output_length if max_output_tokens is None else min(row.output_length, max_output_tokens)
        yield TraceRequest(
            id=f"rp-{row.index}",
            arrival=row.ts,
            tokens=prompt_tokens(row.ids, row.lengths, row.input_length),
            output_tokens=n_out,
            session=row.session,
            system_tokens=row.system_tokens,
        )
