"""A chat template split at its loop over the messages, when the split is provably exact: each
message is then rendered once (and a message seen before not at all), and a turn's prompt is put
together from the parts instead of rendering the whole history again (``apcsim convert`` renders
every turn's prompt and the history after its answer: three renders for a chat of two turns).

**When it is exact.** Many templates (the tests' Llama-3-style one; ChatML ones) are three parts
in a row: a *head* that never reads ``messages`` (BOS, the tool list), one ``{% for m in messages
%}`` whose *body* reads only the message's own keys, and a *tail* that reads only
``add_generation_prompt``. jinja runs such a template as head, then body once per message in
order, then tail, so that ::

    render(messages, gen, tools) == head(tools) + body(m0) + body(m1) + ... + tail(gen)

and ``body(m)`` depends only on the values of the keys it reads. :func:`split_template` proves
that shape on the template's parsed tree (``jinja2.nodes``), conservatively, and returns None
otherwise (the caller renders whole, as before). The proof asks:

* the top level is head nodes, one ``For`` over the plain name ``messages`` (one target name, no
  ``else``, filter or ``recursive``), tail nodes; no other node anywhere reads ``messages``;
* nothing keeps state between the parts or stops the loop early: no ``set``, ``macro``,
  ``call``, ``with``, ``include``/``import``/``extends``/``block``, ``break``/``continue``; no
  ``loop`` (position) in the body; no clock (``strftime_now``) nor ``lipsum`` (random);
* the body reads the message only as ``m['key']`` or ``m.key`` with a constant key that is not
  an attribute of ``dict`` (``m.items`` would be the method), and reads neither ``tools``,
  ``documents`` nor ``add_generation_prompt``; the tail reads neither the message, ``tools`` nor
  ``documents``.

Each part is compiled from the template's own nodes (the same environment: sandbox, filters,
whitespace already applied by the lexer), so a part raises the error the whole render raises, with
the same template line; and the parts are rendered in the order the whole render reaches them (head,
the messages in order, tail), so the first error of a chat is the same. A body's text is cached by
the values of the keys it reads (strings only; anything else is rendered each time).
``tests/test_convert_template_parts.py`` checks the composition against whole renders and refused
shapes. Imports jinja2 only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
from jinja2 import nodes

ChunksFn = Callable[[jinja2.Template, dict[str, Any]], Iterator[str]]
"""``ChatTemplate``'s render of a compiled template with the given variables, as the chunks jinja
yields (errors raised as ``TemplateRenderError``)."""

_STATEFUL = (nodes.Assign, nodes.AssignBlock, nodes.Macro, nodes.CallBlock, nodes.Import, nodes.FromImport,
             nodes.Include, nodes.Extends, nodes.Block, nodes.With, nodes.Scope, nodes.ScopedEvalContextModifier,
             nodes.EvalContextModifier, nodes.ExprStmt, nodes.Break, nodes.Continue, nodes.FilterBlock)
_MARK_NAME = "__apcsim_message_end"
_NEVER = frozenset({"messages", "strftime_now", "lipsum", _MARK_NAME})
_MARK = "".join(["<end of one message's text>"])  # a str object of its own: found by identity, never by value
BODY_CACHE_LIMIT = 1 << 14
"""Message texts a split template keeps (emptied when full; small for the reason of the tokenizer's
``CACHE_LIMIT``)."""
_MISSING = object()


def _join(chunks: Iterator[str]) -> str:
    return "".join(chunks)


@dataclass
class TemplateParts:
    """A template split at its message loop (:func:`split_template`). ``bodies`` is the message
    loop alone with a marker yielded after each message: the new messages of a chat are rendered
    in one call and cut at the markers (jinja yields ``str(marker)``, the marker object itself)."""

    head: jinja2.Template
    bodies: jinja2.Template
    keys: tuple[str, ...]  # the message keys the body reads
    tail: jinja2.Template
    _cache: dict[tuple[Any, ...], str] = field(default_factory=dict, repr=False)
    _heads: dict[bool, str] = field(default_factory=dict, repr=False)  # tools None -> head text
    _tails: dict[bool, str] = field(default_factory=dict, repr=False)

    def head_text(self, chunks: ChunksFn, tools: Sequence[Any] | None) -> str:
        if not tools and False in self._heads:
            return self._heads[False]
        text = _join(chunks(self.head, {"tools": tools or None, "documents": None}))
        if not tools:
            self._heads[False] = text
        return text

    def body_texts(self, chunks: ChunksFn, messages: Sequence[Any]) -> tuple[list[str], Exception | None]:
        """The body's text of each message, in order, up to the first that fails to render (then
        its error too). A message (a dict) whose read keys all hold strings is cached by them."""
        cache, keys = self._cache, self.keys
        found: list[tuple[Any, ...] | None | str] = []  # the text, or the key to cache it under (None: no cache)
        new = []
        for m in messages:
            key = tuple(map(m.get, keys)) if type(m) is dict else None
            if key is not None:
                for v in key:
                    if type(v) is not str:  # a missing key (None) or another type: rendered each time
                        key = None
                        break
                else:
                    text = cache.get(key)
                    if text is not None:
                        found.append(text)
                        continue
            found.append(key)
            new.append(m)
        if not new:
            return found, None  # type: ignore[return-value]  # every entry is a text
        done, error = self._render(chunks, new)
        out: list[str] = []
        at = 0
        for entry in found:
            if type(entry) is not str:
                if at == len(done):
                    return out, error
                text = done[at]
                at += 1
                if entry is not None:
                    if len(cache) >= BODY_CACHE_LIMIT:
                        cache.clear()
                    cache[entry] = text  # type: ignore[index]
                entry = text
            out.append(entry)
        return out, error

    def _render(self, chunks: ChunksFn, messages: list[Any]) -> tuple[list[str], Exception | None]:
        """The body's text of each message in one jinja call (cut at the markers), up to the first
        that fails to render, and that one's error (None: all rendered)."""
        done: list[str] = []
        part: list[str] = []
        try:
            for chunk in chunks(self.bodies, {"messages": messages, _MARK_NAME: _MARK}):
                if chunk is _MARK:
                    done.append("".join(part))
                    part = []
                else:
                    part.append(chunk)
        except Exception as exc:  # kept for the turn that reaches this message
            return done, exc
        if len(done) != len(messages):  # pragma: no cover - jinja yields each output node
            raise AssertionError("a split chat template lost a message's end marker")
        return done, None

    def prefill(self, chunks: ChunksFn, chats: Sequence[Sequence[Any]]) -> list[list[str] | None]:
        """The body texts of each chat's messages (``chats``: message lists), the new ones of all
        chats rendered in as few jinja calls as possible and cached; None for a chat with a message
        that is not cached by its keys (not a dict of strings) or that fails to render -- its own
        parts render then handles it, and raises at the same turn. Changes no text: a body's text is
        a function of the keys it reads."""
        cache = self._cache
        rows, todo = _message_rows(list(chats), self.keys, cache)
        if not todo:
            return rows  # every entry is a text
        if len(cache) + len(todo) > BODY_CACHE_LIMIT:
            cache.clear()
        items = list(todo.items())
        rendered: dict[tuple[Any, ...], str] = {}
        while items:
            done, error = self._render(chunks, [m for _, m in items])
            rendered.update(zip([key for key, _ in items], done))
            if error is None:
                break
            items = items[len(done) + 1:]
        cache.update(rendered)
        return _resolve_rows(rows, rendered)

    def tail_text(self, chunks: ChunksFn, gen: bool) -> str:
        text = self._tails.get(gen)
        if text is None:
            text = self._tails[gen] = _join(chunks(self.tail, {"add_generation_prompt": gen}))
        return text


