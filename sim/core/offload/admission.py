"""Phase B of ``schedule()`` with the offload connector (mirrors the waiting loop of vLLM 0.33.0's
``Scheduler.schedule``, ``vllm/v1/core/sched/scheduler.py``, on its connector path).

Per pass, while the token budget lasts and ``running`` has room:

1. the queue is ``kv_holding_waiting`` while it has requests (waiting requests that hold blocks:
   loading or loaded), else ``waiting``;
2. a request still in WAITING_FOR_REMOTE_KVS is skipped; one whose load finished gets its loaded
   blocks cached (``update_waiting_for_remote_kv``) and goes back to WAITING / PREEMPTED;
3. a request with no computed tokens is looked up: the GPU hit (no stats yet), then the connector's
   CPU hit from the GPU-hit boundary; None **skips** the request for this step;
4. a CPU hit loads asynchronously: ``allocate_for_load`` (delayed caching, leaving the in-flight
   prefills' remaining blocks free), ``update_state_after_alloc`` (the load job), stats, status
   WAITING_FOR_REMOTE_KVS, ``num_computed_tokens = local + ext``, no tokens this step, and the
   request is skipped; otherwise it is scheduled as in the plain loop (threshold, chunked prefill,
   ``allocate_slots``; a failed allocation **stops** the loop);
5. skipped requests leave their queue for the rest of the step -- **later requests can still be
   admitted** -- and are put back at its front afterwards, in their order.

Stats (vLLM 0.33.0): the GPU ``PrefixCacheStats`` once per admission, after the allocation
(``record_prefix_cache_stats``); the connector's prefix-cache stats (queries ``num_tokens - local``,
hits ``ext``) at the same point when the queries are not 0; the first admission's prompt tokens by
source. Imports nothing above ``sim.core``.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from sim.core.kv_cache_coordinator import NO_HITS, HitBlocks
from sim.core.offload.host import SchedulerHost
from sim.core.request import PREEMPTED, WAITING, WAITING_FOR_REMOTE_KVS, Request, RequestStatus
from sim.core.request_queue import RequestQueue
from sim.core.scheduler_output import ScheduledRequest

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.offload.tier import OffloadTier


def schedule_waiting(
    sched: SchedulerHost,
    tier: OffloadTier,
    token_budget: int,
    threshold: int,
    hold: bool,
    scheduled_new: list[ScheduledRequest],
) -> tuple[int, bool]:
    """Changes state: admit waiting requests through the connector path (module docstring) with the
    step's long-prefill ``threshold`` (``hold``: the prefill cadence holds prefills back); appends
    the admissions to ``scheduled_new``; returns the token budget left and whether an admission
    carries prefill (more than one token left to compute)."""
    cfg = sched.config
    kvm = sched.kv_cache_manager
    connector = tier.connector
    carried_prefill = False
    skipped_waiting: deque[Request] = deque()
    skipped_holding: deque[Request] = deque()

    def skip(queue: RequestQueue) -> None:
        r = queue.pop_head()
        sched.deferred_waiting.add(r.request_id)
        # appendleft, then prepended one by one below: the queue gets them back in skip order
        (skipped_holding if tier.holds_kv_blocks(r) else skipped_waiting).appendleft(r)

    while token_budget > 0:
        queue = tier.kv_holding_waiting if tier.kv_holding_waiting else sched.waiting
        if not queue or len(sched.running) >= cfg.max_num_active_reqs:
            break
        request = queue.peek()
        rid = request.request_id
        if request.status == WAITING_FOR_REMOTE_KVS:
            if rid not in tier.finished_recving:
                skip(queue)
                continue
            tier.update_waiting_for_remote_kv(request)
            request.status = PREEMPTED if request.num_preemptions else WAITING
            # the schedule() calls it started in WAITING_FOR_REMOTE_KVS, this one included
            request.num_steps_waiting_for_kv += connector.step - connector.state(rid).load_step
        if request.num_stale_output_tokens:
            skip(queue)  # 0.33: its stale in-flight output would be resampled
            continue
        ext = 0
        load_async = False
        ext_queries = 0
        hits: HitBlocks = NO_HITS
        local = 0
        looked_up = request.num_computed_tokens == 0
        if looked_up:
            hits, local = kvm.peek_computed_blocks(request)
            got, load_async = connector.get_num_new_matched_tokens(request, local)
            if request.skip_reading_prefix_cache:
                got, load_async = 0, False
            if got is None:
                skip(queue)
                continue
            ext = got
            ext_queries = request.num_tokens - local
            num_computed = local + ext
            if request.num_preemptions <= 0:  # vLLM PrefillStats: the first admission only
                request.num_external_computed_tokens = ext
        else:  # a finished load: its blocks are held and cached
            num_computed = request.num_computed_tokens
        if load_async:
            ok = tier.coordinator.allocate_for_load(
                request, local, hits, ext, cfg.scheduler_reserve_full_isl,
                tier.inflight_prefill_reserved_blocks(), bool(sched.running),
            )
            if not ok:
                break
            num_new = 0
        elif hold and num_computed < request.num_tokens - 1:
            break  # the prefill cadence defers this admission's prefill
        else:
            num_new = request.num_tokens - num_computed
            if 0 < threshold < num_new:
                num_new = threshold
            if not cfg.enable_chunked_prefill and num_new > token_budget:
                break
            num_new = min(num_new, token_budget)
            new_blocks = kvm.allocate_slots(
                request, num_new, local, hits,
                full_sequence_must_fit=cfg.scheduler_reserve_full_isl, has_scheduled_reqs=bool(sched.running),
            )
            if new_blocks is None:
                break
        connector.update_state_after_alloc(request, kvm.get_blocks(rid), ext)
        if ext_queries:
            tier.external_prefix_cache_stats.record(ext_queries, ext, request.num_preemptions > 0)
        if looked_up:
            kvm.record_prefix_cache_stats(request, local)
            if request.num_preemptions <= 0:
                tier.prompt_tokens_local_hit += local
                tier.prompt_tokens_external += ext
                tier.prompt_tokens_computed += request.num_prompt_tokens - local - ext
        if load_async:
            request.status = WAITING_FOR_REMOTE_KVS
            request.num_computed_tokens = num_computed
            tier.inflight_prefills[rid] = request
            skip(queue)
            continue
        queue.pop_head()
        sched.deferred_waiting.discard(rid)
        carried_prefill |= num_computed < request.num_tokens - 1
        st = connector.state(rid)
        if looked_up:
            hit_tokens, ext_tokens = local, 0
        else:  # admitted after its load: the lookup's GPU hit and the loaded CPU hit
            hit_tokens, ext_tokens = st.num_locally_computed_tokens, st.num_loaded_tokens
        sched.running.append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_computed
        scheduled_new.append(
            ScheduledRequest(
                request, num_new, num_computed, list(kvm.get_blocks(rid)),
                admitted=True, hit_tokens=hit_tokens, external_hit_tokens=ext_tokens,
            )
        )
        token_budget -= num_new
        if num_computed + num_new < request.num_tokens:
            tier.inflight_prefills[rid] = request
    # vLLM prepend_requests: the skipped requests go back to the front, in their order
    for r in skipped_holding:
        tier.kv_holding_waiting.prepend(r)
    for r in skipped_waiting:
        sched.waiting.prepend(r)
    num_waiting = len(sched.waiting) + len(tier.kv_holding_waiting)
    sched.cadence.after_waiting_loop(hold, num_waiting, len(sched.deferred_waiting))
    return token_budget, carried_prefill
