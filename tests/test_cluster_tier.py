"""A fleet whose replicas have vLLM 0.33.0's CPU offload tier (sim.cluster.cluster_tier): one
tiered replica equals the single tiered engine table for table and key for key; a fleet's tier
keys are its replicas' summed; a replica restarted by a fault comes back with an empty tier; an
untiered fleet gets no tier key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fleet_of_one import assert_fleet_of_one_equals_single

from sim.cluster.cluster import ClusterReplay, ClusterResult, Fault
from sim.experiment.cluster_run import build_router, replica_specs
from sim.experiment.config import ExperimentConfig, config_from_dict, load_config
from sim.experiment.run import build_latency, replay_experiment, simulated_executor
from workloads.trace_format import TraceRequest

ROOT = Path(__file__).resolve().parents[1]
TIER_KEYS = ("prompt_tokens_by_source", "hit_rate_by_source", "external_prefix_cache", "cpu_tier")
TIER_COLUMNS = ["external_hit_tokens", "readmit_external_hit_tokens", "kv_wait_steps"]
# a GPU pool small enough to evict and a CPU tier that serves the evicted prefixes back
TIERED = ("workload.limit=150", "engine.max_model_len=8192", "engine.num_gpu_blocks=600",
          "engine.num_cpu_blocks=1000")


def _cfg(*overrides: str) -> ExperimentConfig:
    return load_config(ROOT / "configs/chat_synthetic.yaml", list(overrides))


def _fleet(*overrides: str) -> ClusterResult:
    result, _ = replay_experiment(_cfg(*overrides), progress=False)
    assert isinstance(result, ClusterResult)
    return result


@pytest.mark.parametrize("extra", [(), ("engine.async_scheduling=true", "engine.kv_offloading_policy=arc")])
def test_one_tiered_replica_equals_the_single_tiered_engine(extra: tuple[str, ...]) -> None:
    single, _ = replay_experiment(_cfg(*TIERED, *extra), progress=False)
    assert single.summary["prompt_tokens_by_source"]["external_kv_transfer"] > 0  # the tier serves hits
    assert single.summary["cpu_tier"]["chunks_evicted"] > 0
    for router in ("round_robin", "dynamo", "sglang"):
        cl = _fleet(*TIERED, *extra, "cluster.replicas=1", f"cluster.router={router}")
        assert_fleet_of_one_equals_single(single, cl, router)
        row = cl.summary["cluster"]["replicas"][0]
        assert row["cpu_hit_rate"] == single.summary["hit_rate_by_source"]["cpu"]
        assert row["cpu_chunks_stored"] == single.summary["cpu_tier"]["chunks_stored"]


def test_a_tiered_fleet_sums_its_replicas() -> None:
    cl = _fleet(*TIERED, "cluster.replicas=3", "cluster.router=round_robin")
    s = cl.summary
    assert set(TIER_COLUMNS) <= set(cl.requests.columns)
    assert int(cl.requests["external_hit_tokens"].sum()) == s["prompt_tokens_by_source"]["external_kv_transfer"]
    per = [r.summary for r in cl.replicas]
    for key in ("local_cache_hit", "external_kv_transfer", "local_compute"):
        assert s["prompt_tokens_by_source"][key] == sum(p["prompt_tokens_by_source"][key] for p in per)
    src = s["prompt_tokens_by_source"]
    assert s["hit_rate_by_source"]["cpu"] == src["external_kv_transfer"] / sum(src.values())
    for key in ("chunks_stored", "chunks_loaded", "chunks_evicted", "num_chunks", "store_bytes", "load_jobs"):
        assert s["cpu_tier"][key] == sum(p["cpu_tier"][key] for p in per), key
    assert s["cpu_tier"]["policy"] == "lru" and s["cpu_tier"]["num_chunks"] == 3 * 1000
    assert s["external_prefix_cache"]["hits"] == sum(p["external_prefix_cache"]["hits"] for p in per)
    rows = s["cluster"]["replicas"]
    assert [r["cpu_chunks_loaded"] for r in rows] == [p["cpu_tier"]["chunks_loaded"] for p in per]


def _small_cfg(replicas: int, cpu_blocks: int | None) -> ExperimentConfig:
    engine: dict[str, object] = {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048}
    if cpu_blocks is not None:
        engine.update(num_cpu_blocks=cpu_blocks, vllm_version="0.33.0")
    return config_from_dict({
        "name": "t", "engine": engine, "workload": {"kind": "synthetic_shared_prefix", "num_requests": 10},
        "cluster": {"replicas": replicas, "router": "round_robin"},
    })


def _replay(cfg: ExperimentConfig, requests: list[TraceRequest], **kw: Any) -> tuple[ClusterReplay, ClusterResult]:
    specs, _ = replica_specs(cfg, simulated_executor, build_latency)
    router, info = build_router(cfg)
    replay = ClusterReplay(specs, router, requests, router_info=info, integrity_check=True, **kw)
    return replay, replay.run()


def test_a_restarted_replica_gets_a_fresh_tier() -> None:
    stream = [TraceRequest(f"r{i}", i * 0.01, np.arange(i * 1000, i * 1000 + 200), 200) for i in range(40)]
    replay, res = _replay(_small_cfg(3, 2000), stream, faults=[Fault(1, 0.2, 0.5)])
    assert len(res.requests) == 40 and res.requests["finish"].notna().all()
    parts = replay.replicas[1].tier_parts
    assert len(parts) == 2 and parts[0][0] is not parts[1][0] and parts[0][1] is not parts[1][1]
    assert replay.replicas[1].scheduler.tier is parts[1][0]
    stored = [t.connector.manager.stats.chunks_stored for t, _ in parts]
    assert res.replicas[1].summary["cpu_tier"]["chunks_stored"] == sum(stored)
    assert res.summary["cpu_tier"]["num_chunks"] == 3 * 2000  # capacity per replica, not per incarnation


def test_an_untiered_fleet_has_no_tier_key_or_column() -> None:
    stream = [TraceRequest(f"r{i}", i * 0.01, np.arange(i * 1000, i * 1000 + 200), 8) for i in range(12)]
    replay, res = _replay(_small_cfg(3, None), stream)
    assert not any(k in res.summary for k in TIER_KEYS)
    assert not any(k in r.summary for r in res.replicas for k in TIER_KEYS)
    assert not set(TIER_COLUMNS) & set(res.requests.columns)
    assert "cpu_hit_rate" not in res.summary["cluster"]["replicas"][0]
    assert all(not r.tier_parts for r in replay.replicas)


def test_a_mixed_fleet_sums_its_tiered_replicas_only() -> None:
    cfg = config_from_dict({
        "name": "t", "engine": {"block_size": 16, "num_gpu_blocks": 600, "max_model_len": 8192},
        "workload": {"kind": "chat", "sessions": 30},
        "cluster": {"replicas": [{"count": 1, "engine": {"num_cpu_blocks": 1000}}, {"count": 2}],
                    "router": "round_robin"},
    })
    result, _ = replay_experiment(cfg, progress=False)
    assert isinstance(result, ClusterResult)
    rq = result.requests
    assert rq["external_hit_tokens"].dtype == "int64" and rq["kv_wait_steps"].dtype == "int64"
    assert (rq.loc[rq["replica"] != 0, "external_hit_tokens"] == 0).all()
    assert result.summary["cpu_tier"] == result.replicas[0].summary["cpu_tier"]  # one tiered replica: its own
    assert all("cpu_tier" not in r.summary for r in result.replicas[1:])
    rows = result.summary["cluster"]["replicas"]
    assert "cpu_hit_rate" in rows[0] and "cpu_hit_rate" not in rows[1]
