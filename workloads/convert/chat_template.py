"""A model's chat template, rendered the way Hugging Face ``transformers``' ``apply_chat_template``
renders it (what vLLM's OpenAI server calls before tokenizing a chat request).

The environment matches transformers' (``utils/chat_template_utils.py``, read, not copied): a
jinja2 ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks`` on and the
``loopcontrols`` extension (``{% break %}``), a ``tojson`` filter that keeps non-ASCII text
(``ensure_ascii=False``, unlike jinja's own), and the globals ``raise_exception(msg)`` (a template's
way to refuse a conversation) and ``strftime_now(fmt)`` (local time, as transformers does: a
template that prints today's date renders differently on another day -- the summary of
``apcsim convert`` says when a template calls it). The render gets ``messages``, ``tools``,
``documents``, ``add_generation_prompt`` and the special tokens of ``tokenizer_config.json``
(``bos_token``, ``eos_token``, ...; an ``AddedToken`` object gives its ``content``).

Where the template comes from: ``chat_template`` in ``tokenizer_config.json`` (a string, or a list
of ``{name, template}`` where ``tool_use`` is taken when the request has tools and ``default``
otherwise), else a ``chat_template.jinja`` file beside it (newer model folders).

Errors: a template that does not compile, or fails while rendering (``raise_exception``, an
undefined variable used as a dict ...), raises :class:`TemplateRenderError` carrying the
template's line, found in the traceback jinja rewrites to point into ``<template>``. Imports
jinja2 only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.runtime
import jinja2.sandbox

from workloads.convert.template_parts import PartsRenderer, TemplateParts, split_template

SPECIAL_TOKEN_KEYS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens",
)
"""The ``tokenizer_config.json`` keys passed to the template (transformers' special tokens map)."""


class TemplateRenderError(Exception):
    """The chat template failed; ``template_line`` is its 1-based line when known."""

    def __init__(self, message: str, template_line: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.template_line = template_line

    def describe(self) -> str:
        where = f" (template line {self.template_line})" if self.template_line else ""
        return f"chat template fails to render{where}: {self.message}"


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _template_line(exc: BaseException) -> int | None:
    """The template line of a render error: jinja rewrites the traceback so that a frame's file
    name is ``<template>`` and its line the template's."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line if isinstance(line, int) else None


def _token_text(value: Any) -> Any:
    """A special token as the template sees it: an ``AddedToken`` dict gives its ``content``."""
    if isinstance(value, dict) and "content" in value:
        return value["content"]
    if isinstance(value, list):
        return [_token_text(v) for v in value]
    return value


@dataclass
class ChatTemplate:
    """One model's chat template(s), compiled once. ``templates`` maps a name (``default``,
    ``tool_use``) to its source; ``special_tokens`` are passed to every render."""

    templates: Mapping[str, str]
    special_tokens: Mapping[str, Any] = field(default_factory=dict)
    _compiled: dict[str, jinja2.Template] = field(default_factory=dict, init=False, repr=False)
    _base: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False)
    _parts: dict[str, TemplateParts | None] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        env = _environment()
        for name, source in self.templates.items():
            try:
                self._compiled[name] = env.from_string(source)
            except jinja2.exceptions.TemplateSyntaxError as exc:
                raise TemplateRenderError(f"template {name!r} does not compile: {exc.message}", exc.lineno) from None
        for name, compiled in self._compiled.items():
            self._base[name] = {**compiled.globals, **self.special_tokens}
        if "default" not in self._compiled:
            raise TemplateRenderError("no default chat template (a list of templates needs one named 'default')",
                                      None)
        self.uses_clock = any("strftime_now" in s for s in self.templates.values())
        self._parts = {name: split_template(env, source) for name, source in self.templates.items()}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], jinja_file: str | None = None) -> ChatTemplate | None:
        """The template of a parsed ``tokenizer_config.json`` (or of ``jinja_file``'s text); None
        when neither has one."""
        raw = config.get("chat_template")
        templates: dict[str, str] = {}
        if isinstance(raw, str):
            templates["default"] = raw
        elif isinstance(raw, list):
            for entry in raw:
                if isinstance(entry, dict) and isinstance(entry.get("name"), str) \
                        and isinstance(entry.get("template"), str):
                    templates[entry["name"]] = entry["template"]
        elif raw is None and jinja_file is not None:
            templates["default"] = jinja_file
        if not templates:
            return None
        special = {k: _token_text(config[k]) for k in SPECIAL_TOKEN_KEYS if config.get(k) is not None}
        return cls(templates, special)

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool,
               tools: Sequence[Any] | None = None) -> str:
        """The prompt text of ``messages`` (a lookup; changes nothing). Raises
        :class:`TemplateRenderError`."""
        name = self._name(tools)
        return self._run(self._compiled[name], name, {
            "messages": messages, "tools": tools or None, "documents": None,
            "add_generation_prompt": add_generation_prompt})

    def parts(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
              bodies: list[str] | None = None) -> PartsRenderer | None:
        """The chat's texts from the template's parts where it splits exactly
        (``workloads.convert.template_parts``: each message rendered once), else None; ``bodies``:
        the messages' texts from :meth:`prefill`."""
        name = self._name(tools)
        parts = self._parts.get(name)
        if parts is None:
            return None
        return PartsRenderer(parts, lambda compiled, variables: self._chunks(compiled, name, variables), messages,
                             tools, bodies)

    def prefill(self, chats: Sequence[tuple[Sequence[Mapping[str, Any]], Sequence[Any] | None]]
                ) -> list[list[str] | None]:
        """The message texts of many ``(messages, tools)`` chats, the new ones rendered in one
        jinja call per split template (``TemplateParts.prefill``), for :meth:`parts`; None for a
        chat its split template cannot give them for, or whose template does not split."""
        out: list[list[str] | None] = [None] * len(chats)
        groups: dict[str, list[int]] = {}
        for k, (_, tools) in enumerate(chats):
            name = self._name(tools)
            if self._parts.get(name) is not None:
                groups.setdefault(name, []).append(k)
        for name, at in groups.items():
            parts = self._parts[name]
            assert parts is not None
            texts = parts.prefill(lambda compiled, variables, name=name: self._chunks(compiled, name, variables),  # type: ignore[misc]
                                  [chats[k][0] for k in at])
            for k, bodies in zip(at, texts, strict=True):
                out[k] = bodies
        return out

    def _name(self, tools: Sequence[Any] | None) -> str:
        """The template a chat renders with: ``tool_use`` for a chat with tools where there is one."""
        return "tool_use" if tools and "tool_use" in self._compiled else "default"

    def _run(self, compiled: jinja2.Template, name: str, variables: dict[str, Any]) -> str:
        return "".join(self._chunks(compiled, name, variables))

    def _chunks(self, compiled: jinja2.Template, name: str, variables: dict[str, Any]) -> Iterator[str]:
        """The text ``compiled`` yields, chunk by chunk. Template.render's steps with the globals
        merged once (_base): a fresh context per call merged the environment's globals again, half
        the cost of rendering a short chat."""
        ctx = jinja2.runtime.new_context(
            compiled.environment, compiled.name, compiled.blocks, {**self._base[name], **variables}, shared=True)
        try:
            try:
                yield from compiled.root_render_func(ctx)
            except Exception:
                compiled.environment.handle_exception()  # re-raises with the template's lines in the traceback
                raise  # pragma: no cover - handle_exception always raises
        except jinja2.exceptions.TemplateError as exc:
            raise TemplateRenderError(exc.message or type(exc).__name__, _template_line(exc)) from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise TemplateRenderError(f"{type(exc).__name__}: {exc}", _template_line(exc)) from None
