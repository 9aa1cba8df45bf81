"""``apcsim convert``: a text log, benchmark dataset or hash-id trace to apcsim's canonical token
trace, streamed (mirrors what vLLM's OpenAI server does to each request: template, tokenize).

Pipeline: the input's records (raw JSONL lines, or ShareGPT's parsed chats; ``mooncake`` and
``bailian`` through their loaders) go in batches of ``batch`` records to
``workloads.convert.batch`` -- here, or in ``workers`` processes, results in input order -- which
parses, renders and cuts each chat (``conversation.plan_chat``), tokenizes the batch's pieces in
one call and serializes the requests; they are written to a temporary file beside the output with
their arrivals kept aside. A second pass writes
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

import contextlib
import gc
import itertools
import json
import mmap
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from workloads.convert.batch import BatchConverter, Converted, Item, init_worker, run_batch, tokenizer_for
from workloads.convert.conversation import TurnMode
from workloads.convert.formats import read_sharegpt
from workloads.convert.timestamps import TimestampMode
from workloads.convert.tokenizer import Tokenizer
from workloads.errors import SkipLog
from workloads.trace_format import (
    HEADER_KEY,
    MAX_SKIPPED_LINES_KEPT,
    TraceFormatError,
    TraceRequest,
    request_to_json,
)
from workloads.trace_lines import trace_lines

FORMATS: tuple[str, ...] = ("openai", "sharegpt", "vllm-bench", "mooncake", "bailian")
TEXT_FORMATS = frozenset({"openai", "sharegpt", "vllm-bench"})
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
    batch: int = 1024  # records per batch (one tokenizer call; one worker task)
    workers: int | None = 1  # processes converting batches (1: this one; None: auto_workers)
    reference: bool = False  # the former serialization (TraceRequest + request_to_json), no word cache: the oracle
    words: bool = True  # the tokenizer's word cache where it is exact (workloads.convert.word_cache)


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
        self.fh = open(path, "wb")  # bytes: each line encoded once (its length is the next offset)
        self.arrivals = array("d")
        self.offsets = array("q")
        self.ids: set[str] = set()
        self.at = 0

    def add(self, req: TraceRequest, summary: ConvertSummary) -> None:
        """A request built here (hash-id formats)."""
        arrival, req.arrival = req.arrival, 0.0
        self.add_line(arrival, req.id, request_to_json(req) + "\n")
        summary.requests += 1
        summary.prompt_tokens += len(req.tokens)
        summary.output_tokens += req.output_tokens

    def add_line(self, arrival: float, rid: str, line: str) -> None:
        """A request's JSON line (with ``"arrival":0.0``; the arrival is kept aside)."""
        self.add_lines([arrival], [rid], [line])

    def add_lines(self, arrivals: list[float], ids: list[str], lines: list[str]) -> None:
        """Requests' arrivals, ids and JSON lines, in order (one write). A repeated record id: the
        request keeps its place, named apart (``id#n``, n its place in the output)."""
        seen = self.ids
        if not seen.isdisjoint(ids) or len(set(ids)) != len(ids):
            lines = list(lines)
            for k, rid in enumerate(ids):
                if rid in seen:
                    new = f"{rid}#{len(self.arrivals) + k}"
                    lines[k] = lines[k].replace(f'{{"id":{json.dumps(rid)}', f'{{"id":{json.dumps(new)}', 1)
                    rid = new
                seen.add(rid)
        else:
            seen.update(ids)
        data = "".join(lines).encode("utf-8")
        starts = list(itertools.accumulate(map(len, lines), initial=self.at))
        if starts[-1] - self.at != len(data):  # not ASCII: lengths in bytes
            starts = list(itertools.accumulate([len(line.encode("utf-8")) for line in lines], initial=self.at))
        self.at = starts.pop()
        self.offsets.extend(starts)
        self.arrivals.extend(arrivals)
        self.fh.write(data)


def _progress(path: Path, enabled: bool | None) -> tuple[Callable[[int], None], Callable[[], None]]:
    size = path.stat().st_size
    if enabled is False or (enabled is None and size < PROGRESS_MIN_BYTES) or path.suffix in (".gz", ".xz", ".zst"):
        return (lambda n: None), (lambda: None)
    from tqdm import tqdm

    bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"convert {path.name}", disable=None)
    return bar.update, bar.close


def _items(path: Path, opts: ConvertOptions, tick: Callable[[int], None]) -> Iterator[Item]:
    """The records to convert: raw JSONL lines (parsed in the batch), or ShareGPT's parsed chats."""
    if opts.format == "sharegpt":
        yield from read_sharegpt(path, tick)
        return
    for lineno, raw, _ in trace_lines(path, scan=False):
        tick(len(raw) + 1)
        yield lineno, raw


def auto_workers(path: Path) -> int:
    """``--workers auto``: this process alone below :data:`PROGRESS_MIN_BYTES` of input (starting
    workers costs about a second), else one worker per core but one, at most 8."""
    if path.stat().st_size < PROGRESS_MIN_BYTES:
        return 1
    return max(1, min(8, (os.cpu_count() or 1) - 1))


