"""Playing a planned decode window (``sim.replay.decode_window.plan_window``) on the scheduler, KV
manager and pool: k steps' block operations, in the plain step loop's order.

That order, step by step: in ``running`` order, each request's new block (a decoder stepping past
its last block) before its caching of newly full blocks; then the waiting head's refused lookup.
The bulk's operations are computed arithmetically (a decoder at position p0 holding nb blocks pops
one at step nb*bs - p0 and every bs steps after, and completes a block every bs steps), the tail's
from its planned steps; each is then played one by one, so pops, evictions, cached keys, KV events
and the head's prefix-cache stats are those of the plain loop -- block id for block id
(``tests/test_window_apply.py``), table for table (the fast-forward equivalence tests).

Tried and dropped: popping a step's bulk blocks in one call and caching the bulk's generated blocks
once per window (both exact without a KV-event sink): callgrind counted 0.4-0.7 % *more*
instructions on the first 1,500 Mooncake requests -- the regrouping's bookkeeping costs what the
saved calls did. Imports neither simpy nor torch.
"""

from __future__ import annotations

from itertools import chain

from sim.core.request import Request, RequestStatus
from sim.core.scheduler import Scheduler
from sim.replay.decode_window import Window


def apply_window(scheduler: Scheduler, window: Window) -> None:
    """Play the window's steps on the scheduler, KV manager and pool (see the module docstring);
    right after ``plan_window``, on the state it was planned on (it reuses the block counts read there).

    Fills ``window.free_blocks``, ``window.cached_blocks`` and ``window.usage`` with the pool's gauges
    after each step (before the last step's frees: finished requests, last step only, are freed in
    ``running`` order, as ``update_from_output``, listed in ``window.finished``, and the last
    step's gauges are read again after them).
    """
    k = window.k
    kvm = scheduler.kv_cache_manager
    pool = kvm.block_pool
    bs = kvm.block_size
    # events of step j: (kind, request, arg), kind 0 = allocate the blocks that hold arg tokens, 1 =
    # cache up to arg tokens; in running order, allocation before caching (as schedule() does them).
    # Appending request by request in running order, each one's allocations before its caches,
    # keeps every step's list in that order without a sort. Tokens are appended first: hashes
    # depend only on tokens, and caching reads only hashes step-by-step replay would already have
    # computed at that point.
    events: dict[int, list[tuple[int, Request, int]]] = {}
    for r, nb, nc in zip(window.bulk, window.bulk_blocks, kvm.num_cached_blocks_held(window.bulk)):
        p0 = r.num_computed_tokens
        r.append_planned_outputs(k)
        # allocation at step nb*bs - p0 (the first position past its blocks), then every bs steps
        # (tested before looping: with large blocks most decoders allocate nothing in a window)
        alloc0 = nb * bs - p0
        if alloc0 < k:
            for j in range(max(0, alloc0), k, bs):
                events.setdefault(j, []).append((0, r, p0 + j + 1))  # one new block: step j computes position p0 + j
        # each step caches floor((p0 + j + 1) / bs) blocks; step 0 if the request lags behind
        # that (caught up where the plain path would; else the call would cache nothing: only this
        # request's own events change its cached count), then at each block boundary
        if nc < (p0 + 1) // bs:
            events.setdefault(0, []).append((1, r, p0 + 1))
        cache0 = (-(p0 + 1)) % bs or bs  # the first boundary after step 0 (step 0's is the catch-up above)
        if cache0 < k:
            for j in range(cache0, k, bs):
                events.setdefault(j, []).append((1, r, p0 + j + 1))
    for r, steps, n_blocks in zip(window.tail, window.tail_steps, window.tail_blocks):
        n_samples = sum(1 for s in steps if s.samples)
        if n_samples:
            r.append_planned_outputs(n_samples)
        for s in steps:
            ops = events.setdefault(s.step, [])
            nb = -(-(s.computed_before + s.num_new) // bs) - n_blocks  # (cdiv, inlined)
            if nb > 0:
                ops.append((0, r, s.computed_before + s.num_new))
                n_blocks += nb
            ops.append((1, r, s.cache_upto))

    frees = window.free_blocks
    cached = window.cached_blocks
    usage = window.usage
    total = pool.num_gpu_blocks - 1
    base_step = scheduler.step_index
    head = window.lookup_head
    # The head's lookup (recorded in PrefixCacheStats, then refused -- see decode_window's docstring)
    # only changes when a block of its hit chain is handed out again; walk it again only then.
    head_chain: set[int] = set()  # ids of the blocks of the head's hit chain
    head_hits = -1
    n_free, n_cached = pool.get_num_free_blocks(), pool.num_cached_blocks
    u = 1.0 - n_free / total  # (pool.get_usage()'s float)
    if head is None:  # no lookup: only the steps with block operations do anything
        _play_ops(scheduler, events, window, k, n_free, n_cached, u)
    else:
        for j in range(k):
            scheduler.step_index = base_step + j  # KV events of step j are attributed to it
            step_ops = events.get(j)
            if step_ops is not None:  # (a step without block operations leaves the gauges as they were)
                for kind, r, arg in step_ops:
                    if kind == 0:
                        new_blocks = kvm.allocate_new_blocks(r.request_id, arg)
                        if head_chain and not head_chain.isdisjoint(map(id, new_blocks)):
                            head_hits = -1
                    else:
                        kvm.cache_blocks(r, arg)
                n_free, n_cached = pool.get_num_free_blocks(), pool.num_cached_blocks
                u = 1.0 - n_free / total
            if window.lookups[j]:  # (a lookup changes neither gauge)
                if head_hits < 0:
                    hit_blocks, head_hits = kvm.get_computed_blocks(head)
                    head_chain = set(map(id, chain.from_iterable(hit_blocks)))  # (C loops: hits run long)
                else:
                    kvm.repeat_lookup(head, head_hits)
            frees.append(n_free)
            cached.append(n_cached)
            usage.append(u)

    _advance(scheduler, window, base_step)


def _play_ops(scheduler: Scheduler, events: dict[int, list[tuple[int, Request, int]]], window: Window, k: int,
              n_free: int, n_cached: int, u: float) -> None:
    """The step loop of :func:`apply_window` without a lookup: the steps with block operations in
    step order, each one's gauges after them; a run of steps without any keeps the gauges, so its
    entries are written in one go (a decode window's steps mostly allocate and cache nothing: a
    decoder does each once every ``block_size`` steps), its usage one float object for the run."""
    kvm = scheduler.kv_cache_manager
    pool = kvm.block_pool
    frees, cached, usage = window.free_blocks, window.cached_blocks, window.usage
    total = pool.num_gpu_blocks - 1
    base_step = scheduler.step_index  # (the window's first step)
    done = 0  # steps whose gauges are written
    for j in sorted(events):
        if j > done:
            frees.extend([n_free] * (j - done))
            cached.extend([n_cached] * (j - done))
            usage.extend([u] * (j - done))
        scheduler.step_index = base_step + j  # KV events of step j are attributed to it
        for kind, r, arg in events[j]:
            if kind == 0:
                kvm.allocate_new_blocks(r.request_id, arg)
            else:
                kvm.cache_blocks(r, arg)
        n_free, n_cached, before = pool.get_num_free_blocks(), pool.num_cached_blocks, n_free
        if n_free != before:  # (a step that only caches keeps the free count, and so the usage float)
            u = 1.0 - n_free / total
        frees.append(n_free)
        cached.append(n_cached)
        usage.append(u)
        done = j + 1
    if k > done:
        frees.extend([n_free] * (k - done))
        cached.extend([n_cached] * (k - done))
        usage.extend([u] * (k - done))


def _advance(scheduler: Scheduler, window: Window, base_step: int) -> None:
    """The end of :func:`apply_window`: the requests' computed tokens after the window's steps,
    the requests the last step finishes freed (in ``running`` order), and the step index past the
    window (it started at ``base_step``)."""
    k = window.k
    pool = scheduler.kv_cache_manager.block_pool
    frees = window.free_blocks
    cached = window.cached_blocks
    for r in window.bulk:
        r.num_computed_tokens += k
    for r, steps in zip(window.tail, window.tail_steps):
        if steps:
            r.num_computed_tokens = steps[-1].computed_before + steps[-1].num_new
        r.is_prefill_chunk = r.num_computed_tokens < r.num_tokens
    finished = window.finished
    max_len = scheduler.config.max_model_len
    for r in window.bulk + window.tail:
        if r.output_token_ids and (len(r.output_token_ids) >= r.max_tokens or r.num_tokens >= max_len):
            r.status = RequestStatus.FINISHED_LENGTH_CAPPED
            scheduler.free_request(r)
            finished.append(r)
    if finished:
        done = {id(r) for r in finished}
        scheduler.running = [r for r in scheduler.running if id(r) not in done]
        frees[-1] = pool.get_num_free_blocks()
        cached[-1] = pool.num_cached_blocks
        window.usage[-1] = 1.0 - frees[-1] / (pool.num_gpu_blocks - 1)
    scheduler.step_index = base_step + k
