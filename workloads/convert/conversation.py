"""A chat conversation as one request per turn, each prompt the whole history (mirrors what vLLM's
prefix cache holds after a turn: the prompt's blocks, then the blocks its answer filled).

A :class:`Chat` is a list of messages (roles system/user/assistant/tool, content already a string)
plus, optionally, the answer to its last message (a text, or only a token count). Its turns are its
assistant messages, and the final answer when the messages end with a non-assistant message. Turn
``k``'s prompt is the chat template rendered over the messages before its answer, with the
generation prompt; its output is the answer as the template renders it (the text, and whatever the
template writes after it, e.g. an end-of-turn token -- what the model generated).

**Prefix equality, by construction.** Tokenizing each turn's rendered prompt as one string would
let BPE merges cross the boundary between an answer and the text after it, so turn k+1 could
differ from turn k's prompt plus answer at the seam. vLLM caches the ids the model *generated*,
and the next request's prefix is those ids when the client resends the history; so the rendered
conversation is cut into pieces at every boundary (prompt k | answer k | the text up to prompt k+1
| ...), each piece is tokenized alone, and turn k+1's prompt is the concatenation of the pieces
before it. Turn k+1's prompt therefore starts with turn k's prompt plus its answer, token for
token (tests/test_convert_properties.py). The template must be prefix-stable (rendering more
messages only appends text); one that rewrites earlier turns (e.g. drops earlier reasoning) is
refused on that line with the turn named.

Two passes keep tokenization batched: :func:`plan_chat` renders and cuts (pure text), the writer
encodes the pieces of many chats at once, then :func:`build_requests` assembles the requests.
Imports sim.core / ``workloads`` only (neither simpy nor torch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np

from workloads.convert.chat_template import ChatTemplate, TemplateRenderError
from workloads.convert.template_parts import PartsRenderer
from workloads.trace_format import MAX_OUTPUT_TOKENS, TraceRequest
from workloads.trace_json import FieldProblem

TurnMode = Literal["all", "last", "first"]


@dataclass
class Chat:
    """One input record: ``messages`` (dicts with ``role`` and string ``content``, other keys kept
    for the template), ``tools``, the final ``answer_text`` / ``answer_tokens`` (None: unknown),
    ``arrival`` (seconds of the last turn; None: no timestamp) and the trace's own labels."""

    id: str
    messages: list[dict[str, Any]]
    tools: list[Any] | None = None
    answer_text: str | None = None
    answer_tokens: int | None = None
    arrival: float | None = None
    session: str | None = None
    tenant: str | None = None
    salt: str | None = None
    lora: str | None = None
    template: bool = True  # False: the prompt is the user text itself (vllm bench --custom-skip-chat-template)


@dataclass
class _Turn:
    prompt_pieces: int  # the prompt is pieces[:prompt_pieces]
    answer_piece: int | None  # the index of the answer's piece, or None (a count only)
    answer_tokens: int | None  # the output length when known without text


@dataclass
class ChatPlan:
    """A chat cut into text pieces (:func:`plan_chat`), to be tokenized in one batch."""

    chat: Chat
    pieces: list[str]
    turns: list[_Turn] = field(default_factory=list)
    defaulted: int = 0  # turns whose output length is the default


def _render(render: Callable[..., str], *args: Any) -> str:
    try:
        return render(*args)
    except TemplateRenderError as exc:
        raise FieldProblem("messages", exc.describe()) from None


def _turn_points(chat: Chat) -> list[tuple[int, bool]]:
    """``(messages before the answer, answer is a rendered assistant message)`` per turn."""
    points = [(i, True) for i, m in enumerate(chat.messages) if m["role"] == "assistant" and i > 0]
    if chat.messages[-1]["role"] != "assistant":
        points.append((len(chat.messages), False))
    elif chat.answer_text is not None or chat.answer_tokens is not None:
        raise FieldProblem("response", "the messages end with an assistant message; a response after it has "
                                       "no prompt to answer")
    if not points:
        raise FieldProblem("messages", "no turn: expected a user (or system/tool) message before an answer")
    return points


