"""A disaggregated replay from a config, and the plain fleet it is compared with on the same routing
(the P/D tests with a shared store or per-replica CPU tiers): the prefill pool's replicas alone,
every request sent to the replica the P/D run prefilled it on, with one output token (the prefill
leg's ``max_tokens = 1``). Each fleet gets its own store when its config has one."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from test_disagg import _Fixed

from sim.cluster.cluster import ClusterReplay, ClusterResult
from sim.cluster.disagg import DisaggSpec, PDClusterReplay
from sim.cluster.disagg_router import PDRouter
from sim.experiment.cluster_run import build_router, replica_specs
from sim.experiment.cluster_store import build_store
from sim.experiment.config import ExperimentConfig
from sim.experiment.engine_description import resolve
from sim.experiment.run import build_latency, simulated_executor
from workloads.trace_format import TraceRequest


def shared_prefix_stream(n: int, groups: int, gap: float = 0.02, out: int = 2, seed: int = 3) -> list[TraceRequest]:
    """``n`` requests over ``groups`` prefixes of 320 tokens (20 blocks), with random tails."""
    rng = np.random.default_rng(seed)
    prefixes = [np.arange(g * 10_000, g * 10_000 + 320) for g in range(groups)]
    return [TraceRequest(f"r{i}", i * gap, np.concatenate(
        [prefixes[i % groups], rng.integers(1_000_000, 2_000_000, size=int(rng.integers(8, 60)))]), out)
        for i in range(n)]


def replay_pd(cfg: ExperimentConfig, requests: list[TraceRequest], link_gb_s: float = math.inf,
              attribution: str = "off") -> ClusterResult:
    """``cfg``'s fleet (its ``cluster.disaggregation`` pools, its store if any) over ``requests``,
    with a link of ``link_gb_s``, integrity checks on (with ``attribution``: each request's causes
    checked to add up)."""
    assert cfg.cluster is not None and cfg.cluster.disaggregation is not None
    pools = cfg.cluster.disaggregation
    n = pools.prefill + pools.decode
    store = build_store(cfg, [resolve(cfg)] * n)
    specs, _ = replica_specs(cfg, simulated_executor, build_latency, store)
    p, info = build_router(cfg)
    d, _ = build_router(cfg)
    router = PDRouter(p.name, p, d, range(pools.prefill), range(pools.prefill, n), 0)
    spec = DisaggSpec(pools.prefill, pools.decode, link_gb_s, 0.0, (131_072,) * n)
    return PDClusterReplay(specs, router, requests, disagg=spec, router_info=info, integrity_check=True,
                           kv_store=store, attribution=attribution).run()


def replay_same_routing(plain: ExperimentConfig, pd_requests: pd.DataFrame,
                        requests: list[TraceRequest]) -> ClusterResult:
    """The plain fleet of ``plain`` (the prefill pool's replicas), each request routed where the P/D
    run (``pd_requests``) prefilled it, with one output token."""
    assert plain.cluster is not None
    store = build_store(plain, [resolve(plain)] * plain.cluster.num_replicas)
    specs, _ = replica_specs(plain, simulated_executor, build_latency, store)
    table = {str(rid): int(x) for rid, x in zip(pd_requests["request_id"], pd_requests["prefill_replica"], strict=True)}
    one_token = [TraceRequest(r.id, r.arrival, r.tokens, 1) for r in requests]
    return ClusterReplay(specs, _Fixed(table), one_token, integrity_check=True, kv_store=store).run()
