"""Loader for coding-agent session traces (mirrors the format of callanjfox/kv-cache-tester, "WEKA
agent sample").

One JSON document per session file: ``block_size`` (64), ``hash_id_scope`` (``local``: ids are
private to the file; ``global``: shared by all files), ``tool_tokens`` and ``system_tokens`` (the
shared tool + system prompt, given only as counts), ``requests[]`` with ``t`` (seconds from the
session start), ``in``, ``out``, ``hash_ids`` (one id per *full* block, chained, so
``len == in // block_size``) and informational fields (``type``, ``stop``, ``think_time``,
``api_time``, ... -- unknown keys are ignored). A record ``{"type": "subagent", "requests": [...]}``
is a nested sub-agent: its requests' ``t`` count from the sub-agent's start, which is the record's
own ``t`` if present, else the previous request's ``t`` (an assumption: the sample holds no
sub-agents); it may carry its own ``tool_tokens`` / ``system_tokens``.

Re-blocking (token ids, see ``workloads.tokens``):

* the first ``shared_prompt_fraction * (tool_tokens + system_tokens)`` tokens of every request
  come from ONE canonical stream shared by all sessions (Claude Code renders tools, then system,
  then messages): two sessions share ``min`` of their shared lengths -- the same model as the
  trace tool's "warm prefix". ``0`` keeps every session's prompt private;
* the rest of the full blocks: id ``h`` -> ``64`` ids ``base + h * 64 + k``, ``base`` per file
  (local scope) or common (global scope);
* the ``in % 64`` tail tokens have no id in the trace: they get ids unique to the request.

At block sizes below 64 this is a lower bound (distinct ids may share leading tokens; tails may
really be shared). Memory: a session is read when it starts; each prompt is kept as runs of
consecutive ids (a few runs, whatever its length). ``out == 0`` (2 records in the sample, output
not recorded) is replayed as 1 token (vLLM needs ``max_tokens >= 1``); ``loader.clamped_outputs``
counts them. Errors name the file, line 1 (the document starts there; the files are one line) and
the JSON path of the bad value, e.g. ``field 'requests[3].hash_ids'``; with ``skip_bad_lines`` a
bad record (or a whole unreadable file) is skipped and counted.

Invariants: a session's requests come sorted by arrival; the shared prompt is the same ids in
every session. Imports neither simpy nor torch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workloads.errors import SkipLog
from workloads.tokens import K_AGENT_TRACE_GLOBAL, K_AGENT_TRACE_SESSION, K_AGENT_TRACE_SHARED, RunTokens, region
from workloads.trace_format import TraceFormatError, TraceRequest, is_int

_TAIL_OFFSET = 1 << 31  # tails live in the upper half of a session's region
_SHARED = region(K_AGENT_TRACE_SHARED, 0)



def _num(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0


def session_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The session files of a folder (``*.json``), sorted by name."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"agent trace folder not found: {root}")
    files = sorted(p for p in root.glob("*.json") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no *.json session files in {root}")
    return files


@dataclass
class AgentTraceLoader:
    """Reads session files lazily; one instance per workload (it carries the counters)."""

    shared_prompt_fraction: float = 1.0
    max_output_tokens: int | None = None
    skip_bad_lines: bool = False
    log: SkipLog = field(default_factory=lambda: SkipLog(with_file=True))
    clamped_outputs: int = 0

    def session(self, path: Path, file_index: int) -> list[TraceRequest]:
        """All requests of one file, ``arrival`` relative to the session start, sorted by it."""
        name = os.fspath(path)
        try:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise TraceFormatError(
                    name, exc.lineno, None, f"malformed JSON: {exc.msg} (column {exc.colno})"
                ) from None
            if not isinstance(doc, dict):
                raise TraceFormatError(name, 1, None, f"expected a JSON object, got {type(doc).__name__}")
            bs = doc.get("block_size")
            if not is_int(bs) or bs < 1:
                raise TraceFormatError(name, 1, "block_size", f"expected int >= 1, got {bs!r}")
            scope = doc.get("hash_id_scope", "local")
            if scope not in ("local", "global"):
                raise TraceFormatError(name, 1, "hash_id_scope", f"expected 'local' or 'global', got {scope!r}")
            shared = self._prompt_len(doc, name, "")
            if not isinstance(doc.get("requests"), list):
                raise TraceFormatError(name, 1, "requests", "missing or not a list")
        except TraceFormatError as err:
            self.log.handle(err, self.skip_bad_lines)
            return []
        raw_id = doc.get("id")
        sid = raw_id if isinstance(raw_id, str) else path.stem
        local = region(K_AGENT_TRACE_GLOBAL, 0) if scope == "global" else region(K_AGENT_TRACE_SESSION, file_index)
        ctx = _Ctx(name, sid, bs, local, region(K_AGENT_TRACE_SESSION, file_index) + _TAIL_OFFSET)
        out: list[tuple[float, int, TraceRequest]] = []
        self._walk(doc["requests"], "requests", 0.0, shared, sid, ctx, out)
        out.sort(key=lambda x: (x[0], x[1]))
        return [r for _, _, r in out]

    def _prompt_len(self, obj: dict[str, Any], name: str, where: str) -> tuple[int, int]:
        """``(shared_len, system_len)``: the shared-stream tokens and the tool + system count."""
        total = 0
        for key in ("tool_tokens", "system_tokens"):
            v = obj.get(key, 0)
            if not is_int(v) or v < 0:
                raise TraceFormatError(name, 1, f"{where}{key}", f"expected int >= 0, got {v!r}")
            total += v
        return int(self.shared_prompt_fraction * total), total

    def _walk(self, records: list[Any], where: str, t0: float, prompt: tuple[int, int], prefix: str,
              ctx: _Ctx, out: list[tuple[float, int, TraceRequest]]) -> None:
        last_t = t0
        n_sub = 0
        for i, rec in enumerate(records):
            at = f"{where}[{i}]"
            try:
                if not isinstance(rec, dict):
                    raise TraceFormatError(ctx.name, 1, at, "expected an object")
                if rec.get("type") == "subagent":
                    sub_t = rec.get("t", last_t - t0)
                    if not _num(sub_t):
                        raise TraceFormatError(ctx.name, 1, f"{at}.t", f"expected a number >= 0, got {sub_t!r}")
                    if not isinstance(rec.get("requests"), list):
                        raise TraceFormatError(ctx.name, 1, f"{at}.requests", "missing or not a list")
                    sub_prompt = self._prompt_len(rec, ctx.name, f"{at}.")
                    n_sub += 1
                    self._walk(rec["requests"], f"{at}.requests", t0 + float(sub_t), sub_prompt,
                               f"{prefix}-sa{n_sub}", ctx, out)
                    continue
                req = self._request(rec, at, t0, prompt, prefix, ctx)
            except TraceFormatError as err:
                self.log.handle(err, self.skip_bad_lines)
                continue
            last_t = req.arrival
            out.append((req.arrival, len(out), req))

    def _request(self, rec: dict[str, Any], at: str, t0: float, prompt: tuple[int, int], prefix: str,
                 ctx: _Ctx) -> TraceRequest:
        def bad(key: str, problem: str) -> TraceFormatError:
            return TraceFormatError(ctx.name, 1, f"{at}.{key}", problem)

        for key in ("t", "in", "out", "hash_ids"):
            if key not in rec:
                raise bad(key, "missing required field")
        t, n_in, n_out, ids = rec["t"], rec["in"], rec["out"], rec["hash_ids"]
        if not _num(t):
            raise bad("t", f"expected a number >= 0, got {t!r}")
        if not is_int(n_in) or n_in < 1:
            raise bad("in", f"expected int >= 1, got {n_in!r}")
        if not is_int(n_out) or n_out < 0:
            raise bad("out", f"expected int >= 0, got {n_out!r}")
        if not isinstance(ids, list):
            raise bad("hash_ids", f"expected a list of ints, got {type(ids).__name__}")
        bs = ctx.block_size
        if len(ids) != n_in // bs:
            raise bad("hash_ids", f"expected in // block_size = {n_in // bs} ids, got {len(ids)}")
        arr = np.asarray(ids) if ids else np.empty(0, dtype=np.int64)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind != "i"):
            j = next((j for j, v in enumerate(ids) if not is_int(v)), 0)
            raise bad("hash_ids", f"id at index {j}: expected int, got {ids[j]!r}")
        limit = _TAIL_OFFSET // bs
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= limit):
            raise bad("hash_ids", f"ids must be in [0, {limit})")
        k = ctx.next_index()
        if k * bs >= _TAIL_OFFSET:
            raise bad("hash_ids", "too many requests in one session file")
        if n_out == 0:
            self.clamped_outputs += 1
            n_out = 1
        if self.max_output_tokens is not None:
            n_out = min(n_out, self.max_output_tokens)
        shared_len, system_len = prompt
        full = arr.size * bs
        p = min(shared_len, n_in)
        tokens = RunTokens.of(
            (_SHARED, p),
            RunTokens.from_ids(arr, bs, ctx.local).slice(p, full),
            (ctx.tail + k * bs + max(p, full) - full, n_in - max(p, full)),
        )
        return TraceRequest(
            id=f"{prefix}-{k}", arrival=t0 + float(t), tokens=tokens, output_tokens=n_out,
            session=ctx.session, system_tokens=min(system_len, n_in),
        )


@dataclass
class _Ctx:
    name: str
    session: str
    block_size: int
    local: int
    tail: int
    count: int = 0

    def next_index(self) -> int:
        self.count += 1
        return self.count - 1


def iter_sessions(folder: str | os.PathLike[str], loader: AgentTraceLoader,
                  max_sessions: int | None = None) -> Iterator[list[TraceRequest]]:
    """Sessions in file-name order (session-relative arrivals); each file is read when pulled."""
    for i, path in enumerate(session_files(folder)[:max_sessions]):
        yield loader.session(path, i)
