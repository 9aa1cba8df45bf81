"""A replica's KV blocks held by a P/D transfer in flight, as its engine loop sees them: the engine
keeps stepping until the transfer lands instead of declaring a stall.

Mirrors vLLM 0.33.0's engine with a KV connector: while the connector has transfers in flight the
engine keeps stepping (``has_requests`` counts them; the NIXL connector reports the reads in
``get_finished``), so a waiting request that cannot fit because blocks are held for a transfer waits
for the transfer, it does not fail. The replay's step loop has that behaviour for an offload tier's
worker (``sim.replay.kv_transfer.LinkKVWorker``: a step that schedules nothing lasts until the first
pending job is done, and it is no stall while a job is pending); :class:`HoldWorker` is such a
worker with no jobs of its own: *pending* while the replica holds blocks for a transfer, *done* at
the transfer's landing; an empty step waits until the landing or the cluster's next routing
instant, whichever comes first (vLLM's engine polls: a request arriving meanwhile is scheduled at
once). ``sim.cluster.disagg`` sets it on a replica's step runner while that replica
holds blocks for a transfer and removes it when the last one lands, so a replica without holds steps
exactly as a plain one. A replica whose engine has a connector worker of its own (a shared store's,
``sim.cluster.kv_store``) keeps it inside the hold worker (``inner``): its jobs start, land and are
reported as without holds, it keeps the engine stepping while they are pending, and an empty step
ends at the first of its landings and the holds' -- vLLM's engine with a ``MultiConnector`` (NIXL
beside the store's connector) polls every connector's ``get_finished``. Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sim.cluster.replica import Replica
from sim.core.full_attention_coordinator import UnitaryFullAttentionCoordinator
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.transfer_job import KVConnectorOutput
from sim.replay.engine import SimClock
from sim.replay.kv_transfer import ConnectorMetadataLike, LinkKVWorker
from sim.timing.transfer_link import TransferLink


class HoldWorker(LinkKVWorker):
    """The holds of one replica: request id -> landing time of the transfer holding its blocks
    (``math.inf``: not known yet -- the decode side has no blocks for the read); ``next_instant`` is
    the cluster's next routing instant (an arrival may bring this replica work), ``next_event`` the
    clock's next event anywhere and ``waiting`` whether this replica's engine has requests waiting."""

    def __init__(self, next_instant: Callable[[], float], next_event: Callable[[], float] = lambda: math.inf,
                 waiting: Callable[[], bool] = lambda: False) -> None:
        super().__init__(TransferLink(float("inf")), 0)
        self.until: dict[str, float] = {}
        self.next_instant = next_instant
        self.next_event = next_event
        self.waiting = waiting
        self.inner: LinkKVWorker | None = None  # the engine's own connector worker, if it has one

    def has_pending(self) -> bool:
        """Query: a transfer holding this replica's blocks has not landed yet -- one whose landing is
        not known counts only while requests wait here (an engine with nothing to schedule idles:
        the landing releases the blocks without it) -- or the engine's own worker has a job pending."""
        own = any(t < math.inf for t in self.until.values()) or (bool(self.until) and self.waiting())
        return own or (self.inner is not None and self.inner.has_pending())

    def start_step(self, step: int, now: float, meta: ConnectorMetadataLike | None) -> float:
        """The engine's own worker's jobs (the holds have none: the forward waits only for those)."""
        return 0.0 if self.inner is None else self.inner.start_step(step, now, meta)

    def idle_until(self, step: int, now: float) -> float:
        """Query: an empty step lasts until the first hold's transfer lands or the next routing
        instant, whichever comes first (``now`` if one is now): the engine polls, so a request routed
        here while it waits is scheduled at once, as a plain idle engine's is. While a landing is not
        known, only until the clock's next event (a decode step end may start the read). With a
        worker of its own that has jobs pending, no later than that worker's own empty step ends."""
        first = min(self.until.values()) if self.until else now
        first = min(first, self.next_instant())
        if first == math.inf or (self.until and max(self.until.values()) == math.inf):
            first = min(first, self.next_event())
        if self.inner is not None and self.inner.has_pending():
            first = min(first, self.inner.idle_until(step, now))
        return first if now < first < math.inf else now  # (never: a poll for ever; the replay's guard names it)

    def finish_step(self, step: int, end: float) -> KVConnectorOutput:
        """The engine's own worker's report (the landing itself releases a hold: ``sim.cluster.disagg``)."""
        return KVConnectorOutput(set(), set()) if self.inner is None else self.inner.finish_step(step, end)


