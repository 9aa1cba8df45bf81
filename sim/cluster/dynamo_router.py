"""Dynamo's KV router: a block-cost logit over the router's active sequences and a KV-event index.

Mirrors ``ai-dynamo/dynamo`` ``lib/kv-router/src/scheduling/selector/default.rs``
(``DefaultWorkerScorer::worker_logit``, ``minimum_cost_index``, ``softmax_sample_index``), with the
load it tracks itself (``lib/kv-router/src/sequences/``: ``WorkerLoadProjection``) and the overlap
from its ``KvIndexer`` radix tree of KV events (``lib/kv-router/src/indexer``). Per worker ``w``:

* ``overlap_w``: leading prompt blocks ``w``'s KV events announced;
* ``raw_prefill_blocks_w = (active_prefill_tokens_w + isl) / block_size``, where
  ``active_prefill_tokens_w`` sums the uncached prompt tokens of the requests routed to ``w`` that
  have not streamed a first token yet (``mark_prefill_completed``);
* ``decode_blocks_w = active_blocks_w + blocks of the prompt not already active on w``, where
  ``active_blocks_w`` counts the distinct prompt blocks of ``w``'s active requests (acquired when
  routed, released when the response ends);
* ``logit_w = prefill_load_scale * max(raw_prefill_blocks_w - overlap_credit * overlap_w, 0)
  + decode_blocks_w`` (defaults: credit 1.0, scale 1.0; no credit decay, no active-request term).

With CPU offload tiers (vLLM 0.33.0's ``medium="CPU"`` events; ``StorageTier::from_kv_medium``
maps ``"CPU"`` to ``HostPinned``), the CPU events feed a lower-tier index (``lib/kv-router/src/
indexer/lower_tier_indexers.rs``), walked on from each worker's device prefix (``query_lower_tiers``:
``host_w`` = the worker's CPU blocks right after its ``overlap_w`` device blocks, from the root for a
worker with none), and the credit becomes ``overlap_credit * overlap_w + host_cache_hit_weight *
host_w`` (``scheduling/selector`` ``DefaultScorer``; ``--router-host-cache-hit-weight``, default
0.75). Only self-describing events carry what that index needs (Dynamo's offloading support matrix
lists the vLLM CPU tier as "OffloadingConnector + self-describing KV events"); a tokenless
placeholder is dropped (``sim.cluster.tier_index.DYNAMO``), so with vLLM's default events the CPU
tier earns no credit. The active-prefill accounting keeps the device overlap; the believed hit is
``overlap_w + host_w`` blocks.

The logits of a request are computed in one call per hasher (``ActiveCounts.logits``,
``sim.cluster.active_blocks``: compiled for up to 64 workers, same floats as the Python oracle), the
prompt's hashes converted once (``ActiveCounts.words``: an ``array('Q')`` for the compiled twin) for
the logits, the acquire and the release.

Temperature 0 picks the lowest logit, ties uniformly at random; ``temperature > 0`` samples
``softmax(-(logit - min) / ((max - min) * T))``, uniform when all logits are equal.
Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sim.cluster.active_blocks import make_active_blocks
from sim.cluster.kv_view import EventCacheView
from sim.cluster.router import ClusterView, Decision, Router, RouterRequest, argbest
from sim.cluster.tier_index import DYNAMO
from sim.core.kv_events import KVCacheEvent


@dataclass(slots=True)
class _Active:
    replica: int
    hashes: Sequence[int]  # the prompt's hashes under the replica's hasher (an array('Q') or a list)
    prefill_tokens: int


class DynamoRouter(Router):
    name = "dynamo"
    needs_kv_events = True
    raw_kv_events = True  # on_kv_events: self.events.on_events
    keeps_cache_view = True

    def __init__(self, seed: int, overlap_credit: float = 1.0, temperature: float = 0.0,
                 prefill_load_scale: float = 1.0, host_cache_hit_weight: float = 0.75) -> None:
        super().__init__(seed)
        self.overlap_credit = overlap_credit
        self.host_cache_hit_weight = host_cache_hit_weight
        self.temperature = temperature
        self.prefill_load_scale = prefill_load_scale

    def attach(self, view: ClusterView) -> None:
        super().attach(view)
        n = view.num_replicas
        self.events = EventCacheView(view.facts, DYNAMO)
        self._active: dict[str, _Active] = {}
        self._blocks = make_active_blocks(n)  # active prompt blocks per worker (sim.cluster.active_blocks)
        self._prefill_tokens = [0] * n
        self._one_hasher = len({id(h) for h in self.events.group_of}) == 1

    def route(self, request: RouterRequest) -> Decision:
        assert self.view is not None
        up = self.view.up()
        host: dict[int, int] = {}
        if self.events.tiers is None:
            overlaps = self.events.match_blocks(request, up)
        else:
            matches = self.events.match_tiers(request, up)
            overlaps = {w: m.gpu for w, m in matches.items() if m.gpu}
            host = {w: m.host for w, m in matches.items() if m.host}
        isl = request.prompt_len
        group_of = self.events.group_of
        logits: dict[int, float] = {}
        words: Sequence[int] | None = None
        # per hasher, the logits of its workers in one call (ActiveCounts.logits: the formula)
        for members in self._by_hasher(up):
            hasher = group_of[members[0]]
            hashes: Sequence[int] = request.hashes(hasher)
            if len(members) == len(up):  # one hasher: its hashes as words serve logits, acquire, release
                hashes = words = self._blocks.words(hashes)
            logits.update(zip(members, self._blocks.logits(
                hashes, members, overlaps, self._prefill_tokens, isl, self.view.facts[members[0]].block_size,
                self.overlap_credit, self.prefill_load_scale, host, self.host_cache_hit_weight)))
        if not self._one_hasher:
            logits = {w: logits[w] for w in up}  # (in up's order, as ties are broken)
        choice = self._pick(logits)
        held: Sequence[int] = words if words is not None else request.hashes(group_of[choice])
        self._blocks.acquire(choice, held)
        bs = self.view.facts[choice].block_size
        uncached = max(isl - overlaps.get(choice, 0) * bs, 0)
        self._active[request.request_id] = _Active(choice, held, uncached)
        self._prefill_tokens[choice] += uncached
        believed = overlaps.get(choice, 0) + host.get(choice, 0)
        return Decision(choice, self.events.hit_tokens(request, choice, believed))

    def _by_hasher(self, up: list[int]) -> list[list[int]]:
        """``up`` split by the workers' hashers (each a list in index order; one list, ``up``
        itself, when every replica hashes alike)."""
        if self._one_hasher:
            return [up]
        by: dict[int, list[int]] = {}
        for w in up:
            by.setdefault(id(self.events.group_of[w]), []).append(w)
        return list(by.values())

    def _pick(self, logits: dict[int, float]) -> int:
        if self.temperature <= 0:
            return argbest(logits, self, lowest=True)
        lo, hi = min(logits.values()), max(logits.values())
        items = list(logits.items())
        if hi == lo:
            return self.pick_random([w for w, _ in items])
        scale = 1.0 / ((hi - lo) * self.temperature)
        weights = [math.exp(-(c - lo) * scale) for _, c in items]
        u = self.rng.random() * sum(weights)
        acc = 0.0
        for (w, _), p in zip(items, weights):
            acc += p
            if u <= acc:
                return w
        return items[-1][0]

    def on_first_token(self, request_id: str, replica: int) -> None:
        a = self._active.get(request_id)
        if a is not None and a.prefill_tokens:
            self._prefill_tokens[a.replica] -= a.prefill_tokens
            a.prefill_tokens = 0

    def on_finish(self, request_id: str, replica: int) -> None:
        a = self._active.pop(request_id, None)
        if a is None:
            return
        self._prefill_tokens[a.replica] -= a.prefill_tokens
        self._blocks.release(a.replica, a.hashes)

    def on_kv_events(self, replica: int, events: Sequence[KVCacheEvent]) -> None:
        self.events.on_events(replica, events)

    def on_replica_down(self, replica: int) -> None:
        self.events.clear(replica)
        for rid in [rid for rid, a in self._active.items() if a.replica == replica]:
            del self._active[rid]
        self._blocks.clear(replica)
        self._prefill_tokens[replica] = 0
