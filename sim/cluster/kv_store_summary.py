"""A fleet's shared KV store in its tables and summary (mirrors vLLM 0.33.0's metric names where one
exists: ``vllm:prompt_tokens_by_source``, ``external_prefix_cache_queries/hits``; the store block is
the store's own dashboard).

Every replica's engine runs the CPU tier's connector against the store (``sim.cluster.kv_store``),
so ``sim.replay.tier_metrics.tier_summary`` gives each replica's figures; of them, the connector's and
the link's (jobs, bytes, flush waits, deferred lookups) are the replica's own, while the manager's
(blocks stored, loaded, evicted, usage) are the store's -- the same on every replica, so they are
reported once, in the fleet's ``kv_store`` block, never summed:

* per replica (its summary and its ``cluster.replicas`` row): ``prompt_tokens_by_source``
  (``external_kv_transfer``: loaded from the store), ``hit_rate_by_source`` with ``gpu`` and
  ``remote``, ``external_prefix_cache``, and ``kv_store_link`` (its link's counters);
* the fleet: the same keys summed (rates from the sums), and ``kv_store``: capacity, policy, the
  links' settings, the manager's counters and usage, and the links' counters summed;
* ``requests.remote_hit_tokens``: the tokens a request's first admission loaded from the store
  (the tier's ``external_hit_tokens``).

Invariant: the fleet's ``prompt_tokens_by_source`` sums to its prompt tokens; a replica that never
ran a request has no keys (its requests none). Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from sim.cluster.kv_store import KVStore
from sim.replay.engine import ReplayResult

LINK_KEYS = ("load_jobs", "store_jobs", "load_bytes", "store_bytes", "flush_wait_s", "deferred_lookups",
             "allocation_failures")
"""A replica's own counters of its connector and its link to the store."""
REMOTE_HIT_COLUMN = "remote_hit_tokens"


def _to_store_keys(summary: dict[str, Any]) -> dict[str, Any]:
    """Changes ``summary`` (a tier summary's keys: ``sim.replay.tier_metrics``): the rate of the
    ``cpu`` source is ``remote``'s, and ``cpu_tier`` leaves; returns its link counters."""
    rates = summary["hit_rate_by_source"]
    summary["hit_rate_by_source"] = {"gpu": rates["gpu"], "remote": rates["cpu"]}
    cpu = summary.pop("cpu_tier")
    return {k: cpu[k] for k in LINK_KEYS}


def store_block(store: KVStore, links: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fleet's ``kv_store`` block: settings, the manager's counters, the links' summed."""
    s, m = store.spec, store.manager
    return {
        "policy": s.policy, "num_blocks": s.num_blocks, "read_gb_s": s.read_gb_s, "write_gb_s": s.write_gb_s,
        "latency_s": s.latency_s, "writers": s.writers,
        "blocks_stored": m.stats.chunks_stored, "blocks_loaded": m.stats.chunks_loaded,
        "blocks_evicted": m.stats.chunks_evicted, "resident_blocks": m.num_resident(), "usage": m.usage(),
        **{k: sum(link[k] for link in links) for k in LINK_KEYS},
    }


def apply_store(result: ReplayResult, replicas: Sequence[ReplayResult], store: KVStore) -> None:
    """Changes the fleet's ``result`` and its ``replicas``' results: their tier keys (computed as for
    per-replica CPU tiers) become the store's (see the module docstring)."""
    links = []
    for rep, row in zip(replicas, result.summary["cluster"]["replicas"], strict=True):
        rep.request_table = with_remote_column(rep.requests)
        if "cpu_tier" not in rep.summary:  # a replica that never ran a request
            continue
        link = rep.summary["kv_store_link"] = _to_store_keys(rep.summary)
        links.append(link)
        for k in [k for k in row if k.startswith("cpu_")]:
            del row[k]
        row.update(remote_hit_rate=rep.summary["hit_rate_by_source"]["remote"],
                   store_load_bytes=link["load_bytes"], store_store_bytes=link["store_bytes"])
    result.request_table = with_remote_column(result.requests)
    if "cpu_tier" in result.summary:
        _to_store_keys(result.summary)
        result.summary["kv_store"] = store_block(store, links)


def with_remote_column(requests: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with :data:`REMOTE_HIT_COLUMN` (the store's hit of each first admission)."""
    if "external_hit_tokens" not in requests or REMOTE_HIT_COLUMN in requests:
        return requests
    return requests.assign(**{REMOTE_HIT_COLUMN: requests["external_hit_tokens"]})