class Holds:
    """The P/D replay's holds, by replica (mixed into ``sim.cluster.disagg.PDClusterReplay``)."""

    replicas: list[Replica]
    clock: SimClock
    holds: list[HoldWorker]
    _polls: list[tuple[float, int]]  # (time, count) of a replica's empty steps of no time
    legs: dict[str, Any]  # request id -> its sim.cluster.disagg.Leg
    _probe: Callable[[Any, Scheduler, str], Request]  # a holder of a leg's prompt blocks on one side

    def _hold_prefill(self, leg: Any) -> Request | None:
        """delay_free_blocks: the prefill's cached prompt blocks, touched by a holder until the read
        lands (None: nothing of the prompt is cached there any more). The holder is no request: the
        pool's observer (miss attribution, which reads the engine's connector state with a store)
        does not see its allocation."""
        sched = self.replicas[leg.prefill].scheduler
        kvm = sched.kv_cache_manager
        holder = self._probe(leg, sched, "prefill")
        holder.append_planned_outputs(1)  # the finished prefill: its prompt and one sampled token, so
        # the lookup (capped one token short) finds every full prompt block
        hits, local = kvm.peek_computed_blocks(holder)
        coord = kvm.coordinator
        assert isinstance(coord, UnitaryFullAttentionCoordinator)
        pool = kvm.block_pool
        observer, pool.observer = pool.observer, None
        try:
            if not local or not coord.allocate_for_load(holder, local, hits, 0, False, 0, False):
                return None
        finally:
            pool.observer = observer
        return holder

    def _hold(self, replica: int, request_id: str, until: float) -> None:
        """The replica holds blocks for a transfer landing at ``until``: its engine waits for it
        rather than stall (``sim.cluster.disagg_hold``)."""
        worker = self.holds[replica]
        worker.until[request_id] = until
        self._set_worker(replica, worker)

    def _unhold(self, replica: int, request_id: str) -> None:
        worker = self.holds[replica]
        if worker.until.pop(request_id, None) is not None and not worker.until:
            self._set_worker(replica, None)

    def _next_event(self, replica: int) -> float:
        """When an engine holding blocks for a read whose landing is not known polls: first at this
        instant (its other events, a decode step end starting that read, run before it), then at the
        clock's next event after it -- a later poll at this instant would only meet the other
        pollers' (SimPy's event queue, a heap of (time, ...) entries)."""
        now = self.clock.now
        if self._polls[replica][0] != now:
            return now
        env = self.clock.env
        first = env.peek()  # (inf when the queue is empty)
        if first > now:  # the usual case: nothing else at this instant, no scan
            return first
        return min((e[0] for e in env._queue if e[0] > now), default=math.inf)

    def _has_waiting(self, replica: int) -> bool:
        sched = self.replicas[replica]._scheduler
        return sched is not None and bool(sched.waiting)

    def _set_worker(self, replica: int, worker: HoldWorker | None) -> None:
        # the step runner of the replica's engine (built: it holds blocks); a replica without holds
        # has its own worker back (None without a connector of its own, as a plain replica)
        runner = self.replicas[replica]._runner
        assert runner is not None
        hold = self.holds[replica]
        if worker is not None and runner.kv_worker is not worker:
            hold.inner = runner.kv_worker  # (the engine's own: it runs inside the hold worker)
        runner.kv_worker = worker if worker is not None else hold.inner

    def _check_replica(self, replica: int) -> None:
        """Query: the replica's pool is consistent and every block holder is a running request, a
        request loading from a store (the connector's ``kv_holding_waiting``) or a P/D hold; raises
        AssertionError."""
        sched = self.replicas[replica].scheduler
        kvm = sched.kv_cache_manager
        kvm.check_integrity()
        held = {g.held_prefill.request_id for g in self.legs.values() if g.held_prefill is not None}
        held |= {g.held_decode.request_id for g in self.legs.values() if g.held_decode is not None}
        allowed = {r.request_id for r in sched.running} | held
        if sched.tier is not None:  # (a store's connector: requests loading from it hold their blocks)
            sched.tier.connector.check_integrity()
            allowed |= {r.request_id for r in sched.tier.kv_holding_waiting}
        extra = set(kvm.request_ids()) - allowed
        assert not extra, f"replica {replica}: blocks held by {sorted(extra)}"
