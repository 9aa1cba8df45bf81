"""``--set key.path=value`` overrides of a config mapping, applied before validation (like vLLM's
``--kv-transfer-config``-style dotted CLI overrides of engine arguments, here for any key).

A value is parsed as strict YAML (``sim.experiment.strict_yaml``). A problem an override causes
is reported against the override, never against the config file it was applied to:
``--set engine.block_size=[: invalid YAML: ...`` at parse time, and through
:func:`blame_override`, ``--set engine.block_size=7: engine.block_size: ...`` at validation time.
Invariants: overrides apply in order, the last one of a key wins; the mapping given is changed in
place and values are deep-copied into it. Imports neither simpy nor torch.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.experiment.config_error import ConfigError
from sim.experiment.strict_yaml import YAMLInputError, load_yaml_text


def _override(item: str) -> str:
    """``--set item`` for a message (quoted when it holds a control character or a line break)."""
    return f"--set {item}" if item.isprintable() else f"--set {item!r}"


def override_value(item: str) -> tuple[str, Any]:
    """``key.path=value`` split, the value parsed as (strict) YAML; problems raise ``ConfigError``
    naming the override (``--set engine.block_size=[: invalid YAML: ...``), not the config file."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"{_override(item)}: an override must look like key.path=value")
    if any(not part.strip() for part in key.split(".")):  # engine.=5, .x=1, a..b=2: no key to set
        raise ConfigError(f"{_override(item)}: {key!r} has an empty key between its dots; write key.path=value")
    try:
        return key, load_yaml_text(raw)
    except YAMLInputError as exc:
        raise ConfigError(f"{_override(item)}: {exc.problem}") from None


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str = "") -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a config mapping; a problem
    raises ``ConfigError`` naming the override (``source`` is unused, kept for callers)."""
    for item in overrides:
        key, value = override_value(item)
        try:
            set_dotted(data, key, value)
        except ConfigError as exc:
            raise ConfigError(f"{_override(item)}: {exc}") from None
    return data


def blame_override(line: str, source: str, overrides: list[str]) -> str:
    """A ``source: loc: problem`` line, naming the override that set ``loc`` (or a mapping holding
    it) when there is one (``--set engine.block_size=7: engine.block_size: ...``); a check across
    the keys of ``loc`` names every override inside ``loc`` (``--set engine.a=1, --set engine.b=2
    (on x.yaml): engine: ...``); else the line unchanged."""
    prefix = f"{source}: "
    if not line.startswith(prefix):
        return line
    loc, sep, _ = line[len(prefix):].partition(": ")
    if not sep:
        return line
    rest = line[len(prefix):]
    for item in reversed(overrides):  # the last override of a key is the one that counts
        key = item.partition("=")[0]
        if loc == key or loc.startswith(key + "."):  # the value at loc came from this override
            return f"{_override(item)}: {rest}"
    inside = [item for item in overrides if item.partition("=")[0].startswith(loc + ".")]
    if len(inside) == 1:  # a check across the keys of loc, one of which this override set
        return f"{_override(inside[0])}: {rest}"
    if inside:  # a check across the keys of loc: its values came from these overrides and the file
        return f"{', '.join(_override(item) for item in inside)} (on {source}): {rest}"
    return line


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested mapping, creating missing mappings (``value`` is copied)."""
    node = data
    parts = key.split(".")
    for i, p in enumerate(parts[:-1]):
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])} is not a mapping")
        node = nxt
    node[parts[-1]] = copy.deepcopy(value)
