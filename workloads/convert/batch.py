"""One batch of text records converted to canonical request lines: the unit of work of
``apcsim convert``, run in the converting process or in worker processes (``--workers N``).

A batch is a list of ``(line, item)`` where the item is a record's raw JSONL bytes (decoded and
parsed here, so that workers share the JSON work too), an already parsed
:class:`~workloads.convert.conversation.Chat` (ShareGPT, whose list is cut in the main process),
or the problem that already rejects it. Each record's :class:`Outcome` carries its request lines
(``"arrival":0.0`` in the line, the arrival aside, for the writer's sort), whether it had a
timestamp, or its problem as ``(field, problem)``. Pieces of every chat of the batch are tokenized
in one call.

A request line is written as ``workloads.trace_format.request_to_json`` writes a ``TraceRequest``
(same keys, order and escapes), but assembled from the pieces' ids already serialized by the
tokenizer's cache (``Tokenizer.encode_json``): no Python int per token, which was a third of a
line's time once the history's messages came from the cache. ``ConvertOptions.reference`` keeps the
former path (``TraceRequest`` objects, ``request_to_json``): the oracle of
``tests/test_convert_speed.py`` (same bytes) and the benchmark's "before".

The outcomes are a pure function of the batch: the same output with any number of workers
(tested). Imports sim.core / ``workloads`` only.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _string  # what json.dumps writes for a str
from typing import Any

from workloads.convert.conversation import Chat, ChatPlan, build_requests, plan_chat, turn_requests
from workloads.convert.formats import openai_chat, vllm_bench_chat
from workloads.convert.json_record import decode_record
from workloads.convert.tokenizer import Tokenizer, load_tokenizer
from workloads.trace_format import request_to_json
from workloads.trace_json import FieldProblem

Item = tuple[int, bytes | Chat | FieldProblem]

SHAREGPT_AS_JSONL = "a JSON list (ShareGPT?) where one JSON object per line was expected; use --format sharegpt"


@dataclass
class Converted:
    """What one batch's records became. Per record (in input order): its line, whether it had a
    timestamp (None: rejected before it was read), its token totals, and the end of its requests
    in the request lists (cumulative: record ``i``'s are ``[ends[i - 1]:ends[i]]``); per request:
    its arrival, id and JSON line (``"arrival":0.0`` in the line, the arrival aside, for the
    writer's sort); the problems that reject records, by record index, as ``(field, problem)``."""

    linenos: list[int] = field(default_factory=list)
    stamped: list[bool | None] = field(default_factory=list)
    problems: dict[int, tuple[str | None, str]] = field(default_factory=dict)
    ends: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    defaulted: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def _start(self, records: int) -> None:
        self.prompt_tokens = [0] * records
        self.output_tokens = [0] * records
        self.defaulted = [0] * records
        self.ends = [0] * records  # the requests of each record, summed up by _close

    def _close(self) -> None:
        self.ends = list(itertools.accumulate(self.ends))


def tokenizer_for(opts: Any) -> Tokenizer:
    """The tokenizer of ``opts``: the word cache on unless ``opts.words`` is off or the former path
    (``opts.reference``) is asked for."""
    return load_tokenizer(opts.tokenizer, words=opts.words and not opts.reference)


class BatchConverter:
    """Converts batches for one set of options (``opts``: a ``writer.ConvertOptions``)."""

    def __init__(self, opts: Any, tok: Tokenizer | None = None) -> None:
        self.opts = opts
        self.tok = tok if tok is not None else tokenizer_for(opts)
        self.parse: Callable[[Any, int], Chat] = (
            (lambda obj, n: openai_chat(obj, n, opts.timestamps)) if opts.format == "openai"
            else (lambda obj, n: vllm_bench_chat(obj, n, opts.chat_template)))

    def _chat(self, lineno: int, item: bytes | Chat | FieldProblem) -> Chat:
        if isinstance(item, FieldProblem):
            raise item
        if isinstance(item, Chat):
            return item
        try:
            obj = decode_record(item)
        except FieldProblem:
            if lineno == 1 and item.lstrip().startswith(b"["):
                raise FieldProblem(None, SHAREGPT_AS_JSONL) from None
            raise
        if lineno == 1 and isinstance(obj, list):
            raise FieldProblem(None, SHAREGPT_AS_JSONL)
        return self.parse(obj, lineno)

    def __call__(self, batch: list[Item]) -> Converted:
        res = Converted()
        res._start(len(batch))
        chats: list[tuple[int, Chat]] = []
        problems, stamped = res.problems, res.stamped
        for i, (lineno, item) in enumerate(batch):
            res.linenos.append(lineno)
            try:
                chat = self._chat(lineno, item)
            except FieldProblem as exc:
                stamped.append(None)
                problems[i] = (exc.field, exc.problem)
                continue
            stamped.append(chat.arrival is not None)
            chats.append((i, chat))
        template, opts = self.tok.template, self.opts
        bodies: list[list[str] | None] = [None] * len(chats)
        if template is not None and not opts.reference and opts.turns != "first":
            bodies = template.prefill([(chat.messages if chat.template else [], chat.tools) for _, chat in chats])
        plans: list[tuple[int, ChatPlan]] = []
        for (i, chat), given in zip(chats, bodies, strict=True):
            try:
                plans.append((i, plan_chat(chat, template, opts.turns, opts.default_output_tokens, not opts.reference,
                                           given)))
            except FieldProblem as exc:
                problems[i] = (exc.field, exc.problem)
        pieces = [p for _, plan in plans for p in plan.pieces]
        if self.opts.reference:
            self._reference(res, plans, self.tok.encode_batch(pieces))
        else:
            self._requests(res, plans, self.tok.encode_json(pieces))
        res._close()
        return res

    def _requests(self, res: Converted, plans: list[tuple[int, ChatPlan]], encoded: list[tuple[str, int]]) -> None:
        """Each plan's request lines, from its pieces' serialized ids (``encoded``, the plans'
        pieces in order): a turn's ``tokens`` are the comma-join of its prompt pieces' id texts,
        grown turn by turn (a prompt is every piece before its answer)."""
        gap = self.opts.turn_gap_s
        add_arrival, add_id, add_line = res.arrivals.append, res.ids.append, res.lines.append
        at = 0
        for i, plan in plans:
            n = len(plan.pieces)
            mine = encoded[at:at + n]
            at += n
            try:
                turns = turn_requests(plan, [c for _, c in mine], gap)
            except FieldProblem as exc:
                res.problems[i] = (exc.field, exc.problem)
                continue
            chat = plan.chat
            labels = ""
            if chat.salt is not None:
                labels += f',"salt":{_string(chat.salt)}'
            if chat.lora is not None:
                labels += f',"lora":{_string(chat.lora)}'
            if chat.tenant is not None:
                labels += f',"tenant":{_string(chat.tenant)}'
            labels += f',"session":{_string(chat.session if chat.session is not None else chat.id)}}}\n'
            prompt = ""
            covered = 0
            outputs = 0
            for t in turns:
                if t.prompt_end > covered:
                    more = ",".join([text for text, count in mine[covered:t.prompt_end] if count])
                    prompt = f"{prompt},{more}" if prompt and more else prompt or more
                    covered = t.prompt_end
                answer = "" if t.answer is None else f',"output_token_ids":[{mine[t.answer][0]}]'
                add_arrival(t.arrival)
                add_id(t.id)
                add_line(f'{{"id":{_string(t.id)},"arrival":0.0,"tokens":[{prompt}],"output_tokens":'
                         f'{t.output_tokens}{answer}{labels}')
                outputs += t.output_tokens
            res.prompt_tokens[i] = sum([t.prompt_tokens for t in turns])
            res.output_tokens[i] = outputs
            res.defaulted[i] = plan.defaulted
            res.ends[i] = len(turns)

    def _reference(self, res: Converted, plans: list[tuple[int, ChatPlan]], ids: list[list[int]]) -> None:
        """The requests as :class:`TraceRequest` objects serialized by ``request_to_json`` (the
        former path; the fast path's oracle)."""
        at = 0
        for i, plan in plans:
            n = len(plan.pieces)
            try:
                reqs = build_requests(plan, ids[at:at + n], self.opts.turn_gap_s)
            except FieldProblem as exc:
                res.problems[i] = (exc.field, exc.problem)
                reqs = []
            at += n
            for req in reqs:
                res.arrivals.append(req.arrival)
                req.arrival = 0.0
                res.ids.append(req.id)
                res.lines.append(request_to_json(req) + "\n")
                res.prompt_tokens[i] += len(req.tokens)
                res.output_tokens[i] += req.output_tokens
            res.defaulted[i] = plan.defaulted if reqs else 0
            res.ends[i] = len(reqs)


_WORKER: list[BatchConverter] = []  # the converter of a worker process (set by init_worker)


def init_worker(opts: Any, gc_threshold: int | None = None) -> None:
    """Worker-process initializer: load the tokenizer once; ``gc_threshold``: the young
    generation's collection threshold (``writer.fewer_collections``)."""
    if gc_threshold is not None:
        gc.set_threshold(gc_threshold, *gc.get_threshold()[1:])
    _WORKER[:] = [BatchConverter(opts)]


def run_batch(batch: list[Item]) -> Converted:
    """A worker's task."""
    return _WORKER[0](batch)
