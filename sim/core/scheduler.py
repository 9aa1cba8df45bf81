"""The v1 scheduler (mirrors ``Scheduler.schedule`` / ``update_from_output`` of vLLM 0.25.1's
``vllm/v1/core/sched/scheduler.py``, synchronous mode, and its ``AsyncScheduler``), over the one
:class:`~sim.core.kv_cache_manager.KVCacheManager` that ``KVCacheManager.from_configs`` builds for
the configs (one full-attention group, or the sliding-window / hybrid groups of ``CacheConfig.kv_groups``).

One ``schedule()`` call is one engine step:

A. **Running requests** in ``running`` order while the token budget lasts: ask for
   ``num_tokens - num_computed`` tokens (capped by ``long_prefill_token_threshold``, the budget and
   ``max_model_len``); if ``allocate_slots`` fails, preempt -- FCFS: the *last* of ``running``
   (possibly the request itself); priority: the max of ``(priority, arrival_time)``, refunding it if
   it was already scheduled this step -- and retry; if the request preempted itself, stop.
B. **Waiting requests**, only if nothing was preempted this step: stop at ``max_num_seqs`` (before
   any lookup), look the head up (``get_computed_blocks`` records stats *every* time), ask for
   ``num_tokens - hits`` tokens (threshold, budget; without chunked prefill stop if it does not
   fit), allocate with the full-sequence gate and the watermark; on failure **stop** (head-of-line
   blocking); on success move it to ``running`` with ``num_computed_tokens = hits``.
C. ``num_computed_tokens += scheduled`` for everything scheduled (at schedule time).

``update_from_output`` appends one sampled token to every request whose prefill is complete,
stops it at ``max_tokens`` or ``max_model_len``, and frees finished requests immediately, in the
order they were scheduled.

Async mode (``SchedulerConfig.async_scheduling``): every request that samples gets an output
placeholder at schedule time, so the next step is planned before the token is known; blocks the
token completes are cached when it arrives (``update_from_output``), and a request whose in-flight
step already reaches ``max_tokens`` is not scheduled again.

Version differences (``SchedulerConfig.profile``, :mod:`sim.core.version_profile`, read from 0.33.0's
``schedule`` / ``_preempt_request`` / ``update_from_output``): threshold 0 for a lone request; the
waiting loop stops at ``max_num_active_seqs``, skips a request whose stale output is in flight,
records stats once per admission; the prefill cadence; priority preemption scans on.

The scheduler knows nothing about time: executors (simulated or real) turn a
:class:`~sim.core.scheduler_output.SchedulerOutput` into a step duration and sampled tokens.
Imports neither simpy nor torch.
"""

from __future__ import annotations

from sim.core.config import CacheConfig, SchedulerConfig
from sim.core.hashing import BlockHasher
from sim.core.kv_cache_coordinator import NO_HITS
from sim.core.kv_cache_manager import KVCacheManager
from sim.core.kv_events import EventSink
from sim.core.offload.admission import schedule_waiting
from sim.core.offload.manager_impl import OffloadingManager
from sim.core.offload.tier import OffloadTier
from sim.core.prefill_cadence import PrefillCadence
from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.core.request import FINISHED_LENGTH_CAPPED, PREEMPTED, RUNNING, Request, RequestStatus
from sim.core.request_queue import RequestQueue, create_request_queue
from sim.core.scheduler_checks import check_scheduler
from sim.core.scheduler_output import ScheduledRequest, SchedulerOutput
from sim.core.transfer_job import KVConnectorOutput