def plan_chat(chat: Chat, template: ChatTemplate | None, turns: TurnMode, default_output: int,
              parts: bool = True, bodies: list[str] | None = None) -> ChatPlan:
    """Render ``chat`` and cut it into pieces (see the module docstring); raises ``FieldProblem``.
    ``parts``: put the prompts together from the template's parts where it splits exactly
    (``ChatTemplate.parts``; same text), else render each prompt whole (the former path);
    ``bodies``: its messages' texts already rendered (``ChatTemplate.prefill``)."""
    points = _turn_points(chat)
    if turns == "last":
        points = points[-1:]
    elif turns == "first":
        points = points[:1]
    plan = ChatPlan(chat, [])
    if template is None or not chat.template:
        if len(chat.messages) != 1:
            raise FieldProblem("messages", "a chat of several messages needs the model's chat template "
                                           "(tokenizer_config.json with chat_template)")
        # no template: the prompt is the message text as is (vllm bench with the chat template skipped)
        plan.pieces.append(chat.messages[0]["content"])
        _final(plan, 1)
    else:
        need = points[-1][0] + points[-1][1]  # the most messages a render below reads
        split = template.parts(chat.messages[:need], chat.tools, bodies and bodies[:need]) if parts else None
        if split is not None:
            _cut_parts(plan, split, points)
        else:
            _cut(plan, lambda n, gen: template.render(chat.messages[:n], add_generation_prompt=gen,
                                                      tools=chat.tools), points)
    if plan.turns[-1].answer_piece is None and plan.turns[-1].answer_tokens is None:
        plan.turns[-1].answer_tokens = default_output
        plan.defaulted += 1
    return plan


def _not_prefix_stable(n: int) -> FieldProblem:
    return FieldProblem("messages", f"the chat template renders the history before message {n} differently "
                                    "once later messages follow (not prefix-stable); try --turns last")


def _answer_not_after_prompt(n: int) -> FieldProblem:
    return FieldProblem("messages", f"the chat template does not render the answer at message {n} right "
                                    "after its generation prompt; try --turns last")


def _cut(plan: ChatPlan, render: Callable[[int, bool], str], points: list[tuple[int, bool]]) -> None:
    """Render the turns at ``points`` (``render(n, gen)``: the template over the first ``n``
    messages) and append their pieces and turns to ``plan``."""
    done = ""  # the text the pieces so far cover
    for n, rendered_answer in points:
        prompt = _render(render, n, True)
        if not prompt.startswith(done):
            raise _not_prefix_stable(n)
        plan.pieces.append(prompt[len(done):])
        done = prompt
        if not rendered_answer:
            _final(plan, len(plan.pieces))
            break
        full = _render(render, n + 1, False)
        if not full.startswith(prompt) or len(full) == len(prompt):
            raise _answer_not_after_prompt(n)
        plan.pieces.append(full[len(prompt):])
        plan.turns.append(_Turn(len(plan.pieces) - 1, len(plan.pieces) - 1, None))
        done = full


def _cut_parts(plan: ChatPlan, split: PartsRenderer, points: list[tuple[int, bool]]) -> None:
    """:func:`_cut` on a split template's texts: every render there is ``head + bodies[:n] +
    tail(gen)``, so its checks and pieces are taken from the texts after the common prefix (same
    pieces, same problems, raised at the same turn)."""
    after: str | None = None  # the tail ending the covered text (None: nothing covered yet)
    m = 0  # the messages whose bodies the pieces so far cover
    for n, rendered_answer in points:
        prompt = _render(split.segment, m, n, True)
        if after is None:
            assert split.head is not None
            prompt = split.head + prompt
        elif not prompt.startswith(after):
            raise _not_prefix_stable(n)
        plan.pieces.append(prompt[len(after or ""):])
        if not rendered_answer:
            _final(plan, len(plan.pieces))
            break
        full = _render(split.segment, n, n + 1, False)
        gen = split.tail(True)
        if not full.startswith(gen) or len(full) == len(gen):
            raise _answer_not_after_prompt(n)
        plan.pieces.append(full[len(gen):])
        plan.turns.append(_Turn(len(plan.pieces) - 1, len(plan.pieces) - 1, None))
        after, m = split.tail(False), n + 1


