"""The precise routers with CPU-tier KV events (``medium="CPU"``): what each real router does with
them, one rule per test (``sim.cluster.tier_index``; sources in the routers' docstrings).

* llm-d: a pod entry per tier; a tokenless CPU store lands on blocks the index already knows;
  ``LongestPrefixScorer`` weights each chain block by its best tier (gpu 1.0, cpu 0.8);
* Dynamo: CPU blocks right after the device prefix earn ``host_cache_hit_weight`` (0.75) each --
  from self-describing events only;
* Mooncake: a CPU block is cached like a GPU one (the prefix on either medium);
* a fleet without CPU tiers keeps its GPU-only (compiled) index and drops nothing it used.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from idle_fleet_view import BS, IdleFleetView

from sim.cluster.dynamo_router import DynamoRouter
from sim.cluster.llm_d_router import LlmDRouter
from sim.cluster.prefix_index import KVEventIndex
from sim.cluster.router import Router, RouterRequest
from sim.cluster.tier_index import TierMatch
from sim.cluster.ttft_routers import MooncakeRouter
from sim.core.kv_events import MEDIUM_CPU, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from workloads.trace_format import TraceRequest


def setup(router: Router, n: int = 2, cpu_tier: bool = True) -> tuple[RouterRequest, list[int]]:
    router.attach(IdleFleetView(n, cpu_tier))
    req = RouterRequest(TraceRequest("q", 0.0, np.arange(4 * BS + 1, dtype=np.int64), 4), 0)
    view = router.events  # type: ignore[attr-defined]
    return req, req.hashes(view.group_of[0])


def gpu_store(hashes: Sequence[int], parent: int | None = None) -> BlockStored:
    return BlockStored(list(hashes), parent, list(range(BS * len(hashes))), BS, None)


def cpu_placeholder(h: int) -> BlockStored:
    return BlockStored([h], None, [], 0, None, medium=MEDIUM_CPU, group_idx=0)


def cpu_described(hashes: Sequence[int], parent: int | None) -> BlockStored:
    return BlockStored(list(hashes), parent, list(range(BS * len(hashes))), BS, None, medium=MEDIUM_CPU, group_idx=0,
                       kv_cache_spec_kind="full_attention")


def deliver(router: Router, replica: int, events: list[KVCacheEvent]) -> None:
    router.on_kv_events(replica, events)


def test_llm_d_scores_a_cpu_block_at_0_8_and_keeps_the_chain_through_it() -> None:
    r = LlmDRouter(0, prefix="precise")
    req, h = setup(r)
    deliver(r, 0, [gpu_store(h[:4])])  # 4 blocks on GPU: 4.0
    # replica 1: 4 blocks on GPU, the last two evicted from GPU after they reached its CPU tier
    deliver(r, 1, [gpu_store(h[:4]), cpu_placeholder(h[2]), cpu_placeholder(h[3]), BlockRemoved([h[3], h[2]])])
    m = r.events.match_tiers(req, [0, 1])
    assert (m[1].chain, m[1].chain_gpu, m[1].chain_cpu, m[1].gpu) == (4, 2, 2, 2)
    assert r._weighted(m[0]) == 4.0 and r._weighted(m[1]) == 2 * 1.0 + 2 * 0.8
    scores, believed = r._prefix_scores(req, [0, 1])
    assert scores == {0: 1.0, 1: 0.0} and believed == {0: 64, 1: 64}  # both believed to serve the chain


def test_llm_d_cpu_blocks_beat_a_shorter_gpu_prefix() -> None:
    r = LlmDRouter(0, prefix="precise")
    req, h = setup(r)
    deliver(r, 0, [gpu_store(h[:2])])
    deliver(r, 1, [gpu_store(h[:4]), cpu_placeholder(h[2]), cpu_placeholder(h[3]), BlockRemoved([h[3], h[2]])])
    scores, _ = r._prefix_scores(req, [0, 1])
    assert scores == {0: 0.0, 1: 1.0}  # 2.0 < 3.6


def test_llm_d_tokenless_cpu_store_of_an_unknown_block_is_dropped() -> None:
    # pool.go handleDeviceTierUpdate: GetRequestKey fails -> nothing added
    r = LlmDRouter(0, prefix="precise")
    req, h = setup(r)
    deliver(r, 1, [cpu_placeholder(h[0])])
    assert r.events.match_tiers(req, [0, 1]) == {}


def test_llm_d_self_describing_store_needs_a_known_parent() -> None:
    r = LlmDRouter(0, prefix="precise")
    req, h = setup(r)
    deliver(r, 1, [cpu_described(h[1:2], parent=h[0])])  # parent unknown: skipped
    deliver(r, 1, [cpu_described(h[0:1], parent=None), cpu_described(h[1:2], parent=h[0])])
    assert r.events.match_tiers(req, [1])[1].chain_cpu == 2


def test_llm_d_all_blocks_cleared_drops_every_tier() -> None:
    r = LlmDRouter(0, prefix="precise")
    req, h = setup(r)
    deliver(r, 0, [gpu_store(h[:2]), cpu_placeholder(h[0]), AllBlocksCleared()])
    assert r.events.match_tiers(req, [0]) == {}


def test_dynamo_credits_host_blocks_after_the_device_prefix_at_0_75() -> None:
    r = DynamoRouter(0)
    req, h = setup(r)
    deliver(r, 0, [gpu_store(h[:2])])
    deliver(r, 1, [gpu_store(h[:1]), cpu_described(h[0:3], parent=None)])
    m = r.events.match_tiers(req, [0, 1])
    assert (m[0].gpu, m[0].host) == (2, 0) and (m[1].gpu, m[1].host) == (1, 2)
    # logit = max((0 + isl) / bs - credit, 0) + decode blocks (both idle: the 5 new blocks)
    d = r.route(req)
    assert d.replica == 1 and d.believed_hit_tokens == 3 * BS  # 1 + 0.75 * 2 = 2.5 > 2 device blocks


def test_dynamo_drops_tokenless_cpu_stores() -> None:
    r = DynamoRouter(0)
    req, h = setup(r)
    deliver(r, 1, [gpu_store(h[:1]), cpu_placeholder(h[1]), cpu_placeholder(h[2])])
    assert r.events.match_tiers(req, [1])[1] == TierMatch(1, 0, 1, 1, 0)


def test_mooncake_counts_a_cpu_block_as_cached() -> None:
    r = MooncakeRouter(0)
    req, h = setup(r)
    deliver(r, 0, [gpu_store(h[:2])])
    deliver(r, 1, [gpu_store(h[:1]), cpu_placeholder(h[1]), cpu_placeholder(h[2])])
    assert r.route(req).replica == 1  # 3 cached blocks beat 2


def test_untiered_fleet_keeps_the_compiled_gpu_index_and_ignores_cpu_events() -> None:
    r = LlmDRouter(0, prefix="precise")
    req, h = setup(r, cpu_tier=False)
    assert r.events.tiers is None and not isinstance(r.events.index, KVEventIndex)  # the compiled one
    deliver(r, 0, [gpu_store(h[:2]), cpu_placeholder(h[2])])
    assert r.events.match_blocks(req, [0]) == {0: 2}
