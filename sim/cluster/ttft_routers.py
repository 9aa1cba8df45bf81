"""Routers that pick the least estimated time to first token: Mooncake's Conductor and the oracle.

``mooncake`` mirrors the *local cache-aware* prefill scheduling of Mooncake's Conductor
(Qin et al., "Mooncake: Trading More Storage for Less Computation", FAST'25, section 4.1 and
Algorithm 1; ``kvcache-ai/Mooncake`` ``FAST25-release/Mooncake-FAST25.pdf``): for every instance,
``TTFT = T_queue + T_prefill(prompt, prefix_len)`` with ``prefix_len`` the instance's longest cached
prefix (the Conductor keeps the global cache metadata: here the KV events), ``T_prefill`` from a
model of prefill time fitted offline (here the replica's latency model, pricing the uncached
tokens in chunks of the engine's token budget) and ``T_queue`` the sum of the estimated prefill
times of the requests queued at the instance (routed there, no first token yet). The request
goes to the least TTFT (ties at random). The global variant (KV fetched from the pool beyond the
instance) is ``sim.cluster.global_router``; the SLO-based rejection is not modelled. With CPU
offload tiers (vLLM 0.33.0's ``medium="CPU"`` events), a block in an instance's CPU tier counts as
cached like one on its GPU: the Conductor's cache metadata covers each instance's DRAM KV cache,
where Mooncake keeps its KVCache (paper section 3); the prefix is the run held on either medium
(``sim.cluster.tier_index.ANY``), its load time not priced.

``oracle`` uses what no real router has (the declared exception): each replica's exact cached
prefix (a stat-free lookup in its KV manager) and exact prefill backlog (waiting and running
requests' uncomputed prompt tokens), priced by the same latency model; the least estimated TTFT
wins. It is the upper bound the real routers are compared with. With a store the fleet shares
(``sim.cluster.kv_store``), it also reads the store itself: the blocks it holds ready right after a
replica's GPU hit are cached tokens, priced with the replica's store link (:func:`store_load_time`).
The global scope of the Conductor, which prices the store from its events, is
``sim.cluster.global_router``.

Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.cluster.kv_store import StoreSpec
from sim.cluster.kv_view import EventCacheView
from sim.cluster.router import ClusterView, Decision, ReplicaFacts, Router, RouterRequest, argbest
from sim.cluster.tier_index import ANY
from sim.core.executor import StepShape
from sim.core.hashing import BlockHasher, make_block_hasher
from sim.core.kv_events import KVCacheEvent
from sim.core.offload.manager import LookupResult
from sim.core.request import Request
from sim.core.scheduler import Scheduler


def prefill_time(facts: ReplicaFacts, new_tokens: int, cached_tokens: int) -> float:
    """Estimated time to prefill ``new_tokens`` after ``cached_tokens`` cached ones, in chunks of
    the engine's token budget (chunked prefill), each chunk alone in its step."""
    t = 0.0
    ctx = cached_tokens
    left = new_tokens
    chunk = facts.max_num_batched_tokens
    while left > 0:
        n = min(chunk, left)
        t += facts.latency.step_time(StepShape.prefill_only(n, ctx))
        ctx += n
        left -= n
    return t


def backlog_time(facts: ReplicaFacts, tokens: int) -> float:
    """Estimated time to prefill ``tokens`` queued prompt tokens: full token-budget chunks at the
    price of one such chunk (a linear estimate; the queue's own contexts are not known)."""
    if tokens <= 0:
        return 0.0
    chunk = facts.max_num_batched_tokens
    return tokens / chunk * facts.latency.step_time(StepShape.prefill_only(chunk, 0))


