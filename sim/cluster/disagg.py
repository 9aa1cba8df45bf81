"""Prefill/decode disaggregation: a fleet split into a prefill pool and a decode pool, the KV of each
prompt moving from its prefill replica to its decode replica over a link.

Mirrors vLLM 0.33.0's P/D path with the NIXL connector in pull mode (``vllm/distributed/kv_transfer/
kv_connector/v1/nixl/pull_scheduler.py``, ``NixlPullConnectorScheduler``) behind a proxy's two
legs, one request at a time:

1. **prefill leg** -- the router's first choice (``sim.cluster.disagg_router``) gets the request with
   ``max_tokens = 1`` (the proxy's prefill request): an ordinary engine computes the prompt and
   samples one token, and finishes the request (FINISHED_LENGTH_CAPPED);
2. **the prefill keeps its blocks** -- ``request_finished`` returns ``delay_free_blocks`` for a
   request with ``do_remote_decode``: its blocks stay allocated from the prefill's finish until the
   decode side has read them (``finished_sending``), the lease (``kv_lease_duration``, 30 s) being
   renewed by the decode side's heartbeats while it has the request -- so no expiry here. The
   prompt's cached full blocks are held (touched by a holder) from the finish to the landing, then
   freed, tail first; while the decode side waits for blocks the landing is not known and the
   prefill's engine, if requests wait there, polls at the clock's events (``sim.cluster.disagg_hold``).
   Residual: the partial last block, freed by the engine at the finish, is not held (at most one
   block per read);
3. **decode side: lookup and allocation** -- ``get_num_new_matched_tokens`` reports the prompt's
   tokens not cached locally as remote (``len(prompt) - num_computed_tokens``, an async load: the
   partial last block included), the scheduler allocates their blocks without caching them
   (``allocate_slots(..., delay_cache_blocks=True)``, here ``UnitaryFullAttentionCoordinator.
   allocate_for_load``, under the request's own id) and the request waits (WAITING_FOR_REMOTE_KVS);
   the lookup's GPU-hit stats are recorded then, once. A decode pool that cannot hold the blocks yet
   keeps the request waiting, first come first served, retried at each of that replica's step ends;
4. **the transfer** -- the new blocks' bytes (``kv_bytes_per_block`` each; the blocks
   ``update_state_after_alloc`` hands the worker: the unhashed ones, not the local hit) cross the
   decode replica's link (:class:`~sim.timing.transfer_link.TransferLink`, FIFO: the decode worker
   reads one request's blocks after the other's, ``latency_s + bytes / bandwidth`` each). While
   blocks are held for a read, the replica's engine waits for its landing instead of stalling
   (``sim.cluster.disagg_hold``);
5. **landing** -- ``finished_recving``: ``_update_waiting_for_remote_kv`` caches the loaded full
   blocks (``cache_blocks(request, num_computed_tokens)``, BlockStored events on the decode replica)
   and, the whole prompt being computed, sets ``num_computed_tokens = len(prompt) - 1`` (a full
   prompt hit recomputes its last token to sample the next). The request joins the decode replica's
   engine at once owning the loaded blocks with those computed tokens; it admits it without a lookup
   (vLLM looks a waiting request up only at ``num_computed_tokens == 0``; ``sim.core.scheduler``'s
   plain waiting loop does the same), computing one token (``decode_hit_tokens`` = prompt - 1). The
   landed requests stay first in the waiting queue, in order (``Scheduler.schedule`` in
   ``vllm/v1/core/sched/scheduler.py`` takes ``kv_holding_waiting`` before ``waiting``).

A transfer of zero seconds (an infinite bandwidth, no latency, an idle lane, decode blocks free at
once) lands in the instant the prefill finished, without holding the prefill's blocks: then the prefill
pool sees exactly the engine operations of a plain fleet whose requests have one output token
(tested: each request's hit tokens equal that replay's, on the same prefill choices). A read that
waits for decode blocks holds the prefill's blocks meanwhile, as vLLM does, and the pools differ.

TTFT runs from the user's arrival to the decode replica's first token (the prefill queue, the
prefill, the transfer and the decode's admission); TPOT is the decode side's. Every replica steps
without fast-forward windows (a landing may come at any instant, not only at arrivals).
Miss attribution (``sim.cluster.fleet_attribution``) observes the prefill pool, where the prefix hit
happens: a request's causes are its prefill leg's (its prompt less its prefill hit; routed_away
looks at the other prefill replicas); the decode pool's loads are no misses and are not observed.
With a shared store (``sim.experiment.cluster_store``) or its own CPU tier a prefill reads and
writes it as a plain replica does (a decode's connector offers the blocks it received); the read
to the decode side stays this path. Not modelled here (refused by the config): faults, attribution
with decode-only serving, hybrid KV groups. Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from sim.cluster.cluster import ClusterReplay, ClusterResult
from sim.cluster.disagg_hold import Holds, HoldWorker
from sim.cluster.disagg_router import PDRouter
from sim.cluster.disagg_summary import merge_legs
from sim.cluster.replica import ReplicaSpec
from sim.cluster.router import RouterRequest
from sim.core.full_attention_coordinator import UnitaryFullAttentionCoordinator
from sim.core.request import WAITING, Request
from sim.core.scheduler import Scheduler
from sim.replay.attribution_records import check_attribution
from sim.replay.errors import ReplayError
from sim.replay.intake import trace_int
from sim.replay.step_runner import Wait
from sim.timing.transfer_link import TransferLink
from workloads.trace_format import TraceRequest

PREFILL, WAIT_BLOCKS, IN_TRANSFER, DECODE = 0, 1, 2, 3
"""A request's P/D phase: its prefill leg running, waiting for decode blocks, its KV on the link,
and on the decode replica (or served there alone)."""


@dataclass(frozen=True)
class DisaggSpec:
    """The first ``prefill`` replicas prefill, the next ``decode`` decode; each decode replica reads
    over its own link of ``link_gb_s`` GB/s (``math.inf``: instantaneous) with ``latency_s`` per
    transfer; ``bytes_per_block[i]`` is replica ``i``'s KV bytes per block (all layers)."""

    prefill: int
    decode: int
    link_gb_s: float
    latency_s: float = 0.0
    bytes_per_block: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.prefill < 1 or self.decode < 1:
            raise ValueError("disaggregation needs at least one prefill and one decode replica")
        if not self.link_gb_s > 0:
            raise ValueError(f"link bandwidth must be > 0 GB/s, got {self.link_gb_s}")


