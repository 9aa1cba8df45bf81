"""Sweep files: a base experiment plus axes, expanded into validated points (mirrors nothing in
vLLM).

A sweep YAML file::

    name: chat_block_size            # the sweep folder is <output_dir>/<name>/
    description: ...                 # optional, free text
    output_dir: results/sweeps       # optional (default results/sweeps), relative to the working dir
    base_config: ../chat_synthetic.yaml   # an experiment file to start from, and/or
    base: {engine: {max_model_len: 32768}, ...}   # an experiment mapping (deep-merged on top)
    grid:                            # cartesian product, first axis slowest
      engine.block_size: [16, 64, 256]
      engine.kv_cache_gib: [4, 16]
      workload:                      # a mapping instead of a list: labelled values
        chat: {kind: chat, sessions: 100}
        rag: {kind: rag, requests: 400}
    zip:                             # values taken together (equal lengths); a list of such
      seed: [0, 1]                   #   mappings gives several zip groups
      workload.arrival.rate: [0.2, 0.4]
    bounds: true                     # infinite-cache and Belady bounds beside every point
    keep_steps: false                # also store each point's per-step table (large)

Points = grid product x zip groups. An axis key is a dotted config key (``engine.block_size``,
``workload.tenants.salt``, ``seed``); each point = base + its axis values set at those keys
(parents before children, so a ``workload`` axis can be refined by ``workload.tenants.salt``),
then validated as an :class:`~sim.experiment.config.ExperimentConfig` and its engine resolved
(:func:`~sim.experiment.engine_description.resolve`: the pool size, and the pool against
``max_model_len``, as vLLM checks at start-up). Problems stop the sweep before anything runs with
one message listing every bad point, each line naming the sweep file, the key
(``grid.engine.block_size``, ``zip.seed``, ``base.engine.blok_size``, or the base_config file and
its key) and the point.

The CPU offload tier sweeps like any key (``engine.kv_offloading_size`` in GiB,
``engine.num_cpu_blocks`` in chunks, ``engine.kv_offloading_policy``); ``null`` (or ``none``) on a
size axis is a point without a tier, whose other tier keys are dropped, so a size x policy grid
runs its untiered config once (:mod:`sim.experiment.tier_axis`).

Input paths resolve against the base_config file's folder when there is one, else against the
sweep file's folder. A point's identity is the hash of its resolved config (sorted JSON, without
``name``/``output_dir``/``replay.progress``) and the bounds flag: :func:`point_key`.
Invariants: every point is validated before anything runs; equal resolved configs get equal
keys. Imports neither simpy nor torch.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.experiment.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    blame_override,
    config_from_dict,
    config_to_dict,
    load_yaml,
    override_value,
    set_dotted,
)
from sim.experiment.engine_description import resolve
from sim.experiment.tier_axis import drop_absent_tier, tier_axis_value

SWEEP_KEYS = {"name", "description", "output_dir", "base", "base_config", "grid", "zip", "bounds", "keep_steps"}
DEFAULT_OUTPUT_DIR = "results/sweeps"
KEY_FORMAT = 2  # bump when the meaning of a point's stored result changes (2: the hit rates named for what they count)
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Axis:
    """One swept key: its values and the label each value gets in the table."""

    key: str
    values: tuple[Any, ...]
    labels: tuple[Any, ...]
    section: str  # "grid" or "zip" (for messages)


@dataclass
class Point:
    """One point of a sweep: its position, axis labels, overrides and validated config."""

    index: int
    axes: dict[str, Any]  # axis key -> label (table column value)
    overrides: dict[str, Any]  # axis key -> value set in the config
    config: ExperimentConfig
    key: str

    def task(self, bounds: bool, keep_steps: bool = False) -> dict[str, Any]:
        """What a worker needs to run this point (plain, picklable data)."""
        return {
            "key": self.key,
            "config": config_to_dict(self.config),
            "base_dir": self.config.base_dir,
            "source": self.config.source,
            "bounds": bounds,
            "keep_steps": keep_steps,
        }


@dataclass
class Sweep:
    """A parsed, expanded sweep file."""

    name: str
    path: Path
    output_dir: str
    description: str
    bounds: bool
    axes: list[Axis]
    points: list[Point] = field(default_factory=list)
    keep_steps: bool = False
    overrides: list[str] = field(default_factory=list)  # the --set items applied to the base config

    def folder(self) -> Path:
        return Path(self.output_dir).expanduser() / self.name

    @property
    def axis_keys(self) -> list[str]:
        return [a.key for a in self.axes]

    def manifest(self) -> dict[str, Any]:
        """What ``sweep.json`` records: the axes, the ``--set`` overrides and every point's key."""
        return {
            "name": self.name,
            "source": str(self.path),
            "overrides": list(self.overrides),
            "description": self.description,
            "bounds": self.bounds,
            "axes": [{"key": a.key, "section": a.section, "labels": list(a.labels)} for a in self.axes],
            "points": [{"point": p.index, "key": p.key, "axes": p.axes} for p in self.points],
        }