def message_rows(chats: list[Sequence[Any]], keys: tuple[str, ...], cache: dict[tuple[Any, ...], str]
                 ) -> tuple[list[list[Any] | None], dict[tuple[Any, ...], Any]]:
    """Per chat its messages' texts from ``cache`` or, for a message not cached yet, its key (the
    values of ``keys``), None for a chat with a message that is not a dict whose keys read all hold
    strings; and the keys to render, each with its first message. The definition the compiled
    ``word_scan.message_rows`` runs."""
    todo: dict[tuple[Any, ...], Any] = {}
    rows: list[list[Any] | None] = []
    for messages in chats:
        row: list[Any] | None = []
        for m in messages:
            if type(m) is not dict:
                row = None
                break
            key = tuple(map(m.get, keys))
            if not all(type(v) is str for v in key):
                row = None
                break
            text = cache.get(key)
            if text is None:
                todo.setdefault(key, m)
                row.append(key)  # type: ignore[union-attr]
            else:
                row.append(text)  # type: ignore[union-attr]
        rows.append(row)
    return rows, todo


def resolve_rows(rows: list[list[Any] | None], rendered: dict[tuple[Any, ...], str]) -> list[list[str] | None]:
    """``message_rows``' rows with every key replaced by its rendered text (None for a row with a key
    not rendered). The definition the compiled ``word_scan.resolve_rows`` runs."""
    out: list[list[str] | None] = []
    for row in rows:
        if row is not None:
            try:
                row = [entry if type(entry) is str else rendered[entry] for entry in row]
            except KeyError:  # a message that failed to render
                row = None
        out.append(row)
    return out


_message_rows: Callable[..., tuple[list[list[Any] | None], dict[tuple[Any, ...], Any]]] = message_rows
_resolve_rows: Callable[..., list[list[str] | None]] = resolve_rows
try:
    from workloads.convert.word_scan import message_rows as _message_rows
    from workloads.convert.word_scan import resolve_rows as _resolve_rows
