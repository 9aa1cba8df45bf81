"""Shareable hashed traces: ``apcsim anonymize`` writes one from a canonical token trace, and the
``trace`` workload reads it back (mirrors how the field shares production traces: Mooncake's
``hash_ids`` at 512 tokens, Qwen-Bailian's salted hashes at 16; and vLLM's own chained block
hashes, ``kv_cache_utils.hash_block_tokens``: a block's hash covers its parent's hash, its tokens
and the request's extra keys).

Writing, at block size ``B`` with a secret: each request's token sequence (the prompt, then its
``output_token_ids`` when the trace has them, so that a later turn can still hit this answer) is
cut into blocks of ``B`` tokens, the last one partial. Block ``i``'s id is a keyed BLAKE2b of the
previous block's digest, the block's token ids and the extra keys that separate cache namespaces
(the LoRA name in every block and the ``cache_salt`` in block 0, as vLLM does), reduced below
``2**62 / B``. Session, tenant and LoRA labels become keyed hashes of themselves; request ids
become ``r<index>``; arrival, output length, priority, ``prompt_logprobs`` and ``system_tokens``
stay. No token id and no text is written. Line 1 is the header ``{"apcsim_trace": {"kind":
"hashed", "block_size": B, ...}}``; requests keep the input's order.

Reading: id ``h`` expands into the token ids ``h * B + k`` (k < B), as Mooncake ids do
(``workloads.mooncake``), cut to ``input_length`` for the prompt; the next ``output_ids`` ids are
its ``output_token_ids``. Two blocks expand alike exactly when their ids are equal, and an id
covers the whole prefix up to its block, so a replay at block size ``B`` -- or a multiple of it,
whose blocks are runs of whole ids -- hits exactly the tokens the original hits, and times every
step alike (same TTFT). At a finer block size, or one that is not a multiple, the ids no longer
say which tokens inside a block are shared: the ``trace`` workload refuses it. Two distinct
blocks share an id with probability about ``n**2 / 2**(63 - log2 B)`` for ``n`` distinct blocks.

Bad lines raise ``TraceFormatError`` (or are skipped and counted). Imports sim.core and
``workloads`` only (neither simpy nor torch).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ApcsimError
from sim.core.request import token_array
from workloads.errors import SkipLog
from workloads.mooncake import expand_hash_ids
from workloads.tokens import RunTokens
from workloads.trace_format import (
    HEADER_KEY,
    MAX_OUTPUT_TOKENS,
    TOKEN_ID_LIMIT,
    TraceFormatError,
    TraceRequest,
    decode_json_line,
    is_int,
    read_trace,
)
from workloads.trace_lines import trace_lines

_FIELDS = ("id", "arrival", "hash_ids", "input_length", "output_tokens", "output_ids", "last_block_tokens")
_OPTIONAL = frozenset({"session", "tenant", "lora", "priority", "prompt_logprobs", "system_tokens"})


class AnonymizeError(ApcsimError, ValueError):
    """Settings ``anonymize`` cannot use (one line)."""


@dataclass
class AnonymizeSummary:
    requests: int
    blocks: int
    skipped_lines: int
    block_size: int


class _Keyed:
    """The keyed hashes of one anonymization (BLAKE2b keyed with the secret)."""

    def __init__(self, secret: str, block_size: int) -> None:
        raw = secret.encode("utf-8")
        self.key = raw if len(raw) <= 64 else hashlib.sha256(raw).digest()
        self.limit = TOKEN_ID_LIMIT // block_size
        self.root = hashlib.blake2b(b"apcsim-root", key=self.key, digest_size=8).digest()

    def label(self, kind: str, value: str | None) -> str | None:
        if value is None:
            return None
        return kind + "-" + hashlib.blake2b(f"{kind}\x1f{value}".encode(), key=self.key, digest_size=6).hexdigest()

    def chain(self, seq: np.ndarray, block_size: int, lora: str | None, salt: str | None) -> list[int]:
        data = np.ascontiguousarray(seq, dtype="<i8").tobytes()
        extra = b"" if lora is None else b"L" + lora.encode()
        first = extra + (b"" if salt is None else b"S" + salt.encode())
        parent, ids, width = self.root, [], 8 * block_size
        for i in range(0, len(data), width):
            block = data[i:i + width]
            h = hashlib.blake2b(parent + struct.pack("<I", len(block)) + block + (first if i == 0 else extra),
                                key=self.key, digest_size=8).digest()
            ids.append(int.from_bytes(h, "little") % self.limit)
            parent = h
        return ids


def anonymize(src: str | os.PathLike[str], out: str | os.PathLike[str], *, block_size: int, secret: str,
              skip_bad_lines: bool = False) -> AnonymizeSummary:
    """Write the hashed trace of the canonical trace ``src`` to ``out`` (see the module docstring)."""
    if not is_int(block_size) or block_size < 1:
        raise AnonymizeError(f"block size must be an int >= 1, got {block_size!r}")
    if not secret:
        raise AnonymizeError("the salt (secret) must not be empty: it is what keeps the hashes from being reversed")
    keyed = _Keyed(secret, block_size)
    reader = read_trace(src, skip_bad_lines=skip_bad_lines)
    target = Path(out)
    body = target.with_name(target.name + ".part")
    n = blocks = 0
    try:
        with open(body, "w", encoding="utf-8") as fh:
            for req in reader:
                tokens = token_array(req.tokens)
                outs = (np.asarray(req.output_token_ids, dtype=np.int64)[: req.output_tokens]
                        if req.output_token_ids is not None else np.empty(0, dtype=np.int64))
                seq = np.concatenate([tokens, outs]) if outs.size else tokens
                ids = keyed.chain(seq, block_size, req.lora, req.salt)
                rec: dict[str, Any] = {
                    "id": f"r{n}", "arrival": req.arrival, "hash_ids": ids, "input_length": len(tokens),
                    "output_tokens": req.output_tokens, "output_ids": int(outs.size),
                    "last_block_tokens": len(seq) - (len(ids) - 1) * block_size,
                }
                for key in ("session", "tenant", "lora"):
                    label = keyed.label(key, getattr(req, key))
                    if label is not None:
                        rec[key] = label
                if req.priority:
                    rec["priority"] = req.priority
                if req.prompt_logprobs:
                    rec["prompt_logprobs"] = True
                if req.system_tokens:
                    rec["system_tokens"] = req.system_tokens
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
                n += 1
                blocks += len(ids)
        source = reader.header or {}
        header = {HEADER_KEY: {"version": 1, "kind": "hashed", "block_size": block_size, "requests": n,
                               "approximate": bool(source.get("approximate", False)),
                               "timestamps": source.get("timestamps", "epoch"), "skipped_lines": reader.skipped}}
        with open(target, "w", encoding="utf-8") as dst, open(body, encoding="utf-8") as fh:
            dst.write(json.dumps(header, separators=(",", ":")) + "\n")
            for line in fh:
                dst.write(line)
    finally:
        body.unlink(missing_ok=True)
    return AnonymizeSummary(n, blocks, reader.skipped, block_size)


def _check(obj: Any, block_size: int) -> TraceRequest:
    """One hashed line as a request; raises ``ValueError(field, problem)``."""
    if not isinstance(obj, dict):
        raise ValueError(None, f"expected a JSON object, got {type(obj).__name__}")
    for key in obj:
        if key not in _OPTIONAL and key not in _FIELDS:
            raise ValueError(key, "unknown field")
    for key in _FIELDS:
        if key not in obj:
            raise ValueError(key, "missing required field")
    n_in, n_out, n_ids = obj["input_length"], obj["output_tokens"], obj["output_ids"]
    if not is_int(n_in) or n_in < 1:
        raise ValueError("input_length", f"expected an int >= 1, got {n_in!r}")
    if not is_int(n_out) or not 1 <= n_out < MAX_OUTPUT_TOKENS:
        raise ValueError("output_tokens", f"expected an int in [1, 2**24), got {n_out!r}")
    if not is_int(n_ids) or n_ids not in (0, n_out):
        raise ValueError("output_ids", f"expected 0 or output_tokens ({n_out}), got {n_ids!r}")
    ids = obj["hash_ids"]
    total = n_in + n_ids
    if not isinstance(ids, list) or len(ids) != -(-total // block_size):
        raise ValueError("hash_ids", f"expected ceil((input_length + output_ids) / {block_size}) = "
                                     f"{-(-total // block_size)} ids")
    limit = TOKEN_ID_LIMIT // block_size
    if not all(is_int(h) and 0 <= h < limit for h in ids):
        raise ValueError("hash_ids", f"expected ints in [0, {limit})")
    if obj["last_block_tokens"] != total - (len(ids) - 1) * block_size:
        raise ValueError("last_block_tokens", f"expected {total - (len(ids) - 1) * block_size} "
                                              "(input_length + output_ids - full blocks)")
    arrival = obj["arrival"]
    if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not 0 <= arrival < float("inf"):
        raise ValueError("arrival", f"expected a finite number >= 0, got {arrival!r}")
    labels = {k: obj.get(k) for k in ("session", "tenant", "lora")}
    for key, value in labels.items():
        if value is not None and not isinstance(value, str):
            raise ValueError(key, "expected a string")
    out_ids = expand_hash_ids(np.asarray(ids), total, block_size)[n_in:] if n_ids else None
    return TraceRequest(
        id=str(obj["id"]), arrival=float(arrival), tokens=RunTokens.from_id_list(ids, block_size, 0, n_in),
        output_tokens=n_out, output_token_ids=out_ids, lora=labels["lora"], tenant=labels["tenant"],
        session=labels["session"], priority=int(obj.get("priority", 0)),
        prompt_logprobs=bool(obj.get("prompt_logprobs", False)), system_tokens=int(obj.get("system_tokens", 0)),
    )


class HashedTraceReader:
    """Streams the requests of a hashed trace (``header``: its line-1 header); counts skipped
    lines like :class:`~workloads.trace_format.TraceReader` (``skipped``, ``skipped_lines``)."""

    def __init__(self, path: Path, header: dict[str, Any], *, skip_bad_lines: bool = False,
                 allow_empty: bool = False) -> None:
        self.path, self.header = path, header
        self.block_size = int(header["block_size"])
        self.skip_bad_lines, self.allow_empty = skip_bad_lines, allow_empty
        self.log = SkipLog()
        self.skipped = 0
        self.skipped_lines: list[Any] = self.log.skipped_lines

    def __iter__(self) -> Iterator[TraceRequest]:
        self.log = SkipLog()
        self.skipped, self.skipped_lines = 0, self.log.skipped_lines
        name, last, emitted = os.fspath(self.path), 0.0, 0
        for lineno, raw, _ in trace_lines(self.path, scan=False):
            if lineno == 1:
                continue  # the header
            try:
                obj = decode_json_line(raw, name, lineno)
                try:
                    req = _check(obj, self.block_size)
                except ValueError as exc:
                    raise TraceFormatError(name, lineno, *exc.args) from None
                if req.arrival < last:
                    raise TraceFormatError(name, lineno, "arrival", f"{req.arrival!r} is before the previous "
                                                                    f"arrival {last!r}")
            except TraceFormatError as err:
                self.log.handle(err, self.skip_bad_lines)
                self.skipped = self.log.skipped
                continue
            last = req.arrival
            emitted += 1
            yield req
        if not emitted and not (self.skipped and self.allow_empty):
            raise TraceFormatError(name, 1, None, "empty hashed trace: no request lines" if not self.skipped else
                                   f"every line was skipped as bad ({self.skipped} lines)")


def trace_header(path: Path) -> dict[str, Any] | None:
    """The header object of a trace's line 1 (``{"apcsim_trace": {...}}``), or None (a trace
    without one, or a line 1 that is not JSON: the trace reader reports that)."""
    for lineno, raw, _ in trace_lines(path, scan=False):
        if lineno != 1 or not raw.lstrip().startswith(b'{"' + HEADER_KEY.encode()):
            return None
        try:
            obj = decode_json_line(raw, os.fspath(path), lineno)
        except TraceFormatError:
            return None
        head = obj.get(HEADER_KEY) if isinstance(obj, dict) else None
        return head if isinstance(head, dict) else None
    return None
