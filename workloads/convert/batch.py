"""One batch of text records converted to canonical request lines: the unit of work of
``apcsim convert``, run in the converting process or in worker processes (``--workers N``).

A batch is a list of ``(line, item)`` where the item is a record's raw JSONL bytes (decoded and
parsed here, so that workers share the JSON work too), an already parsed
:class:`~workloads.convert.conversation.Chat` (ShareGPT, whose list is cut in the main process),
or the problem that already rejects it. Each record's :class:`Outcome` carries its request lines
(``"arrival":0.0`` in the line, the arrival aside, for the writer's sort), whether it had a
timestamp, or its problem as ``(field, problem)``. Pieces of every chat of the batch are tokenized
in one call. The outcomes are a pure function of the batch: the same output with any number of
workers (tested). Imports sim.core / ``workloads`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workloads.convert.conversation import Chat, ChatPlan, build_requests, plan_chat
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


class BatchConverter:
    """Converts batches for one set of options (``opts``: a ``writer.ConvertOptions``)."""

    def __init__(self, opts: Any, tok: Tokenizer | None = None) -> None:
        self.opts = opts
        self.tok = tok if tok is not None else load_tokenizer(opts.tokenizer)
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
                                             self.opts.default_output_tokens)))
            except FieldProblem as exc:
                out.problem = (exc.field, exc.problem)
        ids = self.tok.encode_batch([p for _, plan in plans for p in plan.pieces])
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
        return outcomes


_WORKER: list[BatchConverter] = []  # the converter of a worker process (set by init_worker)


def init_worker(opts: Any) -> None:
    """Worker-process initializer: load the tokenizer once."""
    _WORKER[:] = [BatchConverter(opts)]


def run_batch(batch: list[Item]) -> list[Outcome]:
    """A worker's task."""
    return _WORKER[0](batch)
