"""Exact fast-forward over runs of identical decode steps.

When every running request is decoding, nothing is waiting to be looked up, and no arrival is due,
the next steps differ only in their context length: each schedules one token per running request,
allocates a block when a request crosses a block boundary, caches a block when one fills up, and
samples one token each. This module plays k such steps at once:

* the block operations (pop from the free queue with lazy eviction, cache a newly full block) are
  replayed one by one in exactly the order step-by-step replay would do them -- (step, position in
  ``running``), allocation before caching -- so pool state, eviction order and KV events match;
* everything else (token appends, computed counters, per-step records) is done in bulk, so the
  Python cost is O(blocks + steps) instead of O(requests x steps).

Preconditions (``plan_decode_window``): synchronous scheduler; every running request has
``num_computed_tokens == num_tokens - 1``; ``len(running) <= max_num_batched_tokens``; no lookup can
happen (waiting queue empty, or ``max_num_seqs`` reached) or the head stays refused; the blocks needed fit the free queue
(so no preemption); no request finishes before the window's last step; and the caller limits k so
that no arrival becomes visible inside the window. A waiting head that the last step refused is
allowed too (FCFS; see ``plan_decode_window``): it is looked up, and refused, once per step.
Equality with the plain step loop is a test.
Imports neither simpy nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.request import Request, RequestStatus
from sim.scheduler import Scheduler


@dataclass(slots=True)
class DecodeWindow:
    """k identical decode steps over ``running`` (in order).

    ``lookup_head``: a waiting head that each step looks up (recording prefix-cache stats, as vLLM
    does on every step) and fails to admit -- see :func:`plan_decode_window`.
    """

    k: int
    running: list[Request]
    context0: int  # sum of num_computed_tokens at the window's first step
    lookup_head: Request | None = None


def _blocks_needed(p0: int, n_blocks: int, k: int, bs: int) -> int:
    """New blocks a request at decode position p0 with n_blocks needs over k steps."""
    return max(0, -(-(p0 + k) // bs) - n_blocks)


def plan_decode_window(scheduler: Scheduler, max_steps: int) -> DecodeWindow | None:
    """The longest window (<= max_steps) allowed by the scheduler's state, or None."""
    running = scheduler.running
    cfg = scheduler.config
    if max_steps < 2 or not running or len(running) > cfg.max_num_batched_tokens:
        return None
    lookup_head = None
    if scheduler.waiting and len(running) < cfg.max_num_seqs:
        # The head was looked up and refused at the last schedule() and no block was freed since.
        # During pure decode the free queue only shrinks and the head's need only grows (its hits
        # can only be evicted; new cached blocks hold unique generated tokens), so it stays
        # refused: each step just records one more lookup. FCFS only: arrivals join the back.
        head = scheduler.waiting.peek()
        if cfg.policy != "fcfs" or scheduler.head_blocked is not head:
            return None
        if not all(r.unique_outputs for r in running):
            return None
        if len(running) < cfg.max_num_batched_tokens:
            lookup_head = head
    k = max_steps
    context0 = 0
    for r in running:
        if r.num_computed_tokens != r.num_tokens - 1:
            return None
        k = min(k, r.max_tokens - len(r.output_token_ids), cfg.max_model_len - r.num_tokens)
        context0 += r.num_computed_tokens
    if k < 2:
        return None
    kvm = scheduler.kv_cache_manager
    free = kvm.block_pool.get_num_free_blocks()
    bs = kvm.block_size
    req_blocks = kvm.req_to_blocks

    def need(steps: int) -> int:
        return sum(
            _blocks_needed(r.num_computed_tokens, len(req_blocks[r.request_id]), steps, bs) for r in running
        )

    if need(k) > free:
        lo, hi = 0, k  # largest steps with need(steps) <= free
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if need(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        k = lo
        if k < 2:
            return None
    return DecodeWindow(k, list(running), context0, lookup_head)


def apply_decode_window(scheduler: Scheduler, window: DecodeWindow) -> list[tuple[int, int, int]]:
    """Play the window's k steps; returns per-step ``(free_blocks, cached_blocks, finished)``.

    Finished requests (those whose last token is sampled in the last step) are freed in running
    order and removed from ``running``, exactly as ``update_from_output`` would.
    """
    k = window.k
    kvm = scheduler.kv_cache_manager
    pool = kvm.block_pool
    bs = kvm.block_size
    # Sample all k tokens first: hashes depend only on tokens, and caching below only reads
    # hashes of blocks that step-by-step replay would already have hashed at that point.
    events: list[tuple[int, int, int, Request]] = []
    for idx, r in enumerate(window.running):
        p0 = r.num_computed_tokens
        j_out = len(r.output_token_ids)
        r.append_output_token_ids(r.planned_output_tokens(j_out, k))
        n_blocks = len(kvm.req_to_blocks[r.request_id])
        # allocation: step j computes position p0 + j and needs ceil((p0 + j + 1) / bs) blocks
        for j in range(k):
            if -(-(p0 + j + 1) // bs) > n_blocks:
                events.append((j, idx, 0, r))
                n_blocks += 1
        # caching: step j caches floor((p0 + j + 1) / bs) blocks; step 0 always calls it (as the
        # plain path does every step) so any lag is caught up at the same point
        events.append((0, idx, 1, r))
        first = (-(p0 + 1)) % bs  # smallest j >= 0 with (p0 + j + 1) % bs == 0
        for j in range(first if first else bs, k, bs):
            events.append((j, idx, 1, r))
    events.sort(key=lambda e: (e[0], e[1], e[2]))

    per_step: list[tuple[int, int, int]] = []
    ev = 0
    base_step = scheduler.step_index
    for j in range(k):
        scheduler.step_index = base_step + j  # KV events of step j are attributed to it
        while ev < len(events) and events[ev][0] == j:
            _, _, kind, r = events[ev]
            rid = r.request_id
            if kind == 0:
                kvm.req_to_blocks[rid].extend(pool.get_new_blocks(1))
            else:
                kvm.cache_blocks(r, r.num_computed_tokens + j + 1)
            ev += 1
        if window.lookup_head is not None:
            kvm.get_computed_blocks(window.lookup_head)  # recorded in PrefixCacheStats; refused
        per_step.append((pool.get_num_free_blocks(), pool.num_cached_blocks, 0))

    finished: list[Request] = []
    for r in window.running:
        r.num_computed_tokens += k
        r.is_prefill_chunk = False
        if len(r.output_token_ids) >= r.max_tokens or r.num_tokens >= scheduler.config.max_model_len:
            r.status = RequestStatus.FINISHED_LENGTH_CAPPED
            scheduler._free_request(r)
            finished.append(r)
    if finished:
        done = {id(r) for r in finished}
        scheduler.running = [r for r in scheduler.running if id(r) not in done]
        scheduler.head_blocked = None
        per_step[-1] = (pool.get_num_free_blocks(), pool.num_cached_blocks, len(finished))
    scheduler.step_index = base_step + k
    return per_step
