"""``apcsim convert``: a text log, benchmark dataset or hash-id trace to apcsim's canonical token
trace, streamed (mirrors what vLLM's OpenAI server does to each request: template, tokenize).

Pipeline: a format reader (``workloads.convert.formats``; ``mooncake`` and ``bailian`` through
their loaders) yields records; chats are rendered and cut (``conversation.plan_chat``), their
pieces tokenized in batches of ``batch`` texts (one call into the Rust tokenizer), and the requests
written to a temporary file beside the output with their arrivals kept aside. A second pass writes
the output: a header line ``{"apcsim_trace": {...}}`` (source, format, tokenizer and its
fingerprint, ``approximate``, ``timestamps``, the counts, ``rejected_lines``), then the requests
sorted by arrival (stable: a record's turns and the input's order among equal times are kept),
arrivals relative to the first. Memory: one batch of records, plus 24 bytes per request for the
sort.

Timestamps: a record's is its last turn's arrival; earlier turns of the record arrive
``turn_gap_s`` apart before it. With none (``--timestamps none``, or no record has one) every
arrival is 0 and the header says ``timestamps: none``: the replay's arrival process places the
requests and its summary says so. A record without a timestamp among records with one is bad.

Bad records raise ``TraceFormatError`` (``file:line: field 'x': problem``), or with
``skip_bad_lines`` are dropped and counted (header, :class:`ConvertSummary`). Imports sim.core /
``workloads`` and tqdm (neither simpy nor torch).
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from workloads.convert.conversation import ChatPlan, TurnMode, build_requests, plan_chat
from workloads.convert.formats import Record, openai_chat, read_jsonl, read_sharegpt, vllm_bench_chat
from workloads.convert.timestamps import TimestampMode
from workloads.convert.tokenizer import Tokenizer, load_tokenizer
from workloads.errors import SkipLog
from workloads.trace_format import MAX_SKIPPED_LINES_KEPT, TraceFormatError, TraceRequest, request_to_json
from workloads.trace_json import FieldProblem

FORMATS: tuple[str, ...] = ("openai", "sharegpt", "vllm-bench", "mooncake", "bailian")
TEXT_FORMATS = frozenset({"openai", "sharegpt", "vllm-bench"})
HEADER_KEY = "apcsim_trace"
"""The key of a trace's header object (line 1), read by ``workloads.trace_header``."""
PROGRESS_MIN_BYTES = 32 << 20
"""Inputs smaller than this convert without a progress bar."""


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert (the CLI's flags)."""

    format: Literal["openai", "sharegpt", "vllm-bench", "mooncake", "bailian"]
    tokenizer: str | None = None
    timestamps: TimestampMode = "auto"
    turns: TurnMode = "all"
    turn_gap_s: float = 10.0
    default_output_tokens: int = 256
    chat_template: bool = True
    skip_bad_lines: bool = False
    progress: bool | None = None
    batch: int = 4096


@dataclass
class ConvertSummary:
    """What a conversion did (also the header's content)."""

    source: str
    format: str
    tokenizer: str
    tokenizer_fingerprint: str | None
    approximate: bool
    timestamps: str  # "epoch" or "none"
    records: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    default_output_requests: int = 0
    rejected_lines: int = 0
    rejected_line_numbers: list[int] = field(default_factory=list)
    first_rejection: str | None = None
    reordered: bool = False
    template_uses_clock: bool = False
    span_s: float = 0.0

    def header(self) -> dict[str, Any]:
        return {HEADER_KEY: {"version": 1, "kind": "tokens", **asdict(self)}}


class _Spool:
    """The first pass's requests: lines in a temporary file, arrivals and offsets aside."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh = open(path, "w", encoding="utf-8")
        self.arrivals = array("d")
        self.offsets = array("q")
        self.ids: set[str] = set()
        self.at = 0

    def add(self, req: TraceRequest, summary: ConvertSummary) -> None:
        if req.id in self.ids:  # a repeated record id: the request keeps its place, named apart
            req.id = f"{req.id}#{len(self.arrivals)}"
        self.ids.add(req.id)
        self.arrivals.append(req.arrival)
        req.arrival = 0.0
        line = request_to_json(req) + "\n"
        self.offsets.append(self.at)
        self.at += len(line.encode("utf-8"))
        self.fh.write(line)
        summary.requests += 1
        summary.prompt_tokens += len(req.tokens)
        summary.output_tokens += req.output_tokens


def _progress(path: Path, enabled: bool | None) -> tuple[Callable[[int], None], Callable[[], None]]:
    size = path.stat().st_size
    if enabled is False or (enabled is None and size < PROGRESS_MIN_BYTES) or path.suffix in (".gz", ".xz", ".zst"):
        return (lambda n: None), (lambda: None)
    from tqdm import tqdm

    bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"convert {path.name}", disable=None)
    return bar.update, bar.close


def _records(path: Path, opts: ConvertOptions, tick: Callable[[int], None]) -> Iterator[Record]:
    if opts.format == "sharegpt":
        return read_sharegpt(path, tick)
    if opts.format == "openai":
        return read_jsonl(path, lambda obj, n: openai_chat(obj, n, opts.timestamps), tick)
    return read_jsonl(path, lambda obj, n: vllm_bench_chat(obj, n, opts.chat_template), tick)


def _reject(summary: ConvertSummary, opts: ConvertOptions, name: str, lineno: int, exc: FieldProblem) -> None:
    err = TraceFormatError(name, lineno, exc.field, exc.problem)
    if not opts.skip_bad_lines:
        raise err
    summary.rejected_lines += 1
    if len(summary.rejected_line_numbers) < MAX_SKIPPED_LINES_KEPT:
        summary.rejected_line_numbers.append(lineno)
    if summary.first_rejection is None:
        summary.first_rejection = str(err)


def _text_requests(path: Path, opts: ConvertOptions, tok: Tokenizer, summary: ConvertSummary,
                   tick: Callable[[int], None]) -> Iterator[TraceRequest]:
    name = os.fspath(path)
    pending: list[tuple[int, ChatPlan]] = []
    texts = 0
    stamped: bool | None = None  # whether records carry timestamps (the first record decides)

    def flush() -> Iterator[TraceRequest]:
        pieces = [p for _, plan in pending for p in plan.pieces]
        ids = tok.encode_batch(pieces)
        at = 0
        for lineno, plan in pending:
            n = len(plan.pieces)
            try:
                reqs = build_requests(plan, ids[at:at + n], opts.turn_gap_s)
            except FieldProblem as exc:
                _reject(summary, opts, name, lineno, exc)
                reqs = []
            at += n
            summary.records += bool(reqs)
            summary.default_output_requests += plan.defaulted if reqs else 0
            yield from reqs
        pending.clear()

    for lineno, rec in _records(path, opts, tick):
        try:
            if isinstance(rec, FieldProblem):
                raise rec
            has = rec.arrival is not None
            if stamped is None:
                stamped = has
            elif has != stamped:
                raise FieldProblem("timestamp", "missing, while earlier records have one (--timestamps none "
                                                "ignores them all)" if stamped else
                                   "given, while earlier records have none (--timestamps none ignores them all)")
            plan = plan_chat(rec, tok.template, opts.turns, opts.default_output_tokens)
        except FieldProblem as exc:
            _reject(summary, opts, name, lineno, exc)
            continue
        pending.append((lineno, plan))
        texts += len(plan.pieces)
        if texts >= opts.batch:
            yield from flush()
            texts = 0
    yield from flush()
    summary.timestamps = "epoch" if stamped else "none"


def _hash_requests(path: Path, opts: ConvertOptions, summary: ConvertSummary) -> Iterable[TraceRequest]:
    log = SkipLog()
    if opts.format == "mooncake":
        from workloads.mooncake import load_mooncake

        reqs: Iterable[TraceRequest] = load_mooncake(path, skip_bad_lines=opts.skip_bad_lines, skip_log=log)
    else:
        from workloads.bailian import load_bailian

        reqs = load_bailian(path, skip_bad_lines=opts.skip_bad_lines, skip_log=log, type_as_tenant=True)
    for req in reqs:
        summary.records += 1
        yield req
    summary.rejected_lines = log.skipped
    summary.rejected_line_numbers = [int(x) for x in log.skipped_lines]
    summary.first_rejection = log.first_error


def convert(src: str | os.PathLike[str], out: str | os.PathLike[str], opts: ConvertOptions) -> ConvertSummary:
    """Convert ``src`` into the canonical trace ``out`` (replaced only when the conversion
    succeeds); see the module docstring. Raises ``TraceFormatError`` / ``TokenizerError``."""
    path, target = Path(src), Path(out)
    if not path.is_file():
        raise FileNotFoundError(src)
    if opts.format in TEXT_FORMATS:
        tok = load_tokenizer(opts.tokenizer)
        summary = ConvertSummary(os.fspath(path.name), opts.format, tok.name, tok.fingerprint, tok.approximate,
                                 "epoch", template_uses_clock=bool(tok.template and tok.template.uses_clock))
    else:
        tok = None
        summary = ConvertSummary(os.fspath(path.name), opts.format, "hash ids (no text)", None, False, "epoch")
    spool = _Spool(target.with_name(target.name + ".part"))
    tick, close = _progress(path, opts.progress)
    try:
        reqs = (_text_requests(path, opts, tok, summary, tick) if tok is not None
                else _hash_requests(path, opts, summary))
        for req in reqs:
            spool.add(req, summary)
        spool.fh.close()
        if summary.requests == 0:
            raise TraceFormatError(os.fspath(path), 1, None, "no request converted" + (
                f" (every record rejected; the first: {summary.first_rejection})" if summary.rejected_lines else ""))
        _finish(spool, target, summary)
    finally:
        close()
        spool.fh.close()
        spool.path.unlink(missing_ok=True)
    return summary


def _finish(spool: _Spool, target: Path, summary: ConvertSummary) -> None:
    """Write the header and the spooled requests sorted by arrival, relative to the first."""
    arrivals = np.frombuffer(spool.arrivals, dtype=np.float64)
    if summary.timestamps == "none":
        arrivals = np.zeros_like(arrivals)
    order = np.argsort(arrivals, kind="stable")
    summary.reordered = bool((order != np.arange(order.size)).any())
    origin = float(arrivals[order[0]])
    summary.span_s = float(arrivals[order[-1]]) - origin
    tmp = target.with_name(target.name + ".tmp")
    with open(spool.path, "rb") as src, open(tmp, "w", encoding="utf-8") as dst:
        dst.write(json.dumps(summary.header(), separators=(",", ":")) + "\n")
        lines: Iterator[bytes] = iter(src) if not summary.reordered else _at_offsets(src, spool.offsets, order)
        for i, raw in zip(order.tolist(), lines, strict=True):
            rel = float(arrivals[i]) - origin
            dst.write(raw.decode("utf-8").replace('"arrival":0.0', f'"arrival":{rel!r}', 1))
    os.replace(tmp, target)


def _at_offsets(fh: Any, offsets: array[int], order: np.ndarray) -> Iterator[bytes]:
    for i in order.tolist():
        fh.seek(offsets[i])
        yield fh.readline()
