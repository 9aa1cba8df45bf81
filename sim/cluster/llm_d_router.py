"""llm-d's endpoint picker: weighted scorers and a max-score picker.

Mirrors the scheduling profile of the llm-d inference scheduler (``llm-d/llm-d-inference-scheduler``)
built on the Gateway API Inference Extension EPP (``kubernetes-sigs/gateway-api-inference-extension``):

* ``queue-scorer`` (GIE ``pkg/epp/scheduling/framework/plugins/scorer/queue.go``): per endpoint
  ``(max_q - q) / (max_q - min_q)`` of the scraped ``num_requests_waiting``, 1.0 for all when equal;
* ``kv-cache-utilization-scorer`` (``scorer/kvcache_utilization.go``): ``1 - kv_cache_usage``;
* prefix scorer, one of
  - *approximate* (GIE ``plugins/multi/prefix/plugin.go`` + ``indexer.go``; llm-d
    ``pkg/plugins/scorer/approximate_hasher.go`` / ``approximate_indexer.go``): the router's own
    chained hashes over ``block_size`` (64) tokens, at most ``max_prefix_blocks`` (256) of them,
    seeded with the salt; score = contiguous blocks in the endpoint's index / blocks of the
    prompt; after the pick the prompt's hashes are written into the chosen endpoint's LRU of
    ``lru_capacity`` (31,250) entries;
  - *precise* (llm-d ``pkg/plugins/scorer/precise_prefix_cache.go`` over llm-d-kv-cache-manager):
    the longest prefix, in engine blocks, that the endpoint's KV events announced, min-max
    normalised over the endpoints that hold any of it (1.0 when they tie, 0.0 for the others,
    as ``indexedScoresToNormalizedScoredPods``);
    With CPU offload tiers (vLLM 0.33.0's ``medium="CPU"`` events), the index keeps a pod entry per
    device tier (llm-d-kv-cache ``kvblock.PodEntry{pod, DeviceTier}``; ``kvevents/pool.go`` lowers
    the medium: ``"cpu"``), ingests a tokenless CPU store through the blocks it already knows
    (``handleDeviceTierUpdate``; ``sim.cluster.tier_index.LLM_D``), and scores with
    ``LongestPrefixScorer`` (``pkg/kvcache/kvblock_scorer.go``): a pod stays in the prefix chain
    while it holds each block on some tier, each block adding the best weight of the tiers it is on
    (``DefaultKVCacheBackendConfig``: gpu 1.0, cpu 0.8, ``gpu_weight`` / ``cpu_weight`` here); the
    weighted sums are normalised as above. The believed hit is the whole chain.
    With ``speculative_ttl_s`` (llm-d's ``speculativeIndexing`` + ``speculativeTTL``, off by
    default, 30 s when on: ``precise_prefix_cache.go``), the prompt's blocks are also written for the
    chosen endpoint right after the pick (``PreRequest``), so requests routed before the first one's
    KV events arrive see it; the entries leave after the TTL whatever the events said meanwhile
    (the TTL cache's eviction calls ``Evict`` on the same keys). Here they sit in a second index
    and an endpoint's chain is the longer of its confirmed and speculative chains (GPU-only fleets);
  - *none*: load scorers only (the blog's ``load-scheduling``);
* ``max-score-picker`` (GIE ``plugins/picker/max_score_picker.go``): shuffle, then the highest
  weighted sum ``sum(weight * score)`` -- a uniformly random endpoint among the best.

Weights default to queue : kv-cache : prefix = 2 : 2 : 3 (llm-d's well-lit-path profile); the
experiment config gives ``prefix: precise`` llm-d's shipped precise profile, 1 : 1 : 2
(``deploy/config/epp-precise-prefix-cache-config.yaml``).
Metrics are what the last scrape saw (``cluster.metrics_interval_s``, llm-d's 50 ms refresh).
Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from sim.cluster.kv_view import EventCacheView
from sim.cluster.prefix_index import KVEventIndex, LRUPrefixIndex
from sim.cluster.router import ClusterView, Decision, Router, RouterRequest, argbest
from sim.cluster.tier_index import LLM_D, TierMatch
from sim.core.hashing import FastBlockHasher
from sim.core.kv_events import KVCacheEvent

PREFIX_MODES = ("approximate", "precise", "none")


class LlmDRouter(Router):
    name = "llm_d"
    needs_metrics = True
    raw_kv_events = True  # on_kv_events: self.events.on_events

    def __init__(
        self,
        seed: int,
        prefix: str = "precise",
        queue_weight: float = 2.0,
        kv_cache_weight: float = 2.0,
        prefix_weight: float = 3.0,
        block_size: int = 64,
        max_prefix_blocks: int = 256,
        lru_capacity: int = 31250,
        gpu_weight: float = 1.0,
        cpu_weight: float = 0.8,
        speculative_ttl_s: float | None = None,
    ) -> None:
        super().__init__(seed)
        if prefix not in PREFIX_MODES:
            raise ValueError(f"prefix must be one of {PREFIX_MODES}")
        self.prefix = prefix
        self.weights = (queue_weight, kv_cache_weight, prefix_weight)
        self.needs_kv_events = prefix == "precise"
        self.keeps_cache_view = prefix != "none"
        self.block_size = block_size
        self.max_prefix_blocks = max_prefix_blocks
        self.lru_capacity = lru_capacity
        self.tier_weights = (gpu_weight, cpu_weight)
        self._own_hasher = FastBlockHasher(block_size, hash_seed="llm-d approximate prefix")
        self.speculative_ttl_s = speculative_ttl_s if prefix == "precise" else None

    def attach(self, view: ClusterView) -> None:
        super().attach(view)
        self.lru = LRUPrefixIndex(view.num_replicas, self.lru_capacity)
        self.events = EventCacheView(view.facts, LLM_D)
        self.speculative = KVEventIndex(view.num_replicas)
        self._expiry: deque[tuple[float, int, list[int]]] = deque()  # (expires at, replica, hashes)

    def _prefix_scores(self, request: RouterRequest, up: list[int]) -> tuple[dict[int, float], dict[int, int]]:
        """(score per endpoint, believed hit tokens per endpoint)."""
        if self.prefix == "approximate":
            hashes = request.hashes(self._own_hasher)[: self.max_prefix_blocks]
            matched = self.lru.match(hashes, up)
            total = len(hashes)
            scores = {i: (matched.get(i, 0) / total if total else 0.0) for i in up}
            cap = request.prompt_len - 1
            return scores, {i: min(matched.get(i, 0) * self.block_size, cap) for i in up}
        raw: dict[int, float] | dict[int, int]
        if self.events.tiers is None:
            blocks = raw = self.events.match_blocks(request, up)
            if self.speculative_ttl_s is not None:
                for i, n in self._speculative_blocks(request, up).items():
                    if n > raw.get(i, 0):
                        raw[i] = n
        else:
            matches = self.events.match_tiers(request, up)
            blocks = {i: m.chain for i, m in matches.items()}
            raw = {i: self._weighted(m) for i, m in matches.items()}
        lo, hi = (min(raw.values()), max(raw.values())) if raw else (0, 0)
        scores = {}
        for i in up:
            if i not in raw:
                scores[i] = 0.0
            else:
                scores[i] = 1.0 if hi == lo else (raw[i] - lo) / (hi - lo)
        return scores, {i: self.events.hit_tokens(request, i, blocks.get(i, 0)) for i in up}

    def _speculative_blocks(self, request: RouterRequest, up: list[int]) -> dict[int, int]:
        """Leading blocks of the speculative index per candidate, hashed as each replica hashes."""
        out: dict[int, int] = {}
        for hasher, members in self.events.groups(up):
            out.update(self.speculative.match(request.hashes(hasher), members))
        return out

    def _weighted(self, m: TierMatch) -> float:
        """``LongestPrefixScorer``: each chain block adds the best weight of the tiers holding it."""
        wg, wc = self.tier_weights
        both = m.chain_gpu + m.chain_cpu - m.chain
        return both * max(wg, wc) + (m.chain_gpu - both) * wg + (m.chain_cpu - both) * wc

    def route(self, request: RouterRequest) -> Decision:
        assert self.view is not None
        up = self.view.up()
        metrics = {i: self.view.metrics(i) for i in up}
        queues = [m.num_waiting for m in metrics.values()]
        qmin, qmax = min(queues), max(queues)
        wq, wkv, wp = self.weights
        if self.speculative_ttl_s is not None:  # expired speculative entries leave before the scoring
            now = self.view.now
            while self._expiry and self._expiry[0][0] <= now:
                _, replica, hashes = self._expiry.popleft()
                self.speculative.remove(replica, hashes)
        total = {}
        for i, m in metrics.items():
            q = 1.0 if qmax == qmin else (qmax - m.num_waiting) / (qmax - qmin)
            total[i] = wq * q + wkv * (1.0 - m.kv_usage)
        believed: dict[int, int] = {}
        if self.prefix != "none":
            scores, believed = self._prefix_scores(request, up)
            for i in up:
                total[i] += wp * scores[i]
        choice = argbest(total, self, lowest=False)
        if self.prefix == "approximate":  # PreRequest: self-report the expected cache contents
            self.lru.add(choice, request.hashes(self._own_hasher)[: self.max_prefix_blocks])
        elif self.speculative_ttl_s is not None:  # PreRequest: speculative entries for the chosen endpoint
            hashes = request.hashes(self.events.group_of[choice])
            self.speculative.store(choice, hashes)
            self._expiry.append((self.view.now + self.speculative_ttl_s, choice, hashes))
        return Decision(choice, believed.get(choice) if self.prefix != "none" else None)

    def on_kv_events(self, replica: int, events: Sequence[KVCacheEvent]) -> None:
        self.events.on_events(replica, events)

    def on_replica_down(self, replica: int) -> None:
        self.lru.clear(replica)
        self.events.clear(replica)
        self.speculative.clear(replica)