except ImportError:  # pragma: no cover - an extension built before these were added, or none
    pass


class PartsRenderer:
    """One chat's texts from the parts: :meth:`segment` gives what follows ``head + bodies[:m]`` in
    the whole render of the first ``n`` messages. The head and every message are rendered on the
    first call; an error is raised by the first call whose whole render would raise it (head first,
    then the messages in order, then the tail)."""

    def __init__(self, parts: TemplateParts, chunks: ChunksFn, messages: Sequence[Any],
                 tools: Sequence[Any] | None, bodies: list[str] | None = None) -> None:
        self.parts, self._chunks, self.messages, self.tools = parts, chunks, messages, tools
        self.head: str | None = None
        self._given = bodies  # the messages' texts when already rendered (TemplateParts.prefill)
        self._bodies: list[str] = []
        self._error: Exception | None = None

    def segment(self, m: int, n: int, gen: bool) -> str:
        """``render(messages[:n], gen)[len(head + bodies[:m]):]`` (``m <= n``), raising what that
        render raises."""
        if self.head is None:
            self.head = self.parts.head_text(self._chunks, self.tools)
            if self._given is not None:
                self._bodies = self._given
            else:
                self._bodies, self._error = self.parts.body_texts(self._chunks, self.messages)
        if n > len(self._bodies):
            assert self._error is not None, "render asked for more messages than given"
            raise self._error
        return "".join(self._bodies[m:n]) + self.parts.tail_text(self._chunks, gen)

    def tail(self, gen: bool) -> str:
        """The tail's text (rendered by an earlier :meth:`segment` call with ``gen``)."""
        return self.parts.tail_text(self._chunks, gen)


def _walk(node: nodes.Node, parent: nodes.Node | None = None) -> Iterator[tuple[nodes.Node, nodes.Node | None]]:
    yield node, parent
    for child in node.iter_child_nodes():
        yield from _walk(child, node)


def _names(body: list[nodes.Node]) -> set[str]:
    return {n.name for top in body for n in top.find_all(nodes.Name)}


def _message_keys(body: list[nodes.Node], var: str) -> tuple[str, ...] | None:
    """The constant keys the loop body reads from its message, or None when it reads the message
    any other way (passes it whole, a variable key, a dict attribute, a nested loop)."""
    keys: set[str] = set()
    for top in body:
        for node, parent in _walk(top):
            if isinstance(node, nodes.For):
                return None
            if not (isinstance(node, nodes.Name) and node.name == var):
                continue
            if isinstance(parent, nodes.Getitem) and parent.node is node and isinstance(parent.arg, nodes.Const):
                key = parent.arg.value
            elif isinstance(parent, nodes.Getattr) and parent.node is node:
                key = parent.attr
            else:
                return None
            if not isinstance(key, str) or hasattr(dict, key):
                return None
            keys.add(key)
    return tuple(sorted(keys))


def split_template(env: jinja2.Environment, source: str) -> TemplateParts | None:
    """The template's parts when the split is exact (see the module docstring), else None."""
    tree = env.parse(source)
    if any(True for _ in tree.find_all(_STATEFUL)):
        return None
    loops = [i for i, n in enumerate(tree.body) if isinstance(n, nodes.For)
             and isinstance(n.iter, nodes.Name) and n.iter.name == "messages"]
    if len(loops) != 1:
        return None
    at = loops[0]
    loop = tree.body[at]
    assert isinstance(loop, nodes.For)
    if not isinstance(loop.target, nodes.Name) or loop.else_ or loop.test is not None or loop.recursive:
        return None
    var = loop.target.name
    head, body, tail = tree.body[:at], loop.body, tree.body[at + 1:]
    body_never = _NEVER | {"loop", "tools", "documents", "add_generation_prompt"}
    if _names(head) & (_NEVER | {"add_generation_prompt"}) or _names(body) & body_never \
            or _names(tail) & (_NEVER | {var, "loop", "tools", "documents"}):
        return None
    keys = _message_keys(body, var)
    if keys is None:
        return None

    def compiled(part: list[nodes.Node]) -> jinja2.Template:
        template = nodes.Template(part, lineno=1)
        template.set_environment(env)
        return env.from_string(template)

    marked = nodes.For(nodes.Name(var, "store", lineno=loop.lineno), nodes.Name("messages", "load", lineno=loop.lineno),
                       [*body, nodes.Output([nodes.Name(_MARK_NAME, "load", lineno=loop.lineno)], lineno=loop.lineno)],
                       [], None, False, lineno=loop.lineno)
    return TemplateParts(compiled(head), compiled([marked]), keys, compiled(tail))
