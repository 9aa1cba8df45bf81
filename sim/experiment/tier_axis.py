"""The CPU offload tier as a sweep axis (mirrors nothing in vLLM: a sweep is apcsim's own; the tier
is vLLM 0.33.0's native offloading, resolved by :mod:`sim.experiment.offload_tier`).

* **No tier on an axis.** ``engine.kv_offloading_size`` and ``engine.num_cpu_blocks`` take ``null``
  (or the word ``none``) for a point without a CPU tier, as vLLM runs without
  ``--kv-offloading-size``: ``grid: {engine.kv_offloading_size: [none, 8, 32, 128]}``. The value is
  ``None`` and the table label is ``"none"`` (:func:`tier_axis_value`).
* **Tier keys of an absent tier are dropped.** At a point where a swept size is ``None`` and no
  other size is set, the tier's other keys (``kv_offloading_policy``, ``kv_offloading_block_size``,
  ``offload_prompt_only``, ``store_threshold``, ``offload_bandwidth_gb_s``; from an axis or the base)
  are removed (:func:`drop_absent_tier`): ``size x policy`` grids then hold one untiered config,
  run once (equal configs get equal point keys) and shown under every policy.
* **Row facts.** A tiered point's row carries the resolved tier (:func:`tier_facts`):
  ``num_cpu_chunks``, ``cpu_tier_gib`` (chunks x page-aligned chunk bytes, as vLLM sizes it),
  ``cpu_tier_capacity_tokens``, ``cpu_tier_policy``; an untiered row gets none of these keys (its
  row is the same as before the tier existed).

Invariants: a sweep without a tier-size axis is untouched (the normal validation applies, so a
policy axis with no tier anywhere is still an error); imports neither simpy nor torch.
"""

from __future__ import annotations

from typing import Any

from sim.experiment.engine_description import EngineDescription
from sim.experiment.offload_tier import TIER_KEYS

SIZE_KEYS = ("engine.kv_offloading_size", "engine.num_cpu_blocks")
"""The axes that size the tier (one of them per point, as ``offload_tier`` requires)."""
NONE_WORDS = ("none", "None", "off")
"""Strings an axis may use for "no tier" besides YAML's ``null``."""
NO_TIER_LABEL = "none"


def tier_axis_value(key: str, value: Any) -> tuple[Any, Any] | None:
    """``(value, label)`` of a "no tier" value of a tier-size axis, else None (not a tier-size axis,
    or a size)."""
    if key in SIZE_KEYS and (value is None or (isinstance(value, str) and value in NONE_WORDS)):
        return None, NO_TIER_LABEL
    return None


def drop_absent_tier(cfg_data: dict[str, Any], axis_keys: list[str]) -> None:
    """When a tier-size axis of this point is ``None`` and no size is left, remove the tier's other
    engine keys from ``cfg_data`` (in place): the point is the untiered engine."""
    if not any(k in SIZE_KEYS for k in axis_keys):
        return
    engine = cfg_data.get("engine")
    if not isinstance(engine, dict):
        return
    if any(engine.get(k.split(".", 1)[1]) is not None for k in SIZE_KEYS):
        return
    for k in TIER_KEYS:
        engine.pop(k, None)


def tier_facts(engine: EngineDescription) -> dict[str, Any]:
    """The resolved tier's size as row columns; ``{}`` without a tier."""
    tier = engine.offload
    if tier is None:
        return {}
    return {
        "num_cpu_chunks": tier.num_cpu_chunks,
        "cpu_tier_gib": engine.cpu_tier_gib,
        "cpu_tier_capacity_tokens": engine.cpu_tier_capacity_tokens,
        "cpu_tier_policy": tier.policy,
    }