class Scheduler:
    """vLLM v1 scheduling over a :class:`KVCacheManager`."""

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        hasher: BlockHasher | None = None,
        *,
        log_stats: bool = True,
        event_sink: EventSink | None = None,
        offload_manager: OffloadingManager | None = None,
    ) -> None:
        self.config = scheduler_config
        self.cache_config = cache_config
        self.kv_cache_manager = KVCacheManager.from_configs(
            scheduler_config, cache_config, log_stats=log_stats, event_sink=event_sink
        )
        hash_bs = self.kv_cache_manager.hash_block_size
        if hasher is not None and hasher.block_size != hash_bs:
            raise ValueError(f"hasher block size {hasher.block_size} differs from the hash block size {hash_bs}")
        self.hasher = hasher
        self.requests: dict[str, Request] = {}
        self.waiting: RequestQueue = create_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.step_index = 0
        self.num_preemptions = 0
        self.profile = scheduler_config.profile
        # async under 0.33: in-flight tokens per request, made stale by a preemption (see _preempt)
        self.track_in_flight = scheduler_config.async_scheduling and self.profile.stale_output_skip
        self.cadence = PrefillCadence(scheduler_config.prefill_schedule_interval)
        self.deferred_waiting: set[str] = set()  # vLLM 0.33 deferred_waiting: skipped, not yet admitted
        # vLLM 0.33.0's offload connector path (sim.core.offload.tier), None without CacheConfig.offload;
        # offload_manager: its manager built already (a fleet's shared store), else the connector builds one
        self.tier: OffloadTier | None = None if cache_config.offload is None else OffloadTier(self, offload_manager)

    @property
    def event_sink(self) -> EventSink | None:
        """Query: where the pool's KV events go now (None: not recorded); the pool's own attribute,
        so a sink set on the pool later (``Replay(record_events=True)``) is the one read here."""
        return self.kv_cache_manager.block_pool.event_sink

    # -- requests -----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Changes state: queue a new request (its id must be new)."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.waiting.add(request)
        self.requests[request.request_id] = request
        if self.tier is not None:
            self.tier.connector.on_new_request(request)

    def has_unfinished_requests(self) -> bool:
        """Query: anything waiting (blocks held or not) or running."""
        tier = self.tier
        return bool(self.waiting) or bool(self.running) or (tier is not None and bool(tier.kv_holding_waiting))

    def has_requests(self) -> bool:
        """Query: vLLM's ``has_requests`` -- unfinished ones, finished ones not yet reported, or
        offload jobs in flight (the engine keeps stepping: ``has_pending_push_work``)."""
        return self.has_unfinished_requests() or bool(self.finished_req_ids) or (
            self.tier is not None and self.tier.connector.has_pending_push_work())

    def get_num_unfinished_requests(self) -> int:
        """Query: waiting (blocks held or not) plus running."""
        return len(self.waiting) + len(self.running) + (0 if self.tier is None else len(self.tier.kv_holding_waiting))

    # -- scheduling ---------------------------------------------------------------------------
    def long_prefill_threshold(self) -> int:
        """Query: this step's ``long_prefill_token_threshold`` -- 0 under 0.33 when one request is
        present (``schedule``: ``num_running + num_waiting <= 1``, nobody to starve)."""
        if self.profile.threshold_off_when_alone and self.get_num_unfinished_requests() <= 1:
            return 0
        return self.config.long_prefill_token_threshold

    def schedule(self) -> SchedulerOutput:
        """Changes state: plan one engine step, phases A-C of the module docstring."""
        cfg = self.config
        kvm = self.kv_cache_manager
        token_budget = cfg.max_num_batched_tokens
        threshold = self.long_prefill_threshold()
        cadence = self.cadence
        hold = cadence.holds(self.running)  # vLLM 0.33 defer_prefills (local prefill cadence)
        carried_prefill = False
        scheduled_running: list[ScheduledRequest] = []
        scheduled_new: list[ScheduledRequest] = []
        preempted: list[Request] = []

        # A. running requests
        req_index = 0
        scans_on = self.profile.priority_preemption_scans_on
        bulk_decodes = not cfg.async_scheduling and not hold  # (async decodes have a token in flight)
        while req_index < len(self.running) and token_budget > 0:
            if bulk_decodes:
                # ready decodes in one go: for each, the per-request path below would ask for one
                # token and allocate_slots' hot path would return [] having changed nothing
                k = kvm.num_ready_decodes(self.running, req_index, token_budget, cfg.max_model_len)
                if k:
                    for request in self.running[req_index : req_index + k]:
                        scheduled_running.append(ScheduledRequest(request, 1, request.num_computed_tokens, []))
                    token_budget -= k
                    req_index += k
                    continue
            request = self.running[req_index]
            placeholders = request.num_output_placeholders
            if (
                placeholders > 0
                and request.num_computed_tokens + 2 - placeholders >= request.num_prompt_tokens + request.max_tokens
            ):
                req_index += 1  # async: the in-flight step already reaches max_tokens
                continue
            if hold and request.is_prefill_chunk:
                req_index += 1  # the cadence defers this prefill chunk; decodes still run
                continue
            num_new = request.num_tokens + placeholders - request.num_computed_tokens
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, token_budget, cfg.max_model_len - request.num_computed_tokens - 1)
            if num_new <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = kvm.allocate_slots(request, num_new)
                if new_blocks is not None:
                    break
                if self.tier is not None and not self.tier.victim_can_be_freed(self.running):
                    break  # vLLM 0.33: a deferred free would not help this allocation
                if cfg.policy == "priority":
                    victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
                    victim_index = self.running.index(victim)
                    del self.running[victim_index]
                    # 0.33: step back whenever the victim sat before the cursor; 0.25.1: only for
                    # a victim scheduled this step (below)
                    if scans_on and victim_index < req_index:
                        req_index -= 1
                    for i, s in enumerate(scheduled_running):
                        if s.request is victim:
                            del scheduled_running[i]
                            token_budget += s.num_new_tokens
                            if not scans_on:
                                req_index -= 1
                            break
                else:
                    victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                if request.status == PREEMPTED and cfg.policy == "priority" and scans_on:
                    continue  # 0.33: it preempted itself; the higher-priority ones behind may fit
                break
            carried_prefill |= request.is_prefill_chunk
            scheduled_running.append(ScheduledRequest(request, num_new, request.num_computed_tokens, new_blocks))
            token_budget -= num_new
            req_index += 1

        # B. waiting requests
        if not preempted and self.tier is not None:  # the connector path (sim.core.offload.admission)
            token_budget, admitted = schedule_waiting(self, self.tier, token_budget, threshold, hold, scheduled_new)
            carried_prefill |= admitted
        elif not preempted:
            admit_cap = cfg.max_num_active_reqs  # 0.33 max_num_active_seqs; 0.25.1 max_num_seqs
            skipped: list[Request] = []
            while self.waiting and token_budget > 0:
                if len(self.running) >= admit_cap:
                    break
                request = self.waiting.peek()
                if request.num_stale_output_tokens:
                    # 0.33 waiting loop: stale output still in flight would be resampled ->
                    # skip_request (requeued at the front after the loop, in order)
                    skipped.append(self.waiting.pop_head())
                    self.deferred_waiting.add(request.request_id)
                    continue
                # vLLM looks a request up only at num_computed_tokens == 0; more: its finished KV load
                # (a P/D read, sim.cluster.disagg) holds its blocks and set its computed tokens
                loaded = request.num_computed_tokens
                hit_blocks, num_hits = kvm.get_computed_blocks(request) if not loaded else (NO_HITS, 0)
                done = loaded + num_hits
                if hold and done < request.num_tokens - 1:
                    break  # 0.33: the cadence defers this admission's prefill
                num_new = request.num_tokens - done
                if 0 < threshold < num_new:
                    num_new = threshold
                if not cfg.enable_chunked_prefill and num_new > token_budget:
                    break
                num_new = min(num_new, token_budget)
                new_blocks = kvm.allocate_slots(request, num_new, num_hits, hit_blocks,
                                                full_sequence_must_fit=cfg.scheduler_reserve_full_isl,
                                                has_scheduled_reqs=bool(self.running))
                if new_blocks is None:
                    break
                if not loaded:
                    kvm.record_prefix_cache_stats(request, num_hits)  # 0.33: once per admission (looked up)
                self.waiting.pop_head()
                if self.deferred_waiting:
                    self.deferred_waiting.discard(request.request_id)
                carried_prefill |= done < request.num_tokens - 1
                self.running.append(request)
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = done
                blocks = list(kvm.get_blocks(request.request_id))
                scheduled_new.append(ScheduledRequest(request, num_new, done, blocks, True, done))
                token_budget -= num_new
            for r in reversed(skipped):
                self.waiting.prepend(r)
            cadence.after_waiting_loop(hold, len(self.waiting), len(self.deferred_waiting))

        # C. bookkeeping
        scheduled = scheduled_running + scheduled_new
        total = 0
        is_async = cfg.async_scheduling
        track = self.track_in_flight
        for s in scheduled:
            r = s.request
            r.num_computed_tokens += s.num_new_tokens
            r.is_prefill_chunk = r.num_computed_tokens < r.num_tokens + r.num_output_placeholders
            s.samples = not r.is_prefill_chunk
            if is_async and s.samples:
                r.num_output_placeholders += 1  # the token this step samples is not known yet
            if track:
                r.num_in_flight_tokens += s.num_new_tokens
            total += s.num_new_tokens
        cadence.end_step(total, carried_prefill)
        out = SchedulerOutput(self.step_index, scheduled, preempted, self.finished_req_ids, total)
        if self.tier is not None:
            self.tier.after_schedule(out)  # build_connector_meta, then the step fence
        self.finished_req_ids = set()
        self.step_index += 1
        return out

    def _preempt(self, request: Request) -> None:
        """Free all blocks, reset progress (outputs kept), requeue at the front (vLLM
        ``Scheduler._preempt_request``: ``prepend_request``, so FCFS resumes it first)."""
        assert request.status == RequestStatus.RUNNING
        self._free_blocks(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        if self.track_in_flight:
            # 0.33 _preempt_request: in-flight output turns stale (still delivered, but it no longer
            # resolves placeholders); the request is skipped in the waiting loop until it drains
            request.num_stale_output_tokens = request.num_in_flight_tokens
            request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(request)

    # -- outputs ------------------------------------------------------------------------------
    def update_from_output(
        self,
        output: SchedulerOutput,
        sampled_token_ids: dict[str, list[int]],
        kv_connector_output: KVConnectorOutput | None = None,
    ) -> list[Request]:
        """Changes state: append sampled tokens, stop finished requests and free them (in scheduled
        order), then take the offload worker's report; returns the finished."""
        if self.tier is not None:
            self.tier.before_output(output)  # deferred block frees whose step is now done
        finished: list[Request] = []
        max_len = self.config.max_model_len
        is_async = self.config.async_scheduling
        stopped_preempted = False
        track = self.track_in_flight
        for s in output.scheduled:
            request = s.request
            stale = False
            if track:  # 0.33 update_from_output: drain in-flight and stale shares in lockstep
                request.num_in_flight_tokens -= s.num_new_tokens
                if request.num_stale_output_tokens > 0:
                    stale = True
                    request.num_stale_output_tokens -= s.num_new_tokens
            if request.status > PREEMPTED:  # already finished
                continue
            new_ids = sampled_token_ids.get(request.request_id)
            if not new_ids:
                continue
            status_before = request.status
            n_appended = 0
            for tok in new_ids:
                request.append_output_token_ids(tok)
                n_appended += 1
                if request.num_tokens >= max_len or len(request.output_token_ids) >= request.max_tokens:
                    request.status = FINISHED_LENGTH_CAPPED
                    break
            if is_async:
                # AsyncScheduler: the placeholder is now a real token; blocks it completes are
                # cached now (one step later than in sync mode), unless it was preempted since.
                if not stale:
                    request.num_output_placeholders -= n_appended
                if status_before == RUNNING:
                    self.kv_cache_manager.cache_blocks(
                        request, request.num_computed_tokens - request.num_output_placeholders
                    )
            if request.status > PREEMPTED:
                self.free_request(request)
                finished.append(request)
                stopped_preempted |= status_before == PREEMPTED
        if finished:
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
            if stopped_preempted:  # async only: a request preempted while its last step was in flight
                self.waiting.remove_where(lambda r: id(r) in done)
                if self.tier is not None:
                    self.tier.kv_holding_waiting.remove_where(lambda r: id(r) in done)
        if self.tier is not None and kv_connector_output is not None:
            self.tier.update_from_kv_xfer_finished(kv_connector_output)
        return finished

    def free_request(self, request: Request) -> None:
        """Changes state: a finished request is reported in the next output, its blocks are freed
        and the scheduler forgets it (the caller sets its finished status and drops it from
        ``running``)."""
        if self.tier is not None:
            self.tier.request_finished(request)  # vLLM _connector_finished, before the free
        self.finished_req_ids.add(request.request_id)
        self._free_blocks(request)
        del self.requests[request.request_id]

    def _free_blocks(self, request: Request) -> None:
        """Changes state: release the request's blocks (``OffloadTier.free_blocks`` may defer it)."""
        if self.tier is not None:
            return self.tier.free_blocks(request)
        self.kv_cache_manager.free(request)

    def make_stats(self) -> PrefixCacheStats | None:
        """Changes state: drain the prefix-cache stats since the last call (vLLM does every step)."""
        return self.kv_cache_manager.make_prefix_cache_stats()

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Changes state: vLLM's reset, optionally preempting every running request first (last
        first, as vLLM's ``reset_prefix_cache(reset_running_requests=True)`` pops ``running``)."""
        if reset_running_requests:
            while self.running:
                self._preempt(self.running.pop())
        return self.kv_cache_manager.reset_prefix_cache()

    def check_integrity(self) -> None:
        """Query: assert the scheduler's, KV manager's and pool's invariants (after every step in
        tests; ``sim.core.scheduler_checks``); raises AssertionError."""
        check_scheduler(self, self.tier)
