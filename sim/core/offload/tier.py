"""The scheduler's side of the offload connector (mirrors the connector hunks of vLLM 0.33.0's
``vllm/v1/core/sched/scheduler.py``): the ``kv_holding_waiting`` queue, finished loads,
in-flight prefills, async scheduling's deferred block frees, and the hooks
``sim.core.scheduler.Scheduler`` calls when it has a connector (``CacheConfig.offload``).

* ``defer_block_free`` is on with async scheduling (vLLM: ``kv_role="kv_both"`` is a KV consumer
  and ``max_concurrent_batches > 1``): a finished or preempted request's blocks whose last scheduled
  step is still in flight go to ``deferred_frees`` and return to the pool (reversed, tail first)
  once that step's output was processed (``_drain_deferred_frees``); a running request in that
  state is not preempted (``_request_blocks_can_be_freed``). It is off without a connector.
* ``sched_step_seq`` counts non-empty scheduled steps, ``processed_step_seq`` non-empty processed
  ones; a request's ``last_sched_seq`` is the seq of the last step that scheduled it.
* ``inflight_prefills``: requests still prefilling (admitted with prompt left, or loading), by id
  (a dict: compiled requests are not hashable);
  an async load must leave their remaining blocks free (``_inflight_prefill_reserved_blocks``).

Imports nothing above ``sim.core``.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from sim.core.full_attention_coordinator import UnitaryFullAttentionCoordinator
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.offload.connector import OffloadingConnectorScheduler
from sim.core.offload.events import OffloadingEventsTracker
from sim.core.offload.host import SchedulerHost
from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.core.request import WAITING_FOR_REMOTE_KVS, Request
from sim.core.request_queue import RequestQueue, create_request_queue
from sim.core.transfer_job import KVConnectorOutput

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.offload.manager_impl import OffloadingManager
    from sim.core.scheduler_output import SchedulerOutput


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class OffloadTier:
    """The connector state a :class:`~sim.core.scheduler.Scheduler` with an offload tier keeps."""

    def __init__(self, sched: SchedulerHost, manager: OffloadingManager | None = None) -> None:
        """``manager``: the connector's CPU-tier manager when built already (a fleet's shared store,
        ``sim.cluster.kv_store``); None: the connector builds its own from ``CacheConfig.offload``."""
        cache = sched.cache_config
        offload = cache.offload
        assert offload is not None
        if cache.kv_groups:
            raise ValueError("the CPU offload tier models one full-attention KV group (kv_groups must be empty)")
        if not sched.profile.stats_at_admission:
            raise ValueError("the CPU offload tier is vLLM 0.33.0's: SchedulerConfig.profile must be 0.33.0")
        if not cache.enable_prefix_caching:
            raise ValueError("the CPU offload tier needs prefix caching")
        coord = sched.kv_cache_manager.coordinator
        assert isinstance(coord, UnitaryFullAttentionCoordinator)
        self.sched = sched
        self.coordinator = coord
        self.connector = OffloadingConnectorScheduler(offload, cache.block_size, manager=manager)
        self.kv_holding_waiting: RequestQueue = create_request_queue(sched.config.policy)
        self.finished_recving: set[str] = set()
        self.inflight_prefills: dict[str, Request] = {}
        self.defer_block_free = sched.config.async_scheduling
        self.sched_step_seq = 0
        self.processed_step_seq = 0
        self.deferred_frees: deque[tuple[int, list[KVCacheBlock]]] = deque()
        # vLLM's Scheduler.connector_prefix_cache_stats (external_prefix_cache_queries/hits), and
        # the first admissions' prompt tokens by source (vllm:prompt_tokens_by_source)
        self.external_prefix_cache_stats = PrefixCacheStats()
        self.prompt_tokens_local_hit = 0
        self.prompt_tokens_external = 0
        self.prompt_tokens_computed = 0
        # the CPU tier's KV events (sim.core.offload.events), once the engine's KV events are on
        self.kv_events: OffloadingEventsTracker | None = None

    # -- queries ------------------------------------------------------------------------------
    def has_pending_work(self) -> bool:
        """Query: requests hold blocks while waiting, or connector jobs are in flight."""
        return bool(self.kv_holding_waiting) or self.connector.has_pending_push_work()

    def request_remaining_blocks(self, request: Request) -> int:
        """Query: blocks ``request`` still needs to hold its full sequence (vLLM
        ``_request_remaining_blocks``: it already holds blocks, so no new hits)."""
        full = min(request.num_tokens, self.sched.config.max_model_len)
        held = len(self.coordinator.get_blocks(request.request_id))
        return max(_cdiv(full, self.coordinator.block_size) - held, 0)

    def inflight_prefill_reserved_blocks(self) -> int:
        """Query: the blocks in-flight prefills still need (vLLM ``_inflight_prefill_reserved_blocks``)."""
        return sum(self.request_remaining_blocks(r) for r in self.inflight_prefills.values())

    def blocks_can_be_freed(self, request: Request) -> bool:
        """Query: vLLM ``_request_blocks_can_be_freed`` -- no in-flight step may still write them."""
        return not self.defer_block_free or request.last_sched_seq <= self.processed_step_seq

    def victim_can_be_freed(self, running: list[Request]) -> bool:
        """Query: whether the request the running loop would preempt next (priority: the max of
        ``(priority, arrival_time)``; FCFS: the last) can free its blocks now."""
        if not self.defer_block_free:
            return True
        if self.sched.config.policy == "priority":
            return self.blocks_can_be_freed(max(running, key=lambda r: (r.priority, r.arrival_time)))
        return self.blocks_can_be_freed(running[-1])

    @staticmethod
    def holds_kv_blocks(request: Request) -> bool:
        """Query: vLLM ``_holds_kv_blocks`` for a waiting request."""
        return request.num_computed_tokens > 0 or request.status == WAITING_FOR_REMOTE_KVS

    # -- hooks --------------------------------------------------------------------------------
    def free_blocks(self, request: Request) -> None:
        """Free a finished or preempted request's blocks, deferred while a step that scheduled it
        is in flight (vLLM ``_free_request_blocks``)."""
        self.inflight_prefills.pop(request.request_id, None)
        if self.blocks_can_be_freed(request):
            self.sched.kv_cache_manager.free(request)
            return
        blocks = self.coordinator.pop_blocks_for_free(request.request_id)
        if blocks:
            self.deferred_frees.append((self.sched_step_seq, blocks))

    def request_finished(self, request: Request) -> None:
        """A request finished, before its blocks are freed (vLLM ``_connector_finished``)."""
        self.connector.request_finished(request)

    def after_schedule(self, out: SchedulerOutput) -> None:
        """End of ``schedule()`` (phase C done): the connector metadata, then the step fence
        (vLLM: ``build_connector_meta``, ``sched_step_seq += 1`` for a non-empty step,
        ``_update_after_schedule``'s ``last_sched_seq`` and in-flight-prefill bookkeeping)."""
        if self.kv_events is None and self.sched.kv_cache_manager.block_pool.event_sink is not None:
            self._start_kv_events()  # (the replay sets the pool's sink after building the engine)
        out.kv_connector_metadata = self.connector.build_connector_meta(out)
        if self.defer_block_free and out.total_num_scheduled_tokens > 0:
            self.sched_step_seq += 1
        seq = self.sched_step_seq
        for s in out.scheduled:
            r = s.request
            if self.defer_block_free:
                r.last_sched_seq = seq
            if not r.is_prefill_chunk:
                self.inflight_prefills.pop(r.request_id, None)

    def before_output(self, out: SchedulerOutput) -> None:
        """Start of ``update_from_output``: the step's writes are done, so deferred blocks whose
        fence it passed return to the pool (vLLM ``_drain_deferred_frees``, reversed: tail first)."""
        if not (self.defer_block_free and out.total_num_scheduled_tokens > 0):
            return
        self.processed_step_seq += 1
        pool = self.sched.kv_cache_manager.block_pool
        while self.deferred_frees and self.deferred_frees[0][0] <= self.processed_step_seq:
            _, blocks = self.deferred_frees.popleft()
            pool.free_blocks(blocks[::-1])

    def update_from_kv_xfer_finished(self, kv_out: KVConnectorOutput) -> None:
        """End of ``update_from_output``: completed jobs, then finished loads (vLLM
        ``_update_from_kv_xfer_finished``)."""
        self.connector.update_connector_output(kv_out)
        requests = self.sched.requests
        for rid in kv_out.finished_recving:
            req = requests.get(rid)
            if req is not None and req.status == WAITING_FOR_REMOTE_KVS:
                self.finished_recving.add(rid)
        if self.kv_events is not None:
            self._publish_kv_events()

    def _start_kv_events(self) -> None:
        """The engine's KV events are on: the manager records its raw events and the connector
        snapshots payloads from now on (vLLM ``enable_events`` / ``OffloadingEventsTracker``)."""
        conn = self.connector
        if conn.events_tracker is None:  # (a fleet's shared store comes with its own: sim.cluster.kv_store)
            conn.events_tracker = OffloadingEventsTracker(
                conn.block_size, conn.blocks_per_chunk, conn.config.self_describing_kv_events
            )
        self.kv_events = conn.events_tracker
        if conn.manager.events is None:  # (a shared manager's list is started once, by its first replica)
            conn.manager.events = []

    def _publish_kv_events(self) -> None:
        """End of ``update_from_output``: the tier's events since the last call go to the pool's
        sink after the pool's own (vLLM ``Scheduler.update_from_output``: ``kv_cache_manager.
        take_events()``, then ``connector.take_events()``, one batch). The pool emits as it goes, so
        the stream order is vLLM's. Sinks tag an event with ``step_index``, which ``schedule()``
        already advanced: a synchronous engine's tier events are tagged with the step whose output
        this is, so they join that step's batch as in vLLM; with async scheduling the next step was
        scheduled before this output, and they keep the advanced index, as the pool's events of
        this ``update_from_output`` do (batches stay in step order)."""
        manager = self.connector.manager
        raw = manager.events
        sched = self.sched
        sink = sched.kv_cache_manager.block_pool.event_sink
        if not raw or sink is None or self.kv_events is None:
            return
        manager.events = []
        shift = 0 if sched.config.async_scheduling else 1
        sched.step_index -= shift
        try:
            for event in self.kv_events.take_events(raw):
                sink(event)
        finally:
            sched.step_index += shift

    def update_waiting_for_remote_kv(self, request: Request) -> None:
        """A finished load's blocks enter the GPU prefix cache; a whole-prompt load recomputes its
        last token (vLLM ``_update_waiting_for_remote_kv``)."""
        self.sched.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving.remove(request.request_id)

    def check_integrity(self) -> None:
        """Query: the pool's (blocks whose free is deferred count as held), the connector's; every
        kv-holding waiting request holds blocks."""
        self.coordinator.check_integrity([b for _, blocks in self.deferred_frees for b in blocks])
        self.connector.check_integrity()
        for r in self.kv_holding_waiting:
            assert self.holds_kv_blocks(r), f"{r.request_id} in kv_holding_waiting holds no KV"
            assert r.request_id in self.coordinator.req_to_blocks, f"{r.request_id} holds no blocks"
