"""Properties of a disaggregated fleet behind a shared store or per-replica CPU tiers, over random
streams, pool splits, routers, links, store sizes and ``writers``: every request is served once,
prefill -> read -> decode, the whole prompt read and one token recomputed; the engines' pools and
connectors stay consistent after every step (integrity checks on); the miss causes add up on every
request with the store's (or the tier's) loads as a hit source; and with ``writers: prefill`` no
decode replica reaches the store."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pd_same_routing import replay_pd
from test_disagg_properties import streams

from sim.experiment.config import ExperimentConfig, config_from_dict
from workloads.trace_format import TraceRequest


def _cfg(router: str, prefill: int, decode: int, blocks: int, store: dict[str, Any] | None,
         tier: int | None) -> ExperimentConfig:
    engine: dict[str, Any] = {"block_size": 16, "num_gpu_blocks": blocks, "max_model_len": 512,
                              "vllm_version": "0.33.0"}
    if tier is not None:
        engine.update(num_cpu_blocks=tier, offload_bandwidth_gb_s=2.0)
    cluster: dict[str, Any] = {"replicas": prefill + decode, "router": router,
                               "disaggregation": {"prefill": prefill, "decode": decode, "link_gb_s": 25.0}}
    if store is not None:
        cluster["kv_store"] = store
    return config_from_dict({"name": "t", "engine": engine, "workload": {"kind": "synthetic_shared_prefix"},
                             "cluster": cluster})


@settings(max_examples=40, deadline=None)
@given(reqs=streams(), router=st.sampled_from(["dynamo", "round_robin"]), prefill=st.integers(1, 3),
       decode=st.integers(1, 2), link=st.sampled_from([float("inf"), 0.5, 50.0]), blocks=st.sampled_from([48, 400]),
       capacity=st.sampled_from([3, 40, 2000]), writers=st.sampled_from(["prefill", "all"]),
       kind=st.sampled_from(["store", "tier"]))
def test_a_pd_fleet_with_a_store_or_tiers_keeps_its_invariants(
        reqs: list[TraceRequest], router: str, prefill: int, decode: int, link: float, blocks: int, capacity: int,
        writers: str, kind: str) -> None:
    store = {"capacity_blocks": capacity, "read_gb_s": 1.0, "write_gb_s": 1.0, "writers": writers}
    cfg = _cfg(router, prefill, decode, blocks, store if kind == "store" else None,
               capacity if kind == "tier" else None)
    res = replay_pd(cfg, reqs, link, attribution="summary")  # (checks the pools and the causes)
    rq = res.requests
    assert sorted(rq["request_id"]) == sorted(r.id for r in reqs)
    assert rq["prefill_replica"].between(0, prefill - 1).all()
    assert rq["decode_replica"].between(prefill, prefill + decode - 1).all()
    assert (rq["prompt_tokens"] - rq["decode_hit_tokens"] == 1).all()
    assert (rq["first_token"] > rq["kv_arrival"]).all() and (rq["kv_wait_s"] >= 0).all()
    rows = {r["replica"]: r for r in res.summary["cluster"]["replicas"]}
    if kind == "store" and writers == "prefill":
        assert all("store_store_bytes" not in rows[d] for d in range(prefill, prefill + decode))
    if kind == "store":
        assert res.summary["kv_store"]["resident_blocks"] <= capacity