@dataclass(slots=True)
class Leg:
    """One request's P/D record (times in seconds on the clock; NaN until they happen)."""

    rr: RouterRequest
    prefill: int  # -1: served by the decode replica alone
    decode: int = -1
    phase: int = PREFILL
    prefill_finish: float = math.nan
    transfer_start: float = math.nan
    landed: float = math.nan
    transfer_bytes: int = 0
    held_prefill: Request | None = None  # the prefill blocks kept for the read (delay_free_blocks)
    held_decode: Request | None = None  # the decode blocks allocated for the load
    hold_tried: bool = False  # the prefill's blocks were held (or nothing of them was cached)


class PDClusterReplay(ClusterReplay, Holds):
    """A :class:`~sim.cluster.cluster.ClusterReplay` whose replicas form a prefill and a decode pool
    (see the module docstring); ``router`` routes both pools."""

    def __init__(self, specs: Sequence[ReplicaSpec], router: PDRouter, requests: Iterable[TraceRequest], *,
                 disagg: DisaggSpec, **kwargs: Any) -> None:
        n = disagg.prefill + disagg.decode
        if len(specs) != n:
            raise ValueError(f"disaggregation of {disagg.prefill} + {disagg.decode} replicas, fleet of {len(specs)}")
        if kwargs.get("faults") or (kwargs.get("attribution", "off") != "off" and router.non_cached_tokens):
            raise ValueError("a disaggregated fleet takes no faults, nor miss attribution with decode-only serving")
        specs = [replace(s, fast_forward=False) for s in specs]  # landings come at any instant
        # the engines' own check forbids blocks held outside running requests, which the P/D holds are:
        # the pool's check and the holder rule with them allowed run here instead (_check_replica)
        self.check_pd = bool(kwargs.pop("integrity_check", False))
        super().__init__(specs, router, requests, **kwargs)
        for d in range(disagg.prefill, n):  # miss attribution: where the prefix hit happens, the prefill
            self.replicas[d].spec = specs[d]  # pool (a decode pool's loads are no misses): unobserved
        self.pd = router
        self.disagg = disagg
        self.decode_ids = range(disagg.prefill, n)
        self.links = {d: TransferLink(disagg.link_gb_s, disagg.latency_s) for d in self.decode_ids}
        self.legs: dict[str, Leg] = {}
        self._awaiting: dict[int, deque[Leg]] = {d: deque() for d in self.decode_ids}
        self._admitting: dict[int, list[Leg]] = {d: [] for d in self.decode_ids}  # landed, blocks still held
        self.holds = [HoldWorker(lambda: self.next_time, partial(self._next_event, i), partial(self._has_waiting, i))
                      for i in range(n)]
        self._empty = {d: (-1.0, 0) for d in self.decode_ids}  # (time, count) of empty steps there
        self._polls = [(-1.0, 0)] * n  # (time, count) of empty steps of no time, per replica
        self._open = 0  # prefill legs not yet landed
        self._routing: str | None = None

    # -- the first leg -------------------------------------------------------------------------
    def _route(self, rr: RouterRequest, tr: TraceRequest) -> None:
        if self.pipeline is not None:
            self.pipeline.deliver_until(self.clock.now)
        plan = self.pd.plan(rr)  # (route() below hands the cluster this plan's first leg)
        rid = rr.request_id
        if plan.prefill is None:  # llm-d's decider: the decode replica serves it alone
            self.legs[rid] = Leg(rr, -1, plan.decode if plan.decode is not None else -1, DECODE)
            super()._route(rr, tr)
            return
        self.legs[rid] = Leg(rr, plan.prefill)
        self._open += 1
        self._routing = rid
        try:  # the proxy's prefill request: max_tokens = 1
            super()._route(rr, replace(tr, output_tokens=1))
        finally:
            self._routing = None

    def finished(self, replica: int, request_id: str) -> None:
        leg = self.legs.get(request_id)
        if leg is None or leg.phase != PREFILL or replica != leg.prefill:
            if leg is not None and leg.held_decode is not None:  # finished before a step saw it admitted
                self._release_decode(leg)
            super().finished(replica, request_id)
            return
        if self._routing == request_id:  # refused at the prefill's intake: the request ends here
            leg.phase = DECODE
            self._open -= 1
            super().finished(replica, request_id)
            return
        del self._outstanding[replica][request_id]
        self.router.on_finish(request_id, replica)
        now = self.clock.now
        leg.prefill_finish = now
        if self.pipeline is not None:
            self.pipeline.deliver_until(now)
        leg.decode = self.pd.decode_for(leg.rr).replica
        leg.phase = WAIT_BLOCKS
        self._awaiting[leg.decode].append(leg)
        self._allocate(leg.decode)
        if leg.phase == WAIT_BLOCKS:  # delay_free_blocks from the prefill's finish: held while the
            # decode side waits for blocks (its heartbeats renew the lease), landing not known yet
            leg.held_prefill = self._hold_prefill(leg)
            leg.hold_tried = True
            if leg.held_prefill is not None:
                self._hold(leg.prefill, request_id, math.inf)

    # -- holds ---------------------------------------------------------------------------------
    def _probe(self, leg: Leg, sched: Scheduler, side: str) -> Request:
        """A holder of ``leg``'s prompt blocks on one side (hashed as that replica hashes); the
        decode side's holds them under the request's own id, which takes them over at landing."""
        tr = leg.rr.trace
        rid = tr.id if side == "decode" else f"{tr.id}\x00pd-{side}"
        return Request(rid, tr.tokens, trace_int(tr, "output_tokens", tr.output_tokens),
                       cache_salt=tr.salt, lora_name=tr.lora, prompt_logprobs=bool(tr.prompt_logprobs),
                       hasher=sched.hasher if sched.cache_config.enable_prefix_caching else None)

    def _release_decode(self, leg: Leg) -> None:
        """The landed request holds the load's blocks itself now (admitted, finished or preempted):
        only the engine's wait for them ends."""
        leg.held_decode = None
        self._unhold(leg.decode, leg.rr.request_id)

    # -- decode side ---------------------------------------------------------------------------
    def _allocate(self, d: int) -> None:
        """Start the reads the decode replica ``d`` has blocks for, first come first served."""
        queue = self._awaiting[d]
        if not queue:
            return
        sched = self.replicas[d].scheduler
        kvm = sched.kv_cache_manager
        coord = kvm.coordinator
        assert isinstance(coord, UnitaryFullAttentionCoordinator)
        bs = sched.cache_config.block_size
        while queue:
            leg = queue[0]
            probe = self._probe(leg, sched, "decode")
            hits, local = kvm.peek_computed_blocks(probe)
            remote = probe.num_tokens - local  # get_num_new_matched_tokens: the prompt not cached here
            too_big = -(-probe.num_tokens // bs) >= kvm.block_pool.num_gpu_blocks  # (its intake refuses it)
            if not too_big and not coord.allocate_for_load(probe, local, hits, remote, False, 0, True):
                return  # the head waits for blocks (vLLM: the waiting queue's head blocks admission)
            queue.popleft()
            if not too_big:  # the lookup's GPU-hit stats, once, at the load's allocation (vLLM 0.33)
                kvm.record_prefix_cache_stats(probe, local)
                if sched.tier is not None:  # a connector of its own learns the blocks now (vLLM: a
                    # MultiConnector's update_state_after_alloc; a store job reading one is flushed)
                    sched.tier.connector.update_state_after_alloc(probe, kvm.get_blocks(probe.request_id), 0)
            now = self.clock.now
            leg.held_decode = None if too_big else probe
            leg.transfer_start = now
            leg.transfer_bytes = (-(-probe.num_tokens // bs) - local // bs) * self.disagg.bytes_per_block[d]
            done = self.links[d].submit(now, leg.transfer_bytes, load=True)
            leg.phase = IN_TRANSFER
            if done <= now:  # no time on the link: nothing is held across it
                self._land(leg)
                continue
            wait = done - now
            at = now + wait  # the instant the clock reaches (now + delay), which may be an ulp off done:
            # the holds' engines wait for this one, or they would poll at done for a landing still ahead
            if not leg.hold_tried:  # (read at the prefill's finish: held from now)
                leg.held_prefill = self._hold_prefill(leg)
                leg.hold_tried = True
            if leg.held_prefill is not None:
                self._hold(leg.prefill, leg.rr.request_id, at)
            if leg.held_decode is not None:
                self._hold(d, leg.rr.request_id, at)
            self.clock.start(self._landing(leg, wait))

    def _landing(self, leg: Leg, wait: float) -> Iterator[Wait]:
        yield wait
        self._land(leg)

    def _land(self, leg: Leg) -> None:
        """``finished_recving``: cache the loaded blocks (still held, until the decode step that
        admits the request), release the prefill's, hand the request to the decode replica."""
        d = leg.decode
        rid = leg.rr.request_id
        if leg.held_decode is not None:  # (its hold stays pending until a step admits the request)
            self.replicas[d].scheduler.kv_cache_manager.cache_blocks(leg.held_decode, leg.held_decode.num_tokens)
            self._admitting[d].append(leg)
        if leg.held_prefill is not None:
            self.replicas[leg.prefill].scheduler.kv_cache_manager.free(leg.held_prefill)
            leg.held_prefill = None
            self._unhold(leg.prefill, rid)
        leg.landed = self.clock.now
        leg.phase = DECODE
        self._open -= 1
        rr = leg.rr
        self._outstanding[d][rid] = rr
        self._where[rid] = d
        replica = self.replicas[d]
        if replica.intake.push(replace(rr.trace, arrival=leg.landed)):
            if leg.held_decode is not None:  # _update_waiting_for_remote_kv: the whole prompt is
                # computed, and a full prompt hit recomputes its last token to sample the next one;
                # it waits in the engine now, ahead of the requests that hold no blocks
                request = replica.intake.pending.pop()
                request.num_computed_tokens = request.num_tokens - 1
                replica.scheduler.add_request(request)
                if replica.scheduler.tier is not None:  # (its connector: the read is its GPU prefix)
                    replica.scheduler.tier.connector.state(rid).num_locally_computed_tokens = request.num_tokens - 1
                self._front(d)
            replica.wake()
        else:
            if leg.held_decode is not None:
                replica.scheduler.kv_cache_manager.free(leg.held_decode)
                self._admitting[d].remove(leg)
                self._release_decode(leg)
            self.finished(d, rid)
        if not self._open:
            self._check_done()

    # -- cluster hooks -------------------------------------------------------------------------
    def step_end(self, replica: int, row: tuple[Any, ...]) -> None:
        super().step_end(replica, row)
        if replica >= self.disagg.prefill:
            self._admitted(replica, row)
            if self._awaiting[replica]:
                self._allocate(replica)
        if self.check_pd:
            self._check_replica(replica)
        if row[3] == 0 and row[2] == 0.0:  # an empty step of no time: a hold polled at its landing
            t, k = self._polls[replica]
            k = k + 1 if t == row[1] else 1  # (the polls at this instant, this one included)
            self._polls[replica] = (row[1], k)
            if k > 1001:  # (a landing is due in this instant; it cannot take a thousand polls)
                raise ReplayError(f"replica {replica} at t={row[1]:.6f}s: its engine polls for a P/D transfer "
                                  "that does not land")

    def _admitted(self, d: int, row: tuple[Any, ...]) -> None:
        """After a step of ``d``: release the holds of the loads whose request it admitted (the
        request holds the blocks now), and put the landed requests that still wait first in the
        waiting queue, in landing order -- vLLM's ``Scheduler.schedule`` takes ``kv_holding_waiting``
        before ``waiting`` while it has requests, so a loaded request is never stuck behind one
        that needs blocks it holds."""
        landed = self._admitting[d]
        if not landed:
            return
        sched = self.replicas[d].scheduler
        keep: list[Leg] = []
        for leg in landed:
            if leg.held_decode is None:
                continue  # (finished and released already)
            r = sched.requests.get(leg.rr.request_id)
            if r is not None and r.status != WAITING:  # admitted (then maybe preempted); None: in the intake
                self._release_decode(leg)
            else:
                keep.append(leg)
        self._admitting[d] = keep
        queued = self._front(d)
        if row[3] == 0 and row[2] == 0.0 and queued:  # an empty step although loaded requests wait
            t, n = self._empty[d]
            self._empty[d] = (row[1], n + 1 if t == row[1] else 1)
            if self._empty[d][1] > 3:
                raise ReplayError(f"decode replica {d} at t={row[1]:.6f}s: {queued} loaded requests hold "
                                  f"their blocks and none can be admitted; the pool is too small for the reads "
                                  f"in flight (more decode replicas or blocks)")

    def _front(self, d: int) -> int:
        """Put the landed requests waiting on ``d`` first in its waiting queue, in their order
        (``kv_holding_waiting`` before ``waiting``); returns how many wait."""
        ids = {leg.rr.request_id for leg in self._admitting[d] if leg.held_decode is not None}
        if not ids:  # (no scan of the waiting queue after each step once every load was admitted)
            return 0
        sched = self.replicas[d].scheduler
        queued = [r for r in sched.waiting if r.request_id in ids]
        if queued:
            sched.waiting.remove_where(lambda r: r.request_id in ids)
            for r in reversed(queued):
                sched.waiting.prepend(r)
        return len(queued)

    def _check_done(self) -> None:
        if not self._open:  # a request in flight between the pools may still reach a decode replica
            super()._check_done()

    def run(self) -> ClusterResult:
        result = super().run()
        if self._open:
            raise RuntimeError(f"{self._open} requests never reached a decode replica")
        return result

    def _result(self, wall: float) -> ClusterResult:
        res = super()._result(wall)
        kv = {"batches": self.pipeline.num_batches, "events": self.pipeline.num_events} if self.pipeline else {}
        res = merge_legs(res, self.legs, self._where, self._trace, prefill_ids=range(self.disagg.prefill),
                         router_info=self.router_info, ttft_slo_s=self.ttft_slo_s, kv=kv,
                         stats=[r.rec.stats for r in self.replicas], sim_time_s=max(r.end_time for r in self.replicas),
                         num_evictions=sum(r.total_evictions for r in self.replicas))
        if self.check_pd and self.attributions is not None:
            check_attribution(res.requests)  # each request's causes: its prefill leg's missed tokens
        return res