def _label(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _axis(source: str, section: str, key: Any, spec: Any) -> Axis:
    where = f"{source}: {section}.{key}"
    if not isinstance(key, str) or not _DOTTED.match(key):
        raise ConfigError(f"{source}: {section}: axis key {key!r} must be a dotted config key like engine.block_size")
    if key in ("name", "output_dir"):
        raise ConfigError(f"{where}: cannot be swept (every point shares the sweep's folder)")
    if isinstance(spec, dict):
        if not spec:
            raise ConfigError(f"{where}: needs at least one value")
        labels = tuple(str(k) for k in spec)
        values = tuple(spec.values())
    elif isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where}: needs at least one value")
        values = tuple(spec)
        labels = tuple(_label(v) for v in values)
    else:
        raise ConfigError(f"{where}: expected a list of values or a mapping of label: value, got {type(spec).__name__}")
    no_tier = [tier_axis_value(key, v) for v in values]  # a tier-size axis: null / none = no CPU tier
    if any(no_tier):
        values = tuple(None if nt else v for v, nt in zip(values, no_tier))
        if not isinstance(spec, dict):
            labels = tuple(nt[1] if nt else lb for lb, nt in zip(labels, no_tier))
    if len(set(map(repr, labels))) != len(labels):
        raise ConfigError(f"{where}: values must be distinct")
    return Axis(key, values, labels, section)


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: nested mappings merge, anything else replaces."""
    out = copy.deepcopy(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def point_key(cfg: ExperimentConfig, bounds: bool) -> str:
    """The point's identity: a hash of its resolved config (sorted JSON) and the bounds flag."""
    data = config_to_dict(cfg)
    data.pop("name", None)
    data.pop("output_dir", None)
    data.get("replay", {}).pop("progress", None)
    blob = json.dumps({"config": data, "bounds": bool(bounds), "format": KEY_FORMAT}, sort_keys=True,
                      separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _attribute(line: str, source: str, axes: list[Axis], point_desc: str, base_where: str,
               overrides: list[str] | None = None) -> str:
    """Rewrite one ``source: loc: problem`` line so that it names the sweep key responsible (an
    axis, else a ``--set`` override, else the base)."""
    prefix = f"{source}: "
    rest = line[len(prefix):] if line.startswith(prefix) else line
    loc, sep, problem = rest.partition(": ")
    if not sep:
        return f"{source}: {rest}"
    for a in sorted(axes, key=lambda a: -len(a.key)):
        if loc == a.key or loc.startswith(a.key + ".") or a.key.startswith(loc + "."):
            tail = loc[len(a.key):] if loc.startswith(a.key) else ""
            return f"{source}: {a.section}.{a.key}{tail}: {problem} ({point_desc})"
    blamed = blame_override(line, source, overrides or [])
    if blamed != line:
        return blamed
    return f"{base_where}{loc}: {problem}"


def load_sweep(path: str | Path, output_dir: str | None = None, overrides: list[str] | None = None) -> Sweep:
    """Read, expand and validate a sweep file (see the module docstring). ``overrides``
    (``key.path=value``, value parsed as YAML, like ``apcsim run --set``) change the base before the
    axes are applied."""
    path = Path(path)
    source = str(path)
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys")
    for k in data:
        if k not in SWEEP_KEYS:
            raise ConfigError(f"{source}: {k}: unknown key (a sweep has {', '.join(sorted(SWEEP_KEYS))})")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{source}: name: required, letters, digits, '_', '.', '-' only (got {name!r})")
    # --set output_dir=... / name=... address the sweep's own folder (the base experiment's are unused)
    folder_keys = dict(override_value(o) for o in overrides or () if o.partition("=")[0] in ("output_dir", "name"))
    name = folder_keys.get("name", name)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"--set name={name}: letters, digits, '_', '.', '-' only")
    out_dir = output_dir if output_dir is not None else folder_keys.get(
        "output_dir", data.get("output_dir", DEFAULT_OUTPUT_DIR))
    if not isinstance(out_dir, str):
        raise ConfigError(f"{source}: output_dir: expected a path, got {out_dir!r}")
    bounds = data.get("bounds", True)
    if not isinstance(bounds, bool):
        raise ConfigError(f"{source}: bounds: expected true or false, got {bounds!r}")
    keep_steps = data.get("keep_steps", False)
    if not isinstance(keep_steps, bool):
        raise ConfigError(f"{source}: keep_steps: expected true or false, got {keep_steps!r}")
    desc = data.get("description", "")
    if not isinstance(desc, str):
        raise ConfigError(f"{source}: description: expected text")

    # base: base_config file, then the inline mapping on top
    base: dict[str, Any] = {}
    base_dir = path.parent
    base_source = source
    base_where = f"{source}: base."
    if "base_config" in data:
        ref = data["base_config"]
        if not isinstance(ref, str):
            raise ConfigError(f"{source}: base_config: expected a path to an experiment file")
        bpath = Path(ref).expanduser()
        bpath = bpath if bpath.is_absolute() else path.parent / bpath
        if not bpath.is_file():
            raise ConfigError(f"{source}: base_config: no such file {bpath}")
        loaded = load_yaml(bpath)
        if not isinstance(loaded, dict):
            raise ConfigError(f"{bpath}: the top level must be a mapping of keys")
        base = loaded
        base_dir = bpath.parent
        base_where = f"{bpath}: "
    inline = data.get("base", {})
    if inline is None:
        inline = {}
    if not isinstance(inline, dict):
        raise ConfigError(f"{source}: base: expected an experiment mapping")
    if "base" in data and "base_config" in data:
        base_where = f"{source}: base (over {data['base_config']}): "
    elif "base_config" not in data and "base" not in data:
        raise ConfigError(f"{source}: base: required (an experiment mapping, or base_config: path)")
    base = deep_merge(base, inline)
    if overrides:
        base = apply_overrides(base, list(overrides))
    base["name"] = name  # points share the sweep's name; their folders are keyed by config hash
    base.pop("output_dir", None)

    # axes
    axes: list[Axis] = []
    grid = data.get("grid", {}) or {}
    if not isinstance(grid, dict):
        raise ConfigError(f"{source}: grid: expected a mapping of dotted.key: [values]")
    for k, spec in grid.items():
        axes.append(_axis(source, "grid", k, spec))
    zips = data.get("zip", []) or []
    if isinstance(zips, dict):
        zips = [zips]
    if not isinstance(zips, list) or not all(isinstance(z, dict) for z in zips):
        raise ConfigError(f"{source}: zip: expected a mapping of dotted.key: [values] (or a list of them)")
    zip_groups: list[list[Axis]] = []
    for gi, z in enumerate(zips):
        section = "zip" if len(zips) == 1 else f"zip[{gi}]"
        group = [_axis(source, section, k, spec) for k, spec in z.items()]
        if group:
            n = len(group[0].values)
            for a in group[1:]:
                if len(a.values) != n:
                    raise ConfigError(
                        f"{source}: {section}.{a.key}: has {len(a.values)} values but {section}.{group[0].key} "
                        f"has {n}; zipped axes need equal lengths"
                    )
            zip_groups.append(group)
            axes.extend(group)
    seen: set[str] = set()
    for a in axes:
        if a.key in seen:
            raise ConfigError(f"{source}: {a.section}.{a.key}: swept twice")
        seen.add(a.key)

    sweep = Sweep(name, path, out_dir, desc, bounds, axes, keep_steps=keep_steps, overrides=list(overrides or []))
    grid_axes = [a for a in axes if a.section == "grid"]
    dims: list[list[list[tuple[Axis, int]]]] = [[[(a, i)] for i in range(len(a.values))] for a in grid_axes]
    dims += [[[(a, i) for a in g] for i in range(len(g[0].values))] for g in zip_groups]
    problems: dict[str, None] = {}  # every problem line of every point, in order, each once
    bad = 0
    for index, combo in enumerate(itertools.product(*dims)):
        chosen = [pair for part in combo for pair in part]
        labels = {a.key: a.labels[i] for a, i in chosen}
        point_overrides = {a.key: a.values[i] for a, i in chosen}
        desc_pt = "point " + ", ".join(f"{k}={v}" for k, v in labels.items()) if labels else "the only point"
        try:
            cfg = _point_config(base, chosen, source, base_source, base_dir)
        except _AxisError as exc:
            bad += 1
            problems[f"{exc} ({desc_pt})"] = None
            continue
        except ConfigError as exc:
            bad += 1
            problems.update(dict.fromkeys(_attribute(ln, base_source, axes, desc_pt, base_where, overrides or [])
                                          for ln in str(exc).splitlines()))
            continue
        sweep.points.append(Point(index, labels, point_overrides, cfg, point_key(cfg, bounds)))
    if problems:
        lines = list(problems)
        if bad > 1:
            lines.append(f"{source}: {bad} of {bad + len(sweep.points)} points are invalid; nothing ran")
        raise ConfigError("\n".join(lines))
    return sweep


class _AxisError(ConfigError):
    """An axis value that cannot be set in the base config (named by the sweep key already)."""


def _point_config(base: dict[str, Any], chosen: list[tuple[Axis, int]], source: str, base_source: str,
                  base_dir: Path) -> ExperimentConfig:
    """One point's config: the base with its axis values set, validated, and its engine resolved
    (so that a pool too small for ``max_model_len`` stops the sweep before anything runs)."""
    cfg_data = copy.deepcopy(base)
    for a, i in sorted(chosen, key=lambda ai: ai[0].key.count(".")):
        try:
            set_dotted(cfg_data, a.key, a.values[i])
        except ConfigError as exc:
            raise _AxisError(f"{source}: {a.section}.{a.key}: {exc} in the base config") from None
    drop_absent_tier(cfg_data, [a.key for a, _ in chosen])  # no tier at this point: no tier keys either
    cfg = config_from_dict(cfg_data, base_source, base_dir, startup_checks=True)
    resolve(cfg)
    return cfg
