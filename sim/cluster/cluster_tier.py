"""A fleet's CPU offload tiers in its summary: the single engine's tier keys
(``sim.replay.tier_metrics.tier_summary``: vLLM 0.33.0's ``prompt_tokens_by_source``,
``external_prefix_cache``, the ``CPUOffloadingManager`` / ``OffloadingConnectorStats`` counters)
summed over replicas, and per replica (mirrors nothing in vLLM: each engine exports its own
metrics; a fleet dashboard sums them).

* one replica's figures: its incarnations' tiers (a fault drops the tier with the engine; the
  replica comes back with an empty one) -- counters summed, capacity, policy, link and usage the
  last incarnation's;
* the fleet's: the replicas' counters and capacities (``num_chunks``) summed, ``usage`` weighted
  by capacity, ``hit_rate_by_source`` and ``external_prefix_cache.hit_rate`` from the sums, and a
  setting the replicas share (policy, chunk size, link) kept, else ``"mixed"``;
* per-replica rows (``cluster.replicas``): flat ``gpu_hit_rate``, ``cpu_hit_rate`` and chunk
  counters, on tiered replicas only; in a mixed fleet the untiered replicas' requests have the tier
  columns too, with nothing loaded (``sim.cluster.cluster``).

Invariants: with one part the result is that part's dict itself (one tiered replica's summary
equals the single engine's, NaNs included); a fleet without tiers gets no key. Imports neither
simpy nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sim.core.offload.tier import OffloadTier
from sim.replay.kv_transfer import LinkKVWorker
from sim.replay.tier_metrics import tier_summary

_SETTINGS = ("policy", "blocks_per_chunk", "link_gb_s")  # a replica's own, not summed


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def _sum_dicts(parts: Sequence[dict[str, Any]], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in parts:
        for k, v in p.items():
            if k not in skip:
                out[k] = out.get(k, 0) + v
    return out


def _combine(parts: Sequence[dict[str, Any]], *, same_replica: bool) -> dict[str, Any]:
    if len(parts) == 1:
        return parts[0]
    src = _sum_dicts([p["prompt_tokens_by_source"] for p in parts])
    prompt = sum(src.values())
    ext = _sum_dicts([p["external_prefix_cache"] for p in parts], ("hit_rate",))
    ext["hit_rate"] = _ratio(ext["hits"], ext["queries"])
    cpus = [p["cpu_tier"] for p in parts]
    cpu = _sum_dicts(cpus, (*_SETTINGS, "num_chunks", "usage"))
    last = cpus[-1]
    if same_replica:
        cpu.update({k: last[k] for k in (*_SETTINGS, "num_chunks", "usage") if k in last})
    else:
        for k in _SETTINGS:
            values = {c[k] for c in cpus if k in c}
            if values:
                cpu[k] = values.pop() if len(values) == 1 else "mixed"
        chunks = sum(c["num_chunks"] for c in cpus)
        cpu["num_chunks"] = chunks
        cpu["usage"] = _ratio(sum(c["usage"] * c["num_chunks"] for c in cpus), chunks)
    return {
        "prompt_tokens_by_source": src,
        "hit_rate_by_source": {"gpu": _ratio(src["local_cache_hit"], prompt),
                               "cpu": _ratio(src["external_kv_transfer"], prompt)},
        "external_prefix_cache": ext,
        "cpu_tier": {k: cpu[k] for k in cpus[0] if k in cpu},  # the single engine's key order
    }


def replica_tier_summary(parts: Sequence[tuple[OffloadTier, LinkKVWorker | None]]) -> dict[str, Any]:
    """One replica's tier keys over its incarnations (empty without a tier)."""
    if not parts:
        return {}
    return _combine([tier_summary(t, w) for t, w in parts], same_replica=True)


def fleet_tier_summary(per_replica: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fleet's tier keys from each replica's (:func:`replica_tier_summary`; untiered ones are
    empty and skipped); empty when no replica has a tier."""
    parts = [p for p in per_replica if p]
    return _combine(parts, same_replica=False) if parts else {}


def tier_row(tier: dict[str, Any]) -> dict[str, Any]:
    """The flat per-replica figures a ``cluster.replicas`` row gains (empty without a tier)."""
    if not tier:
        return {}
    cpu = tier["cpu_tier"]
    return {
        "gpu_hit_rate": tier["hit_rate_by_source"]["gpu"], "cpu_hit_rate": tier["hit_rate_by_source"]["cpu"],
        "cpu_chunks_stored": cpu["chunks_stored"], "cpu_chunks_loaded": cpu["chunks_loaded"],
        "cpu_chunks_evicted": cpu["chunks_evicted"], "cpu_tier_usage": cpu["usage"],
    }
