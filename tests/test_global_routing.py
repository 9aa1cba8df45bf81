"""Global cache-aware routing (issue 34 item 4): Mooncake's Conductor with ``scope: global`` counts
the shared store's blocks after each replica's GPU prefix, priced with the replica's store link; the
oracle reads the store itself. One rule per test (sim.cluster.global_router, sim.cluster.ttft_routers)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from idle_fleet_view import BS, IdleFleetView

from sim.cluster.global_router import GlobalMooncakeRouter
from sim.cluster.kv_store import MEDIUM_STORE, StoreSpec
from sim.cluster.router import RouterRequest
from sim.cluster.ttft_routers import MooncakeRouter, prefill_time, store_load_time
from sim.core.kv_events import BlockRemoved, BlockStored
from sim.experiment.config import config_from_dict
from sim.experiment.run import replay_experiment
from workloads.trace_format import TraceRequest

STORE = StoreSpec(1000, read_gb_s=1.0, latency_s=0.002, kv_bytes_per_block=2**20, block_size=BS)


def _setup(router: MooncakeRouter, store: StoreSpec | None = STORE) -> tuple[RouterRequest, list[int]]:
    router.store = store
    router.attach(IdleFleetView(2))
    req = RouterRequest(TraceRequest("q", 0.0, np.arange(4 * BS + 1, dtype=np.int64), 4), 0)
    return req, req.hashes(router.events.group_of[0])


def gpu(hashes: Sequence[int]) -> BlockStored:
    return BlockStored(list(hashes), None, list(range(BS * len(hashes))), BS, None)


def stored(hashes: Sequence[int]) -> BlockStored:
    return BlockStored(list(hashes), None, [], 0, None, medium=MEDIUM_STORE, group_idx=0)


def test_store_load_time_is_latency_plus_bytes_over_read_bandwidth() -> None:
    assert store_load_time(STORE, 0) == 0.0
    assert store_load_time(STORE, 3) == pytest.approx(0.002 + 3 * 2**20 / 1e9)


def test_global_counts_the_stores_blocks_a_local_router_cannot_see() -> None:
    for router, believed in ((GlobalMooncakeRouter(0), 3 * BS), (MooncakeRouter(0), 0)):
        req, h = _setup(router)
        router.on_kv_events(1, [stored(h[:3])])  # the store's events, published by replica 1
        assert router.route(req).believed_hit_tokens == believed


def test_global_prefers_the_longer_gpu_prefix_when_the_store_holds_the_rest() -> None:
    """Both replicas reach 4 cached blocks, replica 0 fetching 3 of them, replica 1 only 1: the
    transfer decides."""
    r = GlobalMooncakeRouter(0)
    req, h = _setup(r)
    r.on_kv_events(0, [gpu(h[:1])])
    r.on_kv_events(1, [gpu(h[:3]), stored(h[:4])])
    d = r.route(req)
    assert (d.replica, d.believed_hit_tokens) == (1, 4 * BS)
    f = IdleFleetView(1).facts[0]
    assert r._queue_s[1] == pytest.approx(store_load_time(STORE, 1) + prefill_time(f, 1, 4 * BS))


def test_the_store_run_starts_at_the_gpu_prefix_and_stops_at_a_gap() -> None:
    r = GlobalMooncakeRouter(0)
    req, h = _setup(r)
    r.on_kv_events(0, [gpu(h[:1]), stored([h[0], h[1], h[3]])])  # block 2 is not in the store
    r.on_kv_events(1, [gpu(h[:2])])
    assert r.route(req).believed_hit_tokens == 2 * BS  # 1 GPU + 1 store on replica 0, or 2 GPU on 1
    r.on_kv_events(0, [BlockRemoved([h[1]], medium=MEDIUM_STORE)])
    assert r.store_index.run_from(h, 1) == 0


def test_global_without_a_store_is_refused_at_routing() -> None:
    r = GlobalMooncakeRouter(0)
    req, _ = _setup(r, None)
    with pytest.raises(ValueError, match=r"cluster\.kv_store"):
        r.route(req)


def _fleet(router: dict[str, object]) -> object:
    cfg = config_from_dict({
        "name": "t",
        "engine": {"block_size": 16, "num_gpu_blocks": 600, "max_model_len": 8192, "vllm_version": "0.33.0"},
        "workload": {"kind": "chat", "sessions": 30},
        "cluster": {"replicas": 3, "router": router, "kv_store": {"capacity_blocks": 3000}},
    })
    result, _ = replay_experiment(cfg, progress=False)
    return result


@pytest.mark.parametrize("router", [{"kind": "mooncake", "scope": "global"}, {"kind": "oracle"}])
def test_store_aware_routers_believe_the_hits_their_replicas_get(router: dict[str, object]) -> None:
    """End to end, KV events without delay: a store-aware router believed, for every request, the GPU
    hit plus the remote hit its first admission got (capped at the prompt less one token, as the
    routers cap a hit); the local Conductor, blind to the store, does not."""
    res = _fleet(router)
    rq = res.requests  # type: ignore[attr-defined]
    got = np.minimum(rq["hit_tokens"] + rq["remote_hit_tokens"], (rq["prompt_tokens"] - 1) // 16 * 16)
    assert rq["remote_hit_tokens"].sum() > 0
    assert (rq["believed_hit_tokens"] == got).all()
    local = _fleet({"kind": "mooncake"}).requests  # type: ignore[attr-defined]
    assert (local["believed_hit_tokens"] < local["hit_tokens"] + local["remote_hit_tokens"]).any()
    assert res.summary["cluster"]["router"]["kind"] == router["kind"]  # type: ignore[attr-defined]
