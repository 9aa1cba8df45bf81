"""The gates of a decode window (``sim.replay.decode_window.plan_window``): whether a lookup of the
waiting head inside a window could admit it.

A window may only be played where ``schedule()``'s waiting loop would admit nothing at any of its
steps (no admission, no change of the running set). Two queries decide it before any per-request
set-up: :func:`step0_admits` -- step 0 surely leaves budget to a head its lookup may admit, so no
window at all -- and :func:`head_stays_refused` -- the head (FCFS, full-sequence gate) is refused
now and at every later window step, so the window may run while requests wait. Both read state
only. Imports neither simpy nor torch.
"""

from __future__ import annotations

from operator import attrgetter

from sim.core.kv_cache_spec import cdiv
from sim.core.request import Request
from sim.core.scheduler import Scheduler

_unique_outputs = attrgetter("unique_outputs")


def head_stays_refused(scheduler: Scheduler, tail: list[Request]) -> Request | None | bool:
    """The waiting head if it is refused at every window step, None if no lookup happens, False if
    a lookup could admit something (no window then)."""
    if not scheduler.waiting:
        return None
    cfg = scheduler.config
    if len(scheduler.running) >= cfg.max_num_active_reqs:
        return None  # the waiting loop stops before any lookup
    if cfg.policy != "fcfs" or not cfg.scheduler_reserve_full_isl:
        return False
    if not all(map(_unique_outputs, scheduler.running)):
        return False
    head = scheduler.waiting.peek()
    kvm = scheduler.kv_cache_manager
    head_hashes = head.block_hashes
    for r in tail:
        c = kvm.get_num_cached_blocks(r.request_id)
        hashes = r.block_hashes
        if c < len(hashes) and c < len(head_hashes) and hashes[c] == head_hashes[c]:
            return False  # this prefill could cache the head's next missing block
    # Refused now (full-sequence gate, as allocate_slots would compute it, without recording a
    # lookup) => refused at every window step: the free queue only shrinks and the hit chain only
    # loses blocks, which never lowers the need.
    hits, num_hits = kvm.peek_computed_blocks(head)
    if kvm.full_sequence_fits(head, hits, num_hits, has_scheduled_reqs=True):
        return False
    return head


def step0_admits(scheduler: Scheduler, budget_gate: bool) -> bool:
    """True when ``plan_window`` surely finds no window because step 0 leaves token budget to a
    waiting head that its lookup may admit (``budget_gate``, or the full-sequence gate passing
    whatever the hits: a waiting request holds no block and a hit counts at most once, as evictable,
    where it would count once as new, so the need is at most its whole sequence's blocks plus the
    watermark); found here without the window's per-request set-up. Step 0 leaves budget when the
    running requests' demands -- a decoder's 1, a prefill's remaining tokens up to the long-prefill
    threshold, an upper bound of what ``schedule()`` gives -- sum below it. Sync scheduling only."""
    if not scheduler.waiting:
        return False
    cfg = scheduler.config
    running = scheduler.running
    if len(running) >= cfg.max_num_active_reqs:
        return False
    kvm = scheduler.kv_cache_manager
    if not budget_gate:
        head = scheduler.waiting.peek()
        need = cdiv(min(head.num_tokens, cfg.max_model_len), kvm.block_size)
        need += kvm.coordinator.watermark_for(head, True)
        if need > kvm.block_pool.get_num_free_blocks():
            return False
    budget = cfg.max_num_batched_tokens
    threshold = scheduler.long_prefill_threshold()
    demand = 0
    for r in running:
        n = r.num_tokens - r.num_computed_tokens
        if 0 < threshold < n:
            n = threshold
        demand += n
        if demand >= budget:
            return False
    return True
