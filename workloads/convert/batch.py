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
from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _string  # what json.dumps writes for a str
from typing import Any

from workloads.convert.conversation import Chat, ChatPlan, build_requests, plan_chat, turn_requests
from workloads.convert.formats import openai_chat, vllm_bench_chat
from workloads.convert.tokenizer import Tokenizer, load_tokenizer
from workloads.trace_format import request_to_json
from workloads.trace_json import FieldProblem, decode_line

Item = tuple[int, bytes | Chat | FieldProblem]

SHAREGPT_AS_JSONL = "a JSON list (ShareGPT?) where one JSON object per line was expected; use --format sharegpt"


@dataclass
class Outcome:
    """What one record became: request lines, or a problem."""

    lineno: int
    stamped: bool | None = None  # whether it had a timestamp (None: rejected before it was read)
    problem: tuple[str | None, str] | None = None
    lines: list[tuple[float, str, str]] = field(default_factory=list)  # (arrival, request id, JSON line)
    prompt_tokens: int = 0
    output_tokens: int = 0
    defaulted: int = 0


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
            obj = decode_line(item)
        except FieldProblem:
            if lineno == 1 and item.lstrip().startswith(b"["):
                raise FieldProblem(None, SHAREGPT_AS_JSONL) from None
            raise
        if lineno == 1 and isinstance(obj, list):
            raise FieldProblem(None, SHAREGPT_AS_JSONL)
        return self.parse(obj, lineno)

    def __call__(self, batch: list[Item]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        plans: list[tuple[Outcome, ChatPlan]] = []
        for lineno, item in batch:
            out = Outcome(lineno)
            outcomes.append(out)
            try:
                chat = self._chat(lineno, item)
                out.stamped = chat.arrival is not None
                plans.append((out, plan_chat(chat, self.tok.template, self.opts.turns,
                                             self.opts.default_output_tokens, not self.opts.reference)))
            except FieldProblem as exc:
                out.problem = (exc.field, exc.problem)
        pieces = [p for _, plan in plans for p in plan.pieces]
        if self.opts.reference:
            self._reference(plans, self.tok.encode_batch(pieces))
            return outcomes
        encoded = self.tok.encode_json(pieces)
        gap = self.opts.turn_gap_s
        at = 0
        for out, plan in plans:
            n = len(plan.pieces)
            mine = encoded[at:at + n]
            at += n
            try:
                turns = turn_requests(plan, [c for _, c in mine], gap)
            except FieldProblem as exc:
                out.problem = (exc.field, exc.problem)
                continue
            chat = plan.chat
            labels = "".join(f',"{key}":{_string(value)}' for key, value in (
                ("salt", chat.salt), ("lora", chat.lora), ("tenant", chat.tenant),
                ("session", chat.session if chat.session is not None else chat.id)) if value is not None)
            for t in turns:
                answer = "" if t.answer is None else f',"output_token_ids":[{mine[t.answer][0]}]'
                out.lines.append((t.arrival, t.id, f'{{"id":{_string(t.id)},"arrival":0.0,"tokens":['
                                  f'{",".join([mine[p][0] for p in t.prompt if mine[p][1]])}],"output_tokens":'
                                  f'{t.output_tokens}{answer}{labels}}}\n'))
                out.prompt_tokens += sum([mine[p][1] for p in t.prompt])
                out.output_tokens += t.output_tokens
            out.defaulted = plan.defaulted
        return outcomes

    def _reference(self, plans: list[tuple[Outcome, ChatPlan]], ids: list[list[int]]) -> None:
        """The requests as :class:`TraceRequest` objects serialized by ``request_to_json`` (the
        former path; the fast path's oracle)."""
        at = 0
        for out, plan in plans:
            n = len(plan.pieces)
            try:
                reqs = build_requests(plan, ids[at:at + n], self.opts.turn_gap_s)
            except FieldProblem as exc:
                out.problem = (exc.field, exc.problem)
                reqs = []
            at += n
            for req in reqs:
                arrival, req.arrival = req.arrival, 0.0
                out.lines.append((arrival, req.id, request_to_json(req) + "\n"))
                out.prompt_tokens += len(req.tokens)
                out.output_tokens += req.output_tokens
            out.defaulted = plan.defaulted if reqs else 0


_WORKER: list[BatchConverter] = []  # the converter of a worker process (set by init_worker)


def init_worker(opts: Any, gc_threshold: int | None = None) -> None:
    """Worker-process initializer: load the tokenizer once; ``gc_threshold``: the young
    generation's collection threshold (``writer.fewer_collections``)."""
    if gc_threshold is not None:
        gc.set_threshold(gc_threshold, *gc.get_threshold()[1:])
    _WORKER[:] = [BatchConverter(opts)]


def run_batch(batch: list[Item]) -> list[Outcome]:
    """A worker's task."""
    return _WORKER[0](batch)
