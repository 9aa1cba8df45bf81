"""SGLang's cache-aware router: approximate prefix trees per worker, switched off under imbalance.

Mirrors ``sgl-project/sglang`` ``sgl-router/src/policies/cache_aware.rs`` (``select_worker``) and
``sgl-router/src/tree.rs``, at the command-line defaults of ``sgl-router`` (``cache_threshold``
0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5, ``eviction_interval_secs`` 120,
``max_tree_size`` 2**26). Load is the router's own count of outstanding requests per worker.

* imbalanced when ``max_load - min_load > abs`` **and** ``max_load > min_load * rel``: the least
  loaded worker (first in index order), and the prompt is still inserted into its tree;
* otherwise the worker whose tree matches the most leading tokens; if ``matched / prompt >
  cache_threshold`` route there, else to the worker with the smallest tree; insert the prompt
  into the chosen worker's tree;
* every ``eviction_interval_s`` of simulated time, each tree drops LRU leaves down to
  ``max_tree_size`` tokens.

The trees hold token ids (the real router holds characters); ties between equally matching or
equally small trees (``DashMap`` iteration order in the real router) are broken at random. The
router reads no KV events, so a replica's CPU offload tier is invisible to it: its trees are what
it routed, whatever tier the engine keeps them in.
Imports neither simpy nor torch.
"""

from __future__ import annotations

from sim.cluster.basic_routers import TrackedRouter
from sim.cluster.router import ClusterView, Decision, RouterRequest
from sim.cluster.token_tree import TokenTree, compact_prompt


class SGLangRouter(TrackedRouter):
    name = "sglang"
    keeps_cache_view = True

    def __init__(self, seed: int, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5, eviction_interval_s: float = 120.0,
                 max_tree_size: int = 1 << 26) -> None:
        super().__init__(seed)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_size = max_tree_size

    def attach(self, view: ClusterView) -> None:
        super().attach(view)  # TrackedRouter: self.inflight
        self.trees = [TokenTree() for _ in range(view.num_replicas)]
        self._next_eviction = self.eviction_interval_s

    def _evict(self, now: float) -> None:
        if self.eviction_interval_s <= 0:
            return
        while now >= self._next_eviction:
            for tree in self.trees:
                tree.evict_to(self.max_tree_size)
            self._next_eviction += self.eviction_interval_s

    def route(self, request: RouterRequest) -> Decision:
        assert self.view is not None
        now = self.view.now
        self._evict(now)
        up = self.view.up()
        loads = self.inflight.requests
        lmax = max(loads[i] for i in up)
        lmin = min(loads[i] for i in up)
        tokens = compact_prompt(request.tokens())  # (once for every tree: sim.cluster.token_tree)
        imbalanced = lmax - lmin > self.balance_abs_threshold and lmax > lmin * self.balance_rel_threshold
        if imbalanced:
            choice = min(up, key=lambda i: loads[i])
            matched = self.trees[choice].match(tokens)
        else:
            matches = {i: self.trees[i].match(tokens) for i in up}
            best = max(matches.values())
            rate = best / len(tokens) if len(tokens) else 0.0
            if rate > self.cache_threshold:
                choice = self.pick_random([i for i in up if matches[i] == best])
            else:
                smallest = min(self.trees[i].size for i in up)
                choice = self.pick_random([i for i in up if self.trees[i].size == smallest])
            matched = matches[choice]
        self.trees[choice].insert(tokens, now)
        self.inflight.sent(request, choice)
        return Decision(choice, min(matched, request.prompt_len - 1))

    def on_replica_down(self, replica: int) -> None:
        super().on_replica_down(replica)
        self.trees[replica] = TokenTree()  # remove_tenant
