"""Properties of a fleet with a shared KV store (sim.cluster.kv_store) on random streams: every
request finishes, the engines' and the store's invariants hold after every step (integrity checks
on), the miss causes add up on every request with the store's loads as a hit source, the tokens the
requests loaded are the blocks the store lent out, and a store too small to hold one prompt still
replays (it evicts, or refuses stores)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.cluster import ClusterReplay
from sim.experiment.cluster_run import build_router, replica_specs
from sim.experiment.cluster_store import build_store
from sim.experiment.config import config_from_dict
from sim.experiment.engine_description import resolve
from sim.experiment.run import build_latency, simulated_executor
from sim.replay.attribution_records import check_attribution
from workloads.trace_format import TraceRequest

BS = 16


@st.composite
def streams(draw: st.DrawFn) -> list[TraceRequest]:
    """Requests over a few shared prefixes (so the store has something to serve), in arrival order."""
    prefixes = [np.arange(k * 10_000, k * 10_000 + draw(st.integers(1, 8)) * BS) for k in range(3)]
    out, t = [], 0.0
    for i in range(draw(st.integers(2, 14))):
        t += draw(st.sampled_from([0.0, 0.002, 0.02, 0.2]))
        head = prefixes[draw(st.integers(0, 2))]
        tail = np.arange(500_000 + i * 1000, 500_000 + i * 1000 + draw(st.integers(1, 40)))
        out.append(TraceRequest(f"r{i}", t, np.concatenate([head, tail]), draw(st.integers(1, 6))))
    return out


@settings(max_examples=25, deadline=None)
@given(stream=streams(), replicas=st.integers(2, 3), capacity=st.sampled_from([2, 6, 40, 400]),
       router=st.sampled_from(["round_robin", "random", "oracle", "mooncake_global"]),
       write_gb_s=st.sampled_from([0.005, 1.0, 100.0]), policy=st.sampled_from(["lru", "arc"]))
def test_a_store_fleet_keeps_its_invariants(stream: list[TraceRequest], replicas: int, capacity: int, router: str,
                                            write_gb_s: float, policy: str) -> None:
    rc = {"kind": "mooncake", "scope": "global"} if router == "mooncake_global" else {"kind": router}
    cfg = config_from_dict({
        "name": "p", "engine": {"block_size": BS, "num_gpu_blocks": 64, "max_model_len": 512, "vllm_version": "0.33.0"},
        "latency": {"kind": "fixed", "step_time_s": 0.01},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 1},
        "cluster": {"replicas": replicas, "router": rc,
                    "kv_store": {"capacity_blocks": capacity, "policy": policy, "read_gb_s": 2.0,
                                 "write_gb_s": write_gb_s}},
    })
    store = build_store(cfg, [resolve(cfg)] * replicas)
    assert store is not None
    specs, _ = replica_specs(cfg, simulated_executor, build_latency, store)
    r, info = build_router(cfg)
    if hasattr(r, "store"):
        r.store = store.spec
    res = ClusterReplay(specs, r, stream, router_info=info, integrity_check=True, kv_store=store,
                        attribution="summary").run()
    rq = res.requests
    assert len(rq) == len(stream) and rq["finish"].notna().all()
    check_attribution(rq)
    readmits = sum(int(x) for cell in rq["readmit_external_hit_tokens"] for x in str(cell).split(";") if x)
    loaded = int(rq["remote_hit_tokens"].sum()) + readmits  # (re-admissions' hits are ;-joined)
    assert loaded == res.summary["kv_store"]["blocks_loaded"] * BS
    assert res.summary["miss_attribution_hits"]["remote_hit"] == int(rq["remote_hit_tokens"].sum())
    assert (rq["remote_hit_tokens"] + rq["hit_tokens"] <= rq["prompt_tokens"]).all()
    store.check_integrity()
    assert store.manager.num_write_pending == 0  # every write landed before the replay ended
