"""What a replay with a CPU offload tier adds to its summary, in vLLM 0.33.0's metric terms.

* ``prompt_tokens_by_source`` -- ``vllm:prompt_tokens_by_source`` (``PrefillStats`` at each
  request's first admission, ``vllm/v1/core/sched/scheduler.py``): ``local_cache_hit`` (GPU prefix
  cache), ``external_kv_transfer`` (loaded from the CPU tier; the token recomputed after a
  full-prompt load still counts here) and ``local_compute`` (the rest);
* ``external_prefix_cache`` -- ``vllm:external_prefix_cache_queries/hits``
  (``Scheduler.connector_prefix_cache_stats``): per admission with a GPU miss, the tokens the
  connector was asked for and found; re-admissions under ``preempted_*``;
* ``cpu_tier`` -- the CPU tier's counters (``CPUOffloadingManager`` and the connector's
  ``OffloadingConnectorStats``): chunks stored, loaded and evicted, allocation failures, deferred
  lookups, its capacity and final usage, and what crossed the link (bytes, transfers, the seconds
  forwards waited for flushed stores);
* ``hit_rate_by_source`` -- the first admissions' hit tokens over their prompt tokens, per tier.

Invariant: a replay without a tier adds none of these keys. Imports neither simpy nor torch.
"""

from __future__ import annotations

from typing import Any

from sim.core.offload.tier import OffloadTier
from sim.replay.kv_transfer import LinkKVWorker


def tier_summary(tier: OffloadTier, worker: LinkKVWorker | None) -> dict[str, Any]:
    """The summary keys of a tiered replay (see the module docstring)."""
    local, external, computed = tier.prompt_tokens_local_hit, tier.prompt_tokens_external, tier.prompt_tokens_computed
    prompt = local + external + computed
    ext = tier.external_prefix_cache_stats
    conn = tier.connector
    mgr = conn.manager
    m = mgr.stats
    cpu: dict[str, Any] = {
        "policy": conn.config.policy,
        "num_chunks": conn.config.num_cpu_chunks,
        "blocks_per_chunk": conn.blocks_per_chunk,
        "chunks_stored": m.chunks_stored,
        "chunks_loaded": m.chunks_loaded,
        "chunks_evicted": m.chunks_evicted,
        "stores_skipped": m.stores_skipped,
        "allocation_failures": conn.stats.allocation_failures,
        "deferred_lookups": conn.stats.deferred_lookups,
        "load_jobs": conn.stats.load_jobs,
        "store_jobs": conn.stats.store_jobs,
        "usage": mgr.usage(),
    }
    if worker is not None:
        cpu.update(load_bytes=worker.load_bytes, store_bytes=worker.store_bytes,
                   link_gb_s=worker.link.bandwidth_gb_s, flush_wait_s=worker.flush_wait_s)
    return {
        "prompt_tokens_by_source": {"local_cache_hit": local, "external_kv_transfer": external,
                                    "local_compute": computed},
        "hit_rate_by_source": {"gpu": local / prompt if prompt else float("nan"),
                               "cpu": external / prompt if prompt else float("nan")},
        "external_prefix_cache": {
            "queries": ext.queries, "hits": ext.hits, "requests": ext.requests,
            "preempted_queries": ext.preempted_queries, "preempted_hits": ext.preempted_hits,
            "preempted_requests": ext.preempted_requests,
            "hit_rate": ext.hits / ext.queries if ext.queries else float("nan"),
        },
        "cpu_tier": cpu,
    }
