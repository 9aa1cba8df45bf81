"""One experiment config fully resolved, with where each value came from (``apcsim config show``),
as vLLM's engine logs its non-default arguments at start-up, here for every key.

``resolved_values(path, overrides)`` loads the file as ``apcsim run`` does (same validation, same
``--set`` overrides) and returns every leaf of the resolved config with its source:

* ``--set`` -- set, or set within, by an override (the last override of a key wins);
* ``file`` -- written in the config file;
* ``default`` -- the model's default;
* ``derived`` -- left unset (``null``) in the config and derived by the engine like vLLM
  (``sim.experiment.engine_description.resolve``: the pool's ``num_gpu_blocks`` from the GPU and
  model, ``max_model_len`` from the model); the value shown is the derived one.

``render_values`` prints them as YAML with each source in a comment, so the output is itself a
valid config. Invariants: the values are exactly ``config_to_dict`` of the loaded config, except
the derived ones; imports neither simpy nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim.experiment.config import ConfigError, config_to_dict, load_config, load_yaml, override_value
from sim.experiment.engine_description import resolve


@dataclass(frozen=True)
class ResolvedValue:
    """A leaf of the resolved config: dotted ``key``, ``value`` and ``source``."""

    key: str
    value: Any
    source: str


def _leaves(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += _leaves(value, path + ".")
        else:
            out.append((path, value))
    return out


def _given(node: Any, key: str) -> bool:
    """Whether mapping ``node`` gives ``key`` (dotted): present, or a scalar shorthand for its mapping
    (``router: sglang`` gives ``router.kind``, the only key a shorthand sets)."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict):
            return node is not None and parts[i:] == ["kind"]
        if part not in node:
            return False
        node = node[part]
    return True


def _set_by(key: str, overrides: list[tuple[str, Any]]) -> bool:
    """Whether the last override touching ``key`` sets it (an override of a mapping sets what it gives)."""
    for okey, value in reversed(overrides):
        if key == okey:
            return True
        if key.startswith(okey + "."):
            return _given({"v": value}, "v." + key[len(okey) + 1:])
    return False


def resolved_values(path: str | Path, overrides: list[str] | None = None) -> list[ResolvedValue]:
    """Every leaf of ``path``'s resolved config (``overrides`` applied) with its source."""
    overrides = list(overrides or [])
    raw = load_yaml(path)
    sweep_keys = sorted({"grid", "zip", "base", "base_config"} & set(raw)) if isinstance(raw, dict) else []
    if sweep_keys:
        raise ConfigError(f"{path}: a sweep file (it has {', '.join(sweep_keys)}); config show takes one "
                          "experiment file, e.g. the sweep's base_config")
    cfg = load_config(path, overrides)
    given = [override_value(item) for item in overrides]
    engine = resolve(cfg)
    derived = {"engine.num_gpu_blocks": engine.num_gpu_blocks, "engine.max_model_len": engine.max_model_len}
    values = []
    for key, value in _leaves(config_to_dict(cfg)):
        if _set_by(key, given):
            source = "--set"
        elif _given(raw, key):
            source = "file"
        elif value is None and key in derived:
            value, source = derived[key], "derived"
        else:
            source = "default"
        values.append(ResolvedValue(key, value, source))
    return values


def _scalar(value: Any) -> str:
    text: str = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...")


def render_values(values: list[ResolvedValue], title: str) -> str:
    """The values as YAML, nested as in the config, each leaf's source in a comment."""
    lines = [f"# {title}: resolved; after each value, where it came from (default, file, --set, derived)"]
    width = max((len(v.key.rsplit(".", 1)[-1]) + 2 * v.key.count(".") + len(_scalar(v.value)) for v in values),
                default=0) + 3
    opened: list[str] = []
    for v in values:
        parts = v.key.split(".")
        common = 0
        while common < min(len(opened), len(parts) - 1) and opened[common] == parts[common]:
            common += 1
        opened = opened[:common]
        for depth in range(common, len(parts) - 1):
            lines.append(f"{'  ' * depth}{parts[depth]}:")
            opened.append(parts[depth])
        body = f"{'  ' * (len(parts) - 1)}{parts[-1]}: {_scalar(v.value)}"
        lines.append(f"{body:<{width}}# {v.source}")
    return "\n".join(lines)
