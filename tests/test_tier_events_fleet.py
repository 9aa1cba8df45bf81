"""A fleet whose replicas have CPU tiers: their ``medium="CPU"`` KV events travel the pipeline to
the precise routers, which index them as the real ones do (``sim.cluster.tier_index``)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from sim.cluster.cluster import ClusterReplay, ClusterResult
from sim.cluster.kv_view import EventCacheView
from sim.core.hashing import external_block_hash
from sim.experiment.cluster_run import build_router, replica_specs
from sim.experiment.config import ExperimentConfig, config_from_dict
from sim.experiment.run import build_latency, simulated_executor
from workloads.trace_format import TraceRequest


def _cfg(router: Mapping[str, object], **engine: object) -> ExperimentConfig:
    return config_from_dict({
        "name": "t", "engine": {"block_size": 16, "num_gpu_blocks": 120, "max_model_len": 1024,
                                "num_cpu_blocks": 250, "vllm_version": "0.33.0", **engine},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 10},
        "cluster": {"replicas": 2, "router": dict(router)},
    })


def _stream() -> list[TraceRequest]:
    """Twelve 400-token documents asked about in turns: a replica's 120 GPU blocks hold about four,
    so a returning document is often on its CPU tier only."""
    rng = np.random.default_rng(4)
    docs = [np.arange(d * 10_000, d * 10_000 + 400) for d in range(12)]
    out = []
    for i in range(160):
        d = int(rng.integers(12))
        q = np.arange(500_000 + 40 * i, 500_000 + 40 * i + 40)
        out.append(TraceRequest(f"r{i}", 0.02 * i, np.concatenate([docs[d], q]), 4))
    return out


def _replay(router: Mapping[str, object], *, gpu_only_view: bool = False,
            **engine: object) -> tuple[ClusterReplay, ClusterResult]:
    cfg = _cfg(router, **engine)
    specs, _ = replica_specs(cfg, simulated_executor, build_latency)
    r, info = build_router(cfg)
    replay = ClusterReplay(specs, r, _stream(), router_info=info)
    if gpu_only_view:  # the same router reading GPU events only
        r.events = EventCacheView(replay.facts)  # type: ignore[attr-defined]
    return replay, replay.run()


def test_cpu_events_reach_the_router_index_of_their_replica() -> None:
    # Mooncake's rule keeps every CPU store: once every batch is delivered, the router's CPU index
    # of a replica is exactly the chunks resident in that replica's tier (one block per chunk)
    replay, res = _replay({"kind": "mooncake"})
    assert replay.pipeline is not None
    replay.pipeline.deliver_until(math.inf)
    tiers = replay.router.events.tiers  # type: ignore[attr-defined]
    assert tiers is not None
    for i, rep in enumerate(replay.replicas):
        tier = rep.scheduler.tier
        assert tier is not None and tier.connector.manager.stats.chunks_evicted > 0
        resident = {external_block_hash(k) for k in tier.connector.manager.policy.keys()}
        assert tiers.cpu.held[i] == resident
        assert res.replicas[i].summary["prompt_tokens_by_source"]["external_kv_transfer"] > 0


def test_llm_d_routes_on_cpu_blocks() -> None:
    router = {"kind": "llm_d", "prefix": "precise"}
    replay, tiered = _replay(router)
    assert replay.router.events.tiers is not None  # type: ignore[attr-defined]
    assert sum(replay.router.events.tiers.cpu.num_entries(i) for i in range(2)) > 0  # type: ignore[attr-defined]
    _, gpu_only = _replay(router, gpu_only_view=True)
    assert (tiered.requests["replica"] != gpu_only.requests["replica"]).any()  # the CPU tier changed decisions
    # the router believes the CPU blocks it scored: a request it believed to hit more than its GPU
    # prefix got the difference from the CPU tier
    rq = tiered.requests
    assert ((rq["believed_hit_tokens"] > rq["hit_tokens"]) & (rq["external_hit_tokens"] > 0)).any()


def test_dynamo_credits_the_cpu_tier_only_with_self_describing_events() -> None:
    # vLLM's default placeholders name no tokens: Dynamo's lower tier stays empty and the routing is
    # the GPU-only one; engine.self_describing_kv_events fills it and changes decisions
    router = {"kind": "dynamo"}
    replay, placeholder = _replay(router)
    tiers = replay.router.events.tiers  # type: ignore[attr-defined]
    assert tiers is not None and all(tiers.cpu.num_entries(i) == 0 for i in range(2))
    _, gpu_only = _replay(router, gpu_only_view=True)
    assert (placeholder.requests["replica"] == gpu_only.requests["replica"]).all()
    replay, described = _replay(router, self_describing_kv_events=True)
    tiers = replay.router.events.tiers  # type: ignore[attr-defined]
    assert sum(tiers.cpu.num_entries(i) for i in range(2)) > 0
    assert (described.requests["replica"] != gpu_only.requests["replica"]).any()


def test_the_tier_weights_come_from_the_router_config() -> None:
    cfg = _cfg({"kind": "llm_d", "tier_weights": {"gpu": 1.0, "cpu": 0.5}})
    r, info = build_router(cfg)
    assert r.tier_weights == (1.0, 0.5) and info["tier_weights"] == {"gpu": 1.0, "cpu": 0.5}  # type: ignore[attr-defined]
    r, _ = build_router(_cfg({"kind": "dynamo", "host_cache_hit_weight": 0.25}))
    assert r.host_cache_hit_weight == 0.25  # type: ignore[attr-defined]
