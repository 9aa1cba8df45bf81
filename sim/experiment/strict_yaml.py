"""Reading YAML input strictly (mirrors nothing in vLLM, whose CLI takes no YAML mappings it would
merge silently): config files, sweep files and ``--set`` values.

PyYAML's ``safe_load`` keeps the *last* value of a key given twice (``block_size: 16`` and later
``block_size: 64`` in one mapping runs at 64 without a word) and decodes bytes with a traceback
when they are not UTF-8. :class:`StrictLoader` is a ``SafeLoader`` whose mappings refuse a
duplicate key; :func:`load_yaml_text` and :func:`load_yaml_file` turn every problem into one
:class:`YAMLInputError` whose ``where`` is ``line`` or ``line:column`` (1-based) and whose
``problem`` says what is wrong (``duplicate key 'block_size' (first on line 3)``, ``not UTF-8 (byte
0xff)``, ``invalid YAML: ...``). ``sim.experiment.config`` prefixes the file name or the ``--set``
override and raises its ``ConfigError``.

Aliases are refused when, expanded, they would add more than :data:`MAX_ALIAS_NODES` nodes (an
alias bomb: PyYAML shares the aliased objects, but validation and messages walk them expanded,
gigabytes of them), checked on the composed node graph before anything is constructed.

Invariants: a duplicate key is refused at every nesting depth, in block and flow mappings alike; a
YAML merge key (``<<: *anchor``) still overrides what it merges (that is what merging means); the
text is decoded as strict UTF-8 (a leading byte-order mark is allowed). Imports only PyYAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLInputError(ValueError):
    """A YAML text that cannot be read; ``where`` is ``"line"``, ``"line:col"`` or ``""``."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}" if where else problem)


class _DuplicateKey(ConstructorError):
    def __init__(self, key: Any, node: Node, first: Node) -> None:
        super().__init__(problem=f"duplicate key {key!r} (first on line {first.start_mark.line + 1})",
                         problem_mark=node.start_mark)


class StrictLoader(yaml.SafeLoader):
    """A ``SafeLoader`` whose mappings refuse a key given twice."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader reports it below
                    continue
                if first is not None:
                    raise _DuplicateKey(key, key_node, first)
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _where(mark: Any) -> str:
    return f"{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


MAX_ALIAS_NODES = 10_000
"""How many nodes aliases may add to a document, counted as expanded: a config repeats a section
a few times; nine nested aliases of nine (the 'billion laughs') expand to 387 million."""


class _AliasBomb(yaml.YAMLError):
    def __init__(self, anchor: Node) -> None:
        super().__init__()
        self.problem_mark = anchor.start_mark
        self.problem = (f"aliases expand to more than {MAX_ALIAS_NODES:,} nodes (the anchor here is used "
                        "again and again: an alias bomb?); write the values out")


def check_alias_expansion(root: Node | None) -> None:
    """Refuse a composed document whose aliases expand to more than :data:`MAX_ALIAS_NODES` nodes,
    before anything is constructed or validated. Linear in the distinct nodes: each node's
    expanded size is computed once; every further use of it (an alias) adds that size."""
    sizes: dict[int, int] = {}
    added = 0

    def size(node: Node) -> int:
        nonlocal added
        known = sizes.get(id(node))
        if known is not None:  # a node met again is an alias of it
            added += known
            if added > MAX_ALIAS_NODES:
                raise _AliasBomb(node)
            return known
        sizes[id(node)] = 1  # provisional: a node is never its own descendant (PyYAML refuses that)
        value = node.value
        children = ([n for pair in value for n in pair] if isinstance(node, MappingNode)
                    else value if isinstance(value, list) else [])
        total = 1 + sum(size(child) for child in children)
        sizes[id(node)] = total
        return total

    if root is not None:
        size(root)


def _load(text: str) -> Any:
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        check_alias_expansion(node)
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def load_yaml_text(text: str) -> Any:
    """Parse one YAML document strictly; problems raise :class:`YAMLInputError`."""
    try:
        return _load(text)  # StrictLoader is a SafeLoader
    except _DuplicateKey as exc:
        mark = exc.problem_mark
        raise YAMLInputError(str(mark.line + 1) if mark is not None else "", str(exc.problem)) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow: no mark, a position
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise YAMLInputError(f"{line}:{column}", f"invalid YAML: character {exc.character!r} is not allowed") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise YAMLInputError(_where(mark), f"invalid YAML: {problem}") from None
    except RecursionError:
        raise YAMLInputError("", "invalid YAML: nested too deeply") from None


def decode_utf8(data: bytes) -> str:
    """``data`` as strict UTF-8 (a leading byte-order mark dropped); raises :class:`YAMLInputError`
    naming the line and the first bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise YAMLInputError(f"{line}:{column}", f"not UTF-8 (byte 0x{data[exc.start]:02x})") from None
    return text[1:] if text.startswith("\ufeff") else text


def load_yaml_file(path: str | Path) -> Any:
    """Read and parse a YAML file strictly; an unreadable file raises ``OSError``, bad content
    :class:`YAMLInputError`."""
    return load_yaml_text(decode_utf8(Path(path).read_bytes()))
