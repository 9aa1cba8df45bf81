"""The text input formats of ``apcsim convert``, each read record by record into a
:class:`~workloads.convert.conversation.Chat` (mirrors the request bodies vLLM's OpenAI server and
``vllm bench serve`` take).

* ``openai``: JSONL, one chat-completions record per line: ``messages`` (roles system, user,
  assistant, tool -- ``developer`` is read as system; ``content`` a string, null, or a list of
  parts of type ``text``, ``image_url``, ``input_audio``, ``file`` or ``refusal``, where a
  non-text part becomes a placeholder such as ``<image>``), optional ``tools``, ``model``, ``user``,
  ``created`` or ``timestamp``, and the answer: ``response`` (a chat.completion object) or the
  top-level ``choices`` / ``usage`` of one, giving ``usage.completion_tokens`` and/or
  ``choices[0].message.content``. apcsim's own labels ``session``, ``tenant``, ``salt`` (or vLLM's
  ``cache_salt``) and ``lora`` are kept; ``user`` is the tenant when no ``tenant`` is given.
  Other request parameters (``temperature``, ``max_tokens``, ...) are ignored.
* ``sharegpt``: one JSON list of ``{id, conversations: [{from, value}]}`` (``from``: human/user,
  gpt/assistant/chatgpt/bard/bing/model, system, tool/function/observation); no timestamps.
* ``vllm-bench``: ``vllm bench serve``'s custom JSONL: ``prompt`` (str) and optional
  ``output_tokens`` (int); the prompt is one user message under the chat template unless
  ``--no-chat-template`` (``--custom-skip-chat-template``).

JSONL given as ShareGPT is refused on line 1 here, a ShareGPT list given as JSONL by
``workloads.convert.batch``. Each bad record raises ``FieldProblem`` (its reader adds file and
line). ShareGPT's one JSON list is read whole (the stdlib has no streaming JSON parser).
Imports sim.core / ``workloads`` only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from workloads.convert.conversation import Chat
from workloads.convert.timestamps import TimestampMode, parse_timestamp
from workloads.trace_format import is_int
from workloads.trace_json import FieldProblem
from workloads.trace_lines import open_trace

ROLES = frozenset({"system", "user", "assistant", "tool"})
_ROLE_ALIASES = {"developer": "system", "function": "tool"}
_PLACEHOLDERS = {"image_url": "<image>", "input_audio": "<audio>", "file": "<file>"}
_SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system", "tool": "tool",
    "function": "tool", "observation": "tool",
}

Record = tuple[int, Chat | FieldProblem]
"""A record's 1-based line and its chat, or the problem that rejects it."""


