"""Routing a disaggregated fleet: one router per pool (prefill, decode) and the P/D rule that
orders their two decisions.

Mirrors the P/D request paths of the routers that have one:

* **Dynamo** (``ai-dynamo/dynamo`` ``lib/llm/src/kv_router/prefill_router/mod.rs``, ``PrefillRouter``;
  ``docs/design_docs/disagg_serving.md``): the prefill worker is chosen first, by a KV router over
  the prefill workers, and sent the request with ``max_tokens = 1``; once the prefill returned its
  ``disaggregated_params`` (vLLM: "prefill runs synchronously; decode waits for prefill to
  complete"), the decode router chooses the decode worker. Order ``prefill_first``: the decode
  choice is made when the prefill finishes, on the decode pool's state then. (Dynamo's conditional
  disaggregation, a policy that is off unless configured, is not modelled.)
* **llm-d** (``llm-d/llm-d-inference-scheduler`` ``pkg/plugins/profile/pd_profile_handler.go``,
  ``PdProfileHandler.Pick``; ``prefix_based_pd_decider.go``): the decode profile runs first and
  picks the decode endpoint; then the decider: with ``nonCachedTokens`` > 0, a prompt whose part
  not cached on that endpoint (its prefix match) is shorter than the threshold is served by the
  decode endpoint alone (``decode_only``); otherwise (always, with the default 0) the prefill
  profile picks the prefill endpoint. Order ``decode_first``: both choices at arrival.
* **round_robin**: each pool in turn, in Dynamo's order (a plain proxy's rotation).

Each pool has its own router instance (Dynamo runs a ``KvRouter`` per worker pool; llm-d a scheduler
profile per role), seeing only its pool's replicas (:class:`PoolView`), its pool's KV events and its
pool's responses: :class:`PDRouter` dispatches each callback by the replica's pool. Replica ids are
the fleet's (prefill replicas first). Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.cluster.router import ClusterView, Decision, ReplicaMetrics, Router, RouterRequest
from sim.core.kv_events import KVCacheEvent
from sim.core.scheduler import Scheduler

PD_ORDER = {"dynamo": "prefill_first", "llm_d": "decode_first", "round_robin": "prefill_first"}
"""The router kinds that route prefill and decode separately, and the order of their two choices."""


class PoolView(ClusterView):
    """The fleet as one pool's router sees it: the same replica ids, only the pool's replicas up."""

    def __init__(self, base: ClusterView, members: Sequence[int]) -> None:
        self.base = base
        self.members = frozenset(members)
        self.num_replicas = base.num_replicas
        self.facts = base.facts

    @property
    def now(self) -> float:
        return self.base.now

    def up(self) -> list[int]:
        return [i for i in self.base.up() if i in self.members]

    def metrics(self, replica: int) -> ReplicaMetrics:
        return self.base.metrics(replica)

    def engine(self, replica: int) -> Scheduler:
        return self.base.engine(replica)

    def pending_tokens(self, replica: int) -> int:
        return self.base.pending_tokens(replica)


@dataclass(slots=True)
class Plan:
    """One request's P/D route: its prefill replica (None: served by the decode replica alone) and,
    for ``decode_first``, its decode replica chosen at arrival."""

    prefill: int | None
    decode: int | None
    decision: Decision  # the first leg's
    decode_decision: Decision | None = None


class PDRouter(Router):
    """The two pools' routers behind one :class:`Router` (see the module docstring): ``route`` gives
    the first leg (the prefill replica, or the decode replica of a ``decode_only`` request) and
    :meth:`decode_for` the decode replica when the prefill finished."""

    def __init__(self, kind: str, prefill: Router, decode: Router, prefill_ids: Sequence[int],
                 decode_ids: Sequence[int], non_cached_tokens: int = 0) -> None:
        super().__init__(0)
        if kind not in PD_ORDER:
            raise ValueError(f"router {kind} cannot route prefill and decode separately")
        self.name = kind
        self.order = PD_ORDER[kind]
        self.pools = (prefill, decode)
        self.prefill_ids = tuple(prefill_ids)
        self.decode_ids = tuple(decode_ids)
        self._role = {i: 0 for i in prefill_ids} | {i: 1 for i in decode_ids}
        self.non_cached_tokens = non_cached_tokens
        self.needs_kv_events = prefill.needs_kv_events or decode.needs_kv_events
        # a pool that reads no events is handed none (on_kv_events): raw batches where every reader takes them
        self.raw_kv_events = all(p.raw_kv_events or not p.needs_kv_events for p in (prefill, decode))
        self.needs_metrics = prefill.needs_metrics or decode.needs_metrics
        self.keeps_cache_view = prefill.keeps_cache_view or decode.keeps_cache_view
        self._plans: dict[str, Plan] = {}

    def attach(self, view: ClusterView) -> None:
        super().attach(view)
        self.pools[0].attach(PoolView(view, self.prefill_ids))
        self.pools[1].attach(PoolView(view, self.decode_ids))

    def _pool(self, replica: int) -> Router:
        return self.pools[self._role[replica]]

    def plan(self, request: RouterRequest) -> Plan:
        """Changes state: route the request's first leg now (its arrival), once; the plan is kept
        until :meth:`route` hands it to the cluster."""
        prefill, decode = self.pools
        if self.order == "decode_first":
            d = decode.route(request)
            believed = d.believed_hit_tokens or 0
            # prefix-based-pd-decider: below the threshold of uncached tokens, no disaggregation
            if self.non_cached_tokens > 0 and request.prompt_len - believed < self.non_cached_tokens:
                p = Plan(None, d.replica, d, d)
            else:
                first = prefill.route(request)
                p = Plan(first.replica, d.replica, first, d)
        else:
            first = prefill.route(request)
            p = Plan(first.replica, None, first)
        self._plans[request.request_id] = p
        return p

    def route(self, request: RouterRequest) -> Decision:
        p = self._plans.get(request.request_id)
        if p is None:
            p = self.plan(request)
        return p.decision

    def decode_for(self, request: RouterRequest) -> Decision:
        """Changes state: the decode replica of a request whose prefill finished (``prefill_first``:
        the decode router chooses now; ``decode_first``: the arrival's choice)."""
        p = self._plans[request.request_id]
        if p.decode_decision is None:
            p.decode_decision = self.pools[1].route(request)
            p.decode = p.decode_decision.replica
        return p.decode_decision

    def on_first_token(self, request_id: str, replica: int) -> None:
        self._pool(replica).on_first_token(request_id, replica)

    def on_finish(self, request_id: str, replica: int) -> None:
        self._pool(replica).on_finish(request_id, replica)
        if self._role[replica] == 1:
            self._plans.pop(request_id, None)

    def on_kv_events(self, replica: int, events: Sequence[KVCacheEvent]) -> None:
        pool = self._pool(replica)
        if pool.needs_kv_events:
            pool.on_kv_events(replica, events)

    def on_replica_down(self, replica: int) -> None:
        self._pool(replica).on_replica_down(replica)

    def on_replica_up(self, replica: int) -> None:
        self._pool(replica).on_replica_up(replica)
