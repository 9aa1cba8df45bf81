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

    def route(self, request: RouterRequest) -> Decision:
        view = self.view
        assert view is not None
        up = view.up()
        events = self.events
        host: dict[int, int] = {}
        words: Sequence[int] | None = None
        if events.tiers is None:
            overlaps = events.match_blocks(request, up)
        else:
            matches = events.match_tiers(request, up)
            overlaps = {w: m.gpu for w, m in matches.items() if m.gpu}
            host = {w: m.host for w, m in matches.items() if m.host}
        if events.tiers is None and events.one_hasher:
            # the common fleet (every replica hashes alike, no CPU tier): the prompt's hashes once,
            # as words for the logits, the acquire and the release (an array('Q') from the
            # compiled chain, as match_blocks read them)
            words = self._blocks.words(request.words(events.group_of[0]))
            logits = self._blocks.logits(words, up, overlaps, self._prefill_tokens, request.prompt_len,
                                         view.facts[0].block_size, self.overlap_credit, self.prefill_load_scale)
        else:
            logits = self._grouped_logits(request, up, overlaps, host)
        choice = self._pick(up, logits)
        held: Sequence[int] = words if words is not None else request.hashes(events.group_of[choice])
        self._blocks.acquire(choice, held)
        bs = view.facts[choice].block_size
        uncached = max(request.prompt_len - overlaps.get(choice, 0) * bs, 0)
        self._active[request.request_id] = _Active(choice, held, uncached)
        self._prefill_tokens[choice] += uncached
        believed = overlaps.get(choice, 0) + host.get(choice, 0)
        return Decision(choice, events.hit_tokens(request, choice, believed))

    def _grouped_logits(self, request: RouterRequest, up: list[int], overlaps: dict[int, int],
                        host: dict[int, int]) -> list[float]:
        """The logits of ``up``'s workers, in its order: one ``ActiveCounts.logits`` call per hasher
        (a mixed fleet hashes each group's way), with CPU-tier credit where ``host`` has any."""
        assert self.view is not None
        out: dict[int, float] = {}
        for hasher, members in self.events.groups(up):
            out.update(zip(members, self._blocks.logits(
                request.hashes(hasher), members, overlaps, self._prefill_tokens, request.prompt_len,
                self.view.facts[members[0]].block_size, self.overlap_credit, self.prefill_load_scale, host,
                self.host_cache_hit_weight)))
        return [out[w] for w in up]

    def _pick(self, workers: list[int], logits: list[float]) -> int:
        """The worker of the lowest logit, ties uniformly at random (temperature 0), else a softmax
        sample (see the module docstring); ``logits[i]`` is ``workers[i]``'s."""
        if self.temperature <= 0:
            return argbest(dict(zip(workers, logits)), self, lowest=True)
        lo, hi = min(logits), max(logits)
        if hi == lo:
            return self.pick_random(workers)
        scale = 1.0 / ((hi - lo) * self.temperature)
        weights = [math.exp(-(c - lo) * scale) for c in logits]
        u = self.rng.random() * sum(weights)
        acc = 0.0
        for w, p in zip(workers, weights):
            acc += p
            if u <= acc:
                return w
        return workers[-1]

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