def _content(value: Any, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise FieldProblem(field, f"expected a string, null or a list of content parts, got {type(value).__name__}")
    parts: list[str] = []
    for j, part in enumerate(value):
        where = f"{field}[{j}]"
        if not isinstance(part, dict):
            raise FieldProblem(where, f"expected a content part object, got {type(part).__name__}")
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
        elif kind in _PLACEHOLDERS:
            parts.append(_PLACEHOLDERS[kind])
        elif kind in ("text", "refusal"):
            raise FieldProblem(f"{where}.{kind}", "expected a string")
        else:
            raise FieldProblem(f"{where}.type", f"unknown content part type {kind!r} (known: text, image_url, "
                                                "input_audio, file, refusal)")
    return "".join(parts)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise FieldProblem("messages", "expected a non-empty list of messages")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise FieldProblem(f"messages[{i}]", f"expected an object, got {type(msg).__name__}")
        if "role" not in msg:
            raise FieldProblem(f"messages[{i}].role", "missing (every message needs a role)")
        if type(msg["role"]) is str and msg["role"] in ROLES and type(msg.get("content")) is str:
            out.append(msg)  # already as the template reads it: the record's own object, not a copy
            continue
        role = _ROLE_ALIASES.get(msg["role"], msg["role"])
        if role not in ROLES:
            raise FieldProblem(f"messages[{i}].role", f"unknown role {msg['role']!r} (known: system, user, "
                                                       "assistant, tool)")
        out.append({**msg, "role": role, "content": _content(msg.get("content"), f"messages[{i}].content")})
    return out


def _label(obj: dict[str, Any], *keys: str) -> str | None:
    for key in keys:
        v = obj.get(key)
        if v is not None:
            if isinstance(v, (str, int)) and not isinstance(v, bool):
                return str(v)
            raise FieldProblem(key, f"expected a string, got {type(v).__name__}")
    return None


def _answer(obj: dict[str, Any]) -> tuple[str | None, int | None]:
    resp = obj.get("response", obj)
    if not isinstance(resp, dict):
        raise FieldProblem("response", f"expected a chat.completion object, got {type(resp).__name__}")
    prefix = "response." if "response" in obj else ""
    tokens = None
    usage = resp.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            raise FieldProblem(f"{prefix}usage", "expected an object")
        tokens = usage.get("completion_tokens")
        if tokens is not None and (not is_int(tokens) or tokens < 1):
            raise FieldProblem(f"{prefix}usage.completion_tokens", f"expected an int >= 1, got {tokens!r}")
    text = None
    choices = resp.get("choices")
    if choices is not None:
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise FieldProblem(f"{prefix}choices", "expected a non-empty list of choice objects")
        msg = choices[0].get("message")
        if isinstance(msg, dict):
            text = _content(msg.get("content"), f"{prefix}choices[0].message.content")
    return text, tokens


def openai_chat(obj: Any, lineno: int, mode: TimestampMode) -> Chat:
    """One ``openai`` record (see the module docstring)."""
    if not isinstance(obj, dict):
        raise FieldProblem(None, f"expected a JSON object (one chat-completions record per line), got "
                                 f"{type(obj).__name__}")
    if "messages" not in obj:
        raise FieldProblem("messages", "missing required field")
    tools = obj.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise FieldProblem("tools", "expected a list")
    text, tokens = _answer(obj)
    key = "timestamp" if "timestamp" in obj else "created"
    return Chat(
        id=_label(obj, "id") or f"line{lineno}", messages=_messages(obj["messages"]), tools=tools,
        answer_text=text, answer_tokens=tokens, arrival=parse_timestamp(obj.get(key), mode, key),
        session=_label(obj, "session", "session_id"), tenant=_label(obj, "tenant", "user"),
        salt=_label(obj, "salt", "cache_salt"), lora=_label(obj, "lora"),
    )


def vllm_bench_chat(obj: Any, lineno: int, template: bool) -> Chat:
    """One ``vllm-bench`` record."""
    if not isinstance(obj, dict):
        raise FieldProblem(None, f"expected a JSON object, got {type(obj).__name__}")
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise FieldProblem("prompt", "expected a non-empty string" if "prompt" in obj else "missing required field")
    out = obj.get("output_tokens")
    if out is not None and (not is_int(out) or out < 1):
        raise FieldProblem("output_tokens", f"expected an int >= 1, got {out!r}")
    return Chat(id=f"line{lineno}", messages=[{"role": "user", "content": prompt}], answer_tokens=out,
                template=template)


def sharegpt_chat(obj: Any, index: int) -> Chat:
    """One ShareGPT list element."""
    if not isinstance(obj, dict):
        raise FieldProblem(None, f"expected a conversation object, got {type(obj).__name__}")
    conv = obj.get("conversations")
    if not isinstance(conv, list) or not conv:
        raise FieldProblem("conversations", "expected a non-empty list of {from, value}")
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(conv):
        if not isinstance(turn, dict):
            raise FieldProblem(f"conversations[{i}]", "expected an object")
        who = turn.get("from")
        if who not in _SHAREGPT_ROLES:
            raise FieldProblem(f"conversations[{i}].from", f"unknown speaker {who!r}" if "from" in turn else "missing")
        value = turn.get("value")
        if not isinstance(value, str):
            raise FieldProblem(f"conversations[{i}].value", "expected a string")
        messages.append({"role": _SHAREGPT_ROLES[who], "content": value})
    return Chat(id=_label(obj, "id") or f"conv{index}", messages=messages)


def read_sharegpt(path: str | os.PathLike[str], progress: Callable[[int], None]) -> Iterator[Record]:
    """The elements of a ShareGPT JSON list, each with the line it starts on."""
    with open_trace(path) as fh:
        data = fh.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        yield data.count(b"\n", 0, exc.start) + 1, FieldProblem(None, "not UTF-8")
        return
    decoder = json.JSONDecoder()
    ws = " \t\r\n"
    pos = len(text) - len(text.lstrip(ws))
    if not text.startswith("[", pos):
        problem = ("one JSON object per line (JSONL) where a ShareGPT JSON list was expected; use --format openai "
                   "or vllm-bench" if text.startswith("{", pos) else "expected a JSON list of conversations")
        yield text.count("\n", 0, pos) + 1, FieldProblem(None, problem)
        return
    line, seen, index = 1, 0, 0
    pos += 1
    while True:
        while pos < len(text) and text[pos] in ws:
            pos += 1
        line += text.count("\n", seen, pos)
        seen = pos
        if text.startswith("]", pos):
            progress(len(data))
            return
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            yield exc.lineno, FieldProblem(None, f"malformed JSON: {exc.msg} (column {exc.colno})")
            return
        try:
            yield line, sharegpt_chat(obj, index)
        except FieldProblem as exc:
            yield line, exc
        index += 1
        pos = end
        while pos < len(text) and text[pos] in ws:
            pos += 1
        if text.startswith(",", pos):
            pos += 1
        elif not text.startswith("]", pos):
            yield text.count("\n", 0, pos) + 1, FieldProblem(None, "malformed JSON: expected ',' or ']'")
            return