class MooncakeRouter(Router):
    name = "mooncake"
    needs_kv_events = True
    raw_kv_events = True  # on_kv_events: self.events.on_events
    keeps_cache_view = True
    store: StoreSpec | None = None  # the fleet's shared store (read by the global scope only)

    def attach(self, view: ClusterView) -> None:
        super().attach(view)
        self.events = EventCacheView(view.facts, ANY)
        self._queued: dict[str, tuple[int, float]] = {}  # request -> (replica, estimated prefill s)
        self._queue_s = [0.0] * view.num_replicas

    def route(self, request: RouterRequest) -> Decision:
        assert self.view is not None
        up = self.view.up()
        if self.events.tiers is None:
            blocks = self.events.match_blocks(request, up)
        else:
            blocks = {i: m.chain for i, m in self.events.match_tiers(request, up).items()}
        isl = request.prompt_len
        ttft: dict[int, float] = {}
        prefill: dict[int, float] = {}
        priced: dict[tuple[int, int, int], float] = {}  # replicas alike price alike: once per request
        for i in up:
            cached = self.events.hit_tokens(request, i, blocks.get(i, 0))
            f = self.view.facts[i]
            key = (id(f.latency), f.max_num_batched_tokens, cached)  # (all prefill_time reads of f)
            t = priced.get(key)
            if t is None:
                t = priced[key] = prefill_time(f, isl - cached, cached)
            prefill[i] = t
            ttft[i] = max(self._queue_s[i], 0.0) + t
        choice = argbest(ttft, self, lowest=True)
        self._queued[request.request_id] = (choice, prefill[choice])
        self._queue_s[choice] += prefill[choice]
        return Decision(choice, self.events.hit_tokens(request, choice, blocks.get(choice, 0)))

    def _dequeue(self, request_id: str) -> None:
        q = self._queued.pop(request_id, None)
        if q is not None:
            self._queue_s[q[0]] -= q[1]

    def on_first_token(self, request_id: str, replica: int) -> None:
        self._dequeue(request_id)

    def on_finish(self, request_id: str, replica: int) -> None:
        self._dequeue(request_id)

    def on_kv_events(self, replica: int, events: Sequence[KVCacheEvent]) -> None:
        self.events.on_events(replica, events)

    def on_replica_down(self, replica: int) -> None:
        self.events.clear(replica)
        for rid in [rid for rid, (r, _) in self._queued.items() if r == replica]:
            del self._queued[rid]
        self._queue_s[replica] = 0.0


class OracleRouter(Router):
    name = "oracle"
    keeps_cache_view = True
    store: StoreSpec | None = None  # the fleet's shared store: its exact residency and link are priced too

    def attach(self, view: ClusterView) -> None:
        super().attach(view)
        self._hashers: dict[tuple[str, int, int | str, int, bool, bool], BlockHasher] = {}

    def _hasher(self, replica: int) -> BlockHasher:
        assert self.view is not None
        sched = self.view.engine(replica)
        f = self.view.facts[replica]
        bs = sched.kv_cache_manager.hash_block_size
        lookahead = sched.kv_cache_manager.num_hash_lookahead_tokens
        key = (f.hash_algo, bs, f.hash_seed, lookahead, True, f.tagged_extra_keys)  # a probe: hashed from token 0
        h = self._hashers.get(key)
        if h is None:
            h = self._hashers[key] = make_block_hasher(*key)
        return h

    def route(self, request: RouterRequest) -> Decision:
        assert self.view is not None
        ttft: dict[int, float] = {}
        hits: dict[int, int] = {}
        probes: dict[int, object] = {}
        for i in self.view.up():
            sched = self.view.engine(i)
            hasher = self._hasher(i)
            probe = probes.get(id(hasher))
            if probe is None:
                probe = probes[id(hasher)] = request.probe(hasher)
            _, hit = sched.kv_cache_manager.peek_computed_blocks(probe)  # type: ignore[arg-type]
            loaded = 0 if self.store is None else store_run(sched, probe, hit)  # type: ignore[arg-type]
            backlog = sum(r.num_tokens for r in sched.waiting) + sum(
                max(r.num_prompt_tokens - r.num_computed_tokens, 0) for r in sched.running
            ) + self.view.pending_tokens(i)
            f = self.view.facts[i]
            transfer = 0.0 if self.store is None else store_load_time(self.store, loaded)
            hit += loaded * f.block_size
            hits[i] = hit
            ttft[i] = backlog_time(f, backlog) + transfer + prefill_time(f, request.prompt_len - hit, hit)
        choice = argbest(ttft, self, lowest=True)
        return Decision(choice, hits[choice])


def store_load_time(store: StoreSpec, num_blocks: int) -> float:
    """Seconds a load of ``num_blocks`` blocks takes on an idle store link (0 for none)."""
    if num_blocks <= 0:
        return 0.0
    return store.latency_s + num_blocks * store.kv_bytes_per_block / (store.read_gb_s * 1e9)


def store_run(sched: Scheduler, probe: Request, hit: int) -> int:
    """Query: the blocks of ``probe``'s prompt the fleet's store holds ready right after a GPU hit of
    ``hit`` tokens, reached through ``sched``'s connector (the oracle's exact store lookup; the key of
    a one-block chunk is the block's hash), capped as the GPU hit is, at the prompt less one token."""
    tier = sched.tier
    if tier is None:
        return 0
    bs = sched.cache_config.block_size
    manager = tier.connector.manager
    hashes = probe.block_hashes
    cap = (probe.num_prompt_tokens - 1) // bs
    k = hit // bs
    while k < cap and k < len(hashes) and manager.lookup(hashes[k]) is LookupResult.HIT:
        k += 1
    return k - hit // bs
