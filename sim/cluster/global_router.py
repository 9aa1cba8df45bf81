"""Mooncake's Conductor with its *global* cache-aware policy: prefix hits on other machines count,
priced with the time to move them (``router: {kind: mooncake, scope: global}``; issue 34 item 4).

Mirrors the global variant of the Conductor's prefill scheduling (Qin et al., "Mooncake: Trading
More Storage for Less Computation", FAST'25, section 4 and Algorithm 1; ``kvcache-ai/Mooncake``
``FAST25-release/Mooncake-FAST25.pdf``): besides the prefix an instance holds itself, the Conductor
knows the KVCache pool's metadata, and an instance that lacks a prefix another part of the pool
holds can fetch it instead of computing it; its estimated TTFT then adds the transfer. Here the
pool beyond the instances' GPUs is the fleet's shared store (``sim.cluster.kv_store``), whose
residency the router learns from the store's KV events (medium ``"STORAGE"``,
:class:`~sim.cluster.tier_index.StoreIndex`). For every replica that is up:

* ``local`` -- the leading blocks its GPU holds (its KV events, as the local policy reads them);
* ``remote`` -- the blocks the store holds consecutively right after them (the run the replica's
  connector would load: vLLM's lookup starts at the GPU hit);
* ``TTFT = T_queue + T_transfer(remote) + T_prefill(prompt, local + remote)``, with ``T_transfer``
  the replica's store link at its read bandwidth and per-transfer latency
  (``latency_s + blocks * kv_bytes_per_block / read_gb_s``), ``T_prefill`` and ``T_queue`` the local
  policy's (:mod:`sim.cluster.ttft_routers`);

the request goes to the least TTFT (ties at random). The paper's ``kvcache_balancing_threshold``
(fetch only when the remote prefix is much longer) is not modelled: a replica's connector always
loads what the store holds after its GPU hit, so the router prices what will happen. Hot-spot
replication and the SLO-based rejection are not modelled either. Without a store (``scope: global``
then is a config error) there is nothing global to count. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.cluster.kv_store import MEDIUM_STORE
from sim.cluster.router import ClusterView, Decision, RouterRequest, argbest
from sim.cluster.tier_index import StoreIndex
from sim.cluster.ttft_routers import MooncakeRouter, prefill_time, store_load_time
from sim.core.kv_events import KVCacheEvent


class GlobalMooncakeRouter(MooncakeRouter):
    """The Conductor's global policy (see the module docstring); ``store`` is set by the experiment."""

    name = "mooncake"
    raw_kv_events = False  # its store index reads the event objects

    def attach(self, view: ClusterView) -> None:
        super().attach(view)
        self.store_index = StoreIndex()

    def route(self, request: RouterRequest) -> Decision:
        assert self.view is not None
        if self.store is None:
            raise ValueError("the global Mooncake policy needs the fleet's store (cluster.kv_store)")
        up = self.view.up()
        local = self.events.match_blocks(request, up)
        hashes = request.hashes(self.events.group_of[up[0]])  # (a store's replicas hash alike)
        isl = request.prompt_len
        ttft: dict[int, float] = {}
        cost: dict[int, float] = {}
        cached: dict[int, int] = {}
        for i in up:
            g = local.get(i, 0)
            hit = self.events.hit_tokens(request, i, g)
            total = self.events.hit_tokens(request, i, g + self.store_index.run_from(hashes, g))
            transfer = store_load_time(self.store, (total - hit) // self.view.facts[i].block_size)
            cost[i] = transfer + prefill_time(self.view.facts[i], isl - total, total)
            ttft[i] = max(self._queue_s[i], 0.0) + cost[i]
            cached[i] = total
        choice = argbest(ttft, self, lowest=True)
        self._queued[request.request_id] = (choice, cost[choice])
        self._queue_s[choice] += cost[choice]
        return Decision(choice, cached[choice])

    def on_kv_events(self, replica: int, events: Sequence[KVCacheEvent]) -> None:
        super().on_kv_events(replica, events)  # the GPU events (the view drops the store's)
        self.store_index.on_events(events, MEDIUM_STORE)