def _batches(items: Iterator[Item], size: int) -> Iterator[list[Item]]:
    while batch := list(itertools.islice(items, size)):
        yield batch


def _reject(summary: ConvertSummary, opts: ConvertOptions, name: str, lineno: int,
            problem: tuple[str | None, str]) -> None:
    err = TraceFormatError(name, lineno, *problem)
    if not opts.skip_bad_lines:
        raise err
    summary.rejected_lines += 1
    if len(summary.rejected_line_numbers) < MAX_SKIPPED_LINES_KEPT:
        summary.rejected_line_numbers.append(lineno)
    if summary.first_rejection is None:
        summary.first_rejection = str(err)


def _outcomes(path: Path, opts: ConvertOptions, tok: Tokenizer,
              tick: Callable[[int], None]) -> Iterator[Converted]:
    """Every batch's outcome, in input order: converted here or by ``opts.workers`` processes
    (``spawn``: a fork after the tokenizer's threads ran could deadlock them)."""
    batches = _batches(_items(path, opts, tick), opts.batch)
    workers = opts.workers if opts.workers is not None else auto_workers(path)
    if workers <= 1:
        yield from map(BatchConverter(opts, tok), batches)
        return
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers, init_worker, (opts, GC_YOUNG_THRESHOLD)) as pool:
        yield from pool.imap(run_batch, batches)  # in order


def _text_requests(path: Path, opts: ConvertOptions, tok: Tokenizer, summary: ConvertSummary,
                   spool: _Spool, tick: Callable[[int], None]) -> None:
    name = os.fspath(path)
    stamped: bool | None = None  # whether records carry timestamps (the first good record decides)
    for res in _outcomes(path, opts, tok, tick):
        if not res.problems and res.stamped:
            if stamped is None:
                stamped = res.stamped[0]
            if res.stamped.count(stamped) == len(res.stamped):  # every record good: the batch at once
                spool.add_lines(res.arrivals, res.ids, res.lines)
                summary.records += len(res.linenos)
                summary.requests += len(res.lines)
                summary.prompt_tokens += sum(res.prompt_tokens)
                summary.output_tokens += sum(res.output_tokens)
                summary.default_output_requests += sum(res.defaulted)
                continue
        start = 0
        for i, lineno in enumerate(res.linenos):
            end = res.ends[i]
            problem = res.problems.get(i)
            if res.stamped[i] is not None and problem is None:
                if stamped is None:
                    stamped = res.stamped[i]
                elif res.stamped[i] != stamped:
                    problem = ("timestamp", "missing, while earlier records have one (--timestamps none ignores "
                                            "them all)" if stamped else "given, while earlier records have none "
                                                                        "(--timestamps none ignores them all)")
            if problem is not None:
                _reject(summary, opts, name, lineno, problem)
            else:
                spool.add_lines(res.arrivals[start:end], res.ids[start:end], res.lines[start:end])
                summary.records += 1
                summary.requests += end - start
                summary.prompt_tokens += res.prompt_tokens[i]
                summary.output_tokens += res.output_tokens[i]
                summary.default_output_requests += res.defaulted[i]
            start = end
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
        tok = tokenizer_for(opts)
        summary = ConvertSummary(os.fspath(path.name), opts.format, tok.name, tok.fingerprint, tok.approximate,
                                 "epoch", template_uses_clock=bool(tok.template and tok.template.uses_clock))
    else:
        tok = None
        summary = ConvertSummary(os.fspath(path.name), opts.format, "hash ids (no text)", None, False, "epoch")
    spool = _Spool(target.with_name(target.name + ".part"))
    tick, close = _progress(path, opts.progress)
    try:
        if tok is not None:
            with fewer_collections():
                _text_requests(path, opts, tok, summary, spool, tick)
        else:
            for req in _hash_requests(path, opts, summary):
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


GC_YOUNG_THRESHOLD = 100_000
"""Allocations between two young-generation collections while text records convert (Python's
default is 700): a batch's parsed records live through hundreds of collections that find no garbage
(about a tenth of a line's time, measured); cycles are still collected, a few MB later."""


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Python's cyclic collector run every :data:`GC_YOUNG_THRESHOLD` allocations (restored after)."""
    before = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


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
    offsets = np.frombuffer(spool.offsets, dtype=np.int64)
    starts = offsets[order]
    ends = np.append(offsets[1:], spool.at)[order]
    rels = (arrivals[order] - origin).tolist()
    with open(spool.path, "rb") as src, open(tmp, "wb") as dst, \
            mmap.mmap(src.fileno(), 0, access=mmap.ACCESS_READ) as lines:
        dst.write(json.dumps(summary.header(), separators=(",", ":")).encode("utf-8") + b"\n")
        for k in range(0, len(rels), 4096):  # in chunks: one writelines each
            dst.writelines([lines[a:b].replace(b'"arrival":0.0', f'"arrival":{rel!r}'.encode(), 1) for a, b, rel in zip(
                starts[k:k + 4096].tolist(), ends[k:k + 4096].tolist(), rels[k:k + 4096], strict=True)])
    os.replace(tmp, target)