def _final(plan: ChatPlan, prompt_pieces: int) -> None:
    """The last turn, answered by the record's response (a text piece, or a count)."""
    chat = plan.chat
    if chat.answer_text is not None:
        plan.pieces.append(chat.answer_text)
        plan.turns.append(_Turn(prompt_pieces, len(plan.pieces) - 1, chat.answer_tokens))
    else:
        plan.turns.append(_Turn(prompt_pieces, None, chat.answer_tokens))


class TurnRequest(NamedTuple):
    """One turn's request in terms of the plan's pieces: its prompt is the concatenation of
    ``plan.pieces[:prompt_end]`` (``prompt_tokens`` tokens), its ``output_token_ids`` piece
    ``answer`` (None: not kept)."""

    id: str
    arrival: float
    prompt_end: int
    prompt_tokens: int
    output_tokens: int
    answer: int | None


def turn_requests(plan: ChatPlan, counts: Sequence[int], gap_s: float) -> list[TurnRequest]:
    """The requests of a planned chat from its pieces' token counts (``counts[i]`` of
    ``plan.pieces[i]``). Turn k arrives ``(T - k) * gap_s`` before the chat's arrival (the record's
    timestamp is its last turn's); raises ``FieldProblem`` for a turn with an empty prompt. A
    turn's prompt is every piece before its answer: the earlier turns' prompts and answers, and the
    text between (the pieces are cut in that order, ``plan_chat``)."""
    chat = plan.chat
    out: list[TurnRequest] = []
    tokens = 0
    covered = 0  # the prompt so far is pieces[:covered]
    last = len(plan.turns) - 1
    for k, turn in enumerate(plan.turns):
        tokens += sum(counts[covered:turn.prompt_pieces])
        covered = turn.prompt_pieces
        if not tokens:
            raise FieldProblem("messages", f"turn {k + 1}: the prompt has no tokens")
        answer = counts[turn.answer_piece] if turn.answer_piece is not None else None
        if turn.answer_tokens is not None:
            n_out = turn.answer_tokens
        else:
            n_out = answer if answer else 1  # an empty answer still cost one step (the stop token)
        if not 1 <= n_out < MAX_OUTPUT_TOKENS:
            raise FieldProblem("usage.completion_tokens", f"turn {k + 1}: expected an output length in "
                                                          f"[1, 2**24), got {n_out}")
        out.append(TurnRequest(
            f"{chat.id}-t{k + 1}" if last else chat.id,
            0.0 if chat.arrival is None else chat.arrival - (last - k) * gap_s,
            covered, tokens, n_out, turn.answer_piece if answer and answer >= n_out else None))
        if answer is not None and turn.answer_piece == covered:
            tokens += answer
            covered += 1
    return out


def build_requests(plan: ChatPlan, ids: list[list[int]], gap_s: float) -> list[TraceRequest]:
    """The requests of a planned chat from its pieces' token ids (``ids[i]`` of ``plan.pieces[i]``;
    :func:`turn_requests`)."""
    chat = plan.chat
    return [TraceRequest(
        id=t.id, arrival=t.arrival, tokens=np.asarray([i for p in range(t.prompt_end) for i in ids[p]], dtype=np.int64),
        output_tokens=t.output_tokens,
        output_token_ids=None if t.answer is None else np.asarray(ids[t.answer], dtype=np.int64),
        salt=chat.salt, lora=chat.lora, tenant=chat.tenant,
        session=chat.session if chat.session is not None else chat.id,
    ) for t in turn_requests(plan, [len(i) for i in ids], gap_s)]
