"""Exact fast-forward over runs of steps whose schedule is predictable ("decode windows").

Between admissions, preemptions and finishes, consecutive v1 scheduler steps are determined by the
state at the first of them: every running request before the first prefilling one decodes one
token (the *bulk*); the rest of ``running`` (the *tail*: prefill chunks, and decodes queued behind
them) takes ``min(remaining, threshold, budget left)`` tokens in order; nothing is admitted. This
module plays k such steps at once:

* block operations (pops with lazy eviction, caching of newly full blocks, the waiting head's
  refused lookup) are replayed one by one in exactly the order ``schedule()`` would do them --
  step by step, in ``running`` order, allocation before caching -- so pool state, eviction order,
  prefix-cache stats and KV events match the plain loop;
* bulk decoders cost O(blocks) rather than O(tokens): their tokens are appended in one call and
  their block boundaries are computed arithmetically; only tail requests are simulated per step.

A window is allowed when (``plan_window``): the scheduler is synchronous; every bulk request is a
true decode (it has output tokens and ``num_computed == num_tokens - 1``) and the bulk fits the
token budget; no lookup can admit anything -- the waiting queue is empty, or the admission cap is
reached, or (FCFS, full-sequence gate) the head's gate fails now and cannot pass later (no block
is freed inside a window, so the free queue only shrinks; its hit chain can only be evicted, never
re-extended, because generated blocks hold unique tokens and each tail prefill diverges from the
head at its first uncached block) -- or else every window step's running requests use the whole
token budget (``schedule()`` looks the waiting queue up only while budget is left: a multi-chunk
prefill's full chunks), the window ending before the first step that leaves budget; the blocks
needed fit the free queue (no preemption); no request
finishes before the window's last step; no arrival becomes visible inside it unless the waiting
queue already blocks admissions. Equality with the plain step loop is a test.
``sim.replay.window_apply`` plays a planned window; ``sim.replay.window_gates`` holds the admission
gates; ``sim.replay.compiled_window`` runs a bulk window's step loop in C where built (this module's
loop, ``_bulk_loop``, is its oracle). Imports neither simpy nor torch.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sim.core.executor import StepShape
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.step_price import RooflinePrice
from sim.replay.window_gates import head_stays_refused, step0_admits

_bulk_steps: Callable[..., tuple[array[float], array[float]]] | None
try:  # the bulk window's step loop in C (same floats; sim.replay.compiled_window, built by pip install -e .)
    from sim.replay.compiled_window import bulk_steps as _bulk_steps
except ImportError:  # pragma: no cover - where the extension is not built
    _bulk_steps = None


def constant_column(value: int, k: int) -> array[int]:
    """A window's constant int column: an int64 array the step table copies without converting a
    value (``sim.replay.column_table.NumericColumnTable.extend``; a list's values are converted one by one)."""
    return array("q", [value]) * k


@dataclass(slots=True)
class _TailStep:
    """What one tail request does in one window step."""

    step: int
    num_new: int
    computed_before: int
    cache_upto: int  # tokens to cache after allocating (min(computed + new, num_tokens then))
    samples: bool


@dataclass(slots=True)
class Window:
    """k predictable steps: per-step shape columns and durations, and each tail request's schedule.

    Columns, not a ``StepShape`` per step: a fleet's windows play hundreds of thousands of steps,
    and the step table takes columns (``sim.replay.sync_loop.window_steps``)."""

    bulk: list[Request]
    tail: list[Request]
    tail_steps: list[list[_TailStep]]
    # the StepShape fields the step table records, per step (int64 arrays when constant)
    num_seqs: Sequence[int]
    num_new_tokens: Sequence[int]
    num_prefill_tokens: Sequence[int]
    num_decode_seqs: Sequence[int]
    durations: Sequence[float]  # (an array('d') from a compiled bulk window: no float object per step)
    lookups: list[bool]  # whether the waiting head is looked up (and refused) in the step
    first_tokens: list[tuple[int, list[Request]]]  # (step, requests sampling their first-ever token), when any
    lookup_head: Request | None = None
    bulk_blocks: list[int] = field(default_factory=list)  # blocks each bulk request holds at the start
    tail_blocks: list[int] = field(default_factory=list)  # same for the tail
    free_blocks: list[int] = field(default_factory=list)  # the pool's free blocks after each step (apply_window)
    cached_blocks: list[int] = field(default_factory=list)  # its cached blocks after each step
    usage: list[float] = field(default_factory=list)  # the KV usage after each step (apply_window)
    starts: Sequence[float] = field(default_factory=list)  # each step's start, then the window's end (as durations)
    finished: list[Request] = field(default_factory=list)  # freed at the last step (apply_window)

    @property
    def k(self) -> int:
        return len(self.durations)


def _extend_bulk_need(need: list[int], firsts: list[int], bs: int, horizon: int) -> None:
    """Extend ``need`` (blocks the bulk allocates at each step) to ``horizon`` steps: a decoder
    whose first allocation is at step ``f`` allocates at ``f, f + bs, f + 2 bs, ...``."""
    lo = len(need)
    need.extend([0] * (horizon - lo))
    for f in firsts:
        j0 = f if f >= lo else lo + (f - lo) % bs  # its first allocation at or after step lo
        if j0 < horizon:  # tested first: with large blocks most decoders allocate nothing this far
            for j in range(j0, horizon, bs):
                need[j] += 1


def plan_window(
    scheduler: Scheduler,
    max_steps: int,
    price: Callable[[StepShape, int], float],
    now: float,
    next_arrival: float,
    *,
    observed: bool = False,
    step_price: RooflinePrice | None = None,
) -> Window | None:
    """The longest allowed window of at least 2 steps, or None (then run a plain step).
    ``price(shape, step)`` is the duration of the window's step that gets index ``step``;
    ``step_price``, when given, the same duration computed in compiled code from the shape's sums
    (``sim.core.step_price``: no Python call per step).

    ``observed``: the engine's state is read at ``next_arrival`` from outside (a cluster's router
    reads a replica's gauges, KV events and in-flight requests when it routes). A window plays its
    steps' effects at once and reports them at its end, so an observed window must *end* before
    ``next_arrival``, and no arrival may fall inside it even while admissions are blocked: with
    the router's view of a replica stale (or ahead) inside a window, its choice would differ from
    the plain step loop's."""
    if not scheduler.kv_cache_manager.is_unitary_full_attention:
        return None  # explicit (sliding-window / hybrid) KV-cache groups: plain steps only
    if scheduler.kv_cache_manager.num_hash_lookahead_tokens:
        return None  # 0.33 EAGLE: a full block is cached a token late (its hash): plain steps only
    cfg = scheduler.config
    running = scheduler.running
    if max_steps < 2 or not running or scheduler.cadence.interval > 1:
        return None  # (the prefill cadence holds prefill by executed-step counts: plain steps only)
    # budget_gate: a lookup at a step could admit the head, so the window only takes steps whose
    # running requests use the whole token budget -- schedule()'s waiting loop runs only while
    # budget is left, so such a step looks nothing up -- and ends before the first step that leaves
    # budget (a multi-chunk prefill's full chunks while requests wait)
    budget_gate = bool(
        scheduler.waiting
        and len(running) < cfg.max_num_active_reqs
        and (cfg.policy != "fcfs" or not cfg.scheduler_reserve_full_isl)
    )
    kvm = scheduler.kv_cache_manager
    if step0_admits(scheduler, budget_gate):
        return None
    max_len = cfg.max_model_len
    # bulk: how long until one finishes (k_max), its context sum; one pass over running
    k_max = max_steps
    bulk_ctx = 0
    n_bulk = 0
    for r in running:
        c = r.num_computed_tokens
        outs = r.output_token_ids
        if c != r.num_tokens - 1 or not outs:
            break
        n_bulk += 1
        left = r.max_tokens - len(outs)
        if left < k_max:
            k_max = left
        left = max_len - c - 1  # max_len - num_tokens
        if left < k_max:
            k_max = left
        if k_max < 2:
            return None  # a bulk request finishes within one step (k_max only falls)
        bulk_ctx += c
    bulk, tail = running[:n_bulk], running[n_bulk:]
    if n_bulk > cfg.max_num_batched_tokens or k_max < 2:
        return None
    head = None if budget_gate else head_stays_refused(scheduler, tail)
    if head is False:  # a lookup could admit the head (see head_stays_refused)
        budget_gate, head = True, None
    if budget_gate and not tail and n_bulk < cfg.max_num_batched_tokens:
        return None  # step 0 leaves budget, so it would look the head up (see budget_gate)
    arrivals_harmless = bool(scheduler.waiting) and not observed
    free = kvm.block_pool.get_num_free_blocks()
    # a decoder at position p0 holding nb blocks allocates at step nb*bs - p0, then every bs steps;
    # counted per step on demand, a horizon at a time (a window usually ends at the next arrival,
    # long before k_max, which only bounds it by the first bulk request to finish)
    bs = kvm.block_size
    bulk_blocks = kvm.num_blocks_held(bulk)
    bulk_first = [max(0, nb * bs - r.num_computed_tokens) for r, nb in zip(bulk, bulk_blocks)]
    bulk_need: list[int] = []
    look = head is not None and n_bulk < cfg.max_num_batched_tokens  # the head looked up (and refused) each step
    if not tail:  # (budget_gate left budget at step 0 above: no window then)
        return _bulk_window(scheduler, bulk, bulk_blocks, bulk_first, bulk_need, bulk_ctx, k_max, free, price,
                            step_price, now, next_arrival, not arrivals_harmless, observed,
                            head if look and isinstance(head, Request) else None, look)

    # tail: simulate per step
    t_comp = [r.num_computed_tokens for r in tail]
    t_tokens = [r.num_tokens for r in tail]
    t_outs = [len(r.output_token_ids) for r in tail]
    # tail requests that are no true decode yet: once none is left, every running request decodes and
    # the window ends -- the next one is the bulk's alone (_bulk_window), far cheaper per step
    prefilling = sum(1 for c, nt, o in zip(t_comp, t_tokens, t_outs) if not o or c != nt - 1)
    tail_blocks = kvm.num_blocks_held(tail)
    t_blocks = list(tail_blocks)
    tail_steps: list[list[_TailStep]] = [[] for _ in tail]
    # the shape columns: per step with a tail; a bulk alone has the same shape but its context
    # at every step, so its columns are made once at the end
    seqs_col: list[int] = []
    new_col: list[int] = []
    prefill_col: list[int] = []
    decode_col: list[int] = []
    durations: list[float] = []
    lookups: list[bool] = []
    first_tokens: list[tuple[int, list[Request]]] = []
    # constant over the window: no admission or finish before its last step, and an arrival ends
    # it unless requests already wait (so a lone request stays alone: 0.33's threshold rule)
    threshold = scheduler.long_prefill_threshold()
    used = 0  # blocks popped so far in the window
    start = now
    starts = [now]
    for j in range(k_max):
        if j and not arrivals_harmless and start >= next_arrival:  # next_arrival has the tolerance
            break
        if j == len(bulk_need):
            _extend_bulk_need(bulk_need, bulk_first, bs, min(k_max, 2 * j + 32))
        need = bulk_need[j]
        budget = cfg.max_num_batched_tokens - n_bulk
        n_seqs, n_dec, new_tot, pf_tok = n_bulk, n_bulk, n_bulk, 0
        ctx = bulk_ctx + j * n_bulk
        pairs = ctx + n_bulk
        step_plan: list[tuple[int, int, int, bool]] = []
        step_finishes = False
        for i, r in enumerate(tail):
            if budget <= 0:
                break
            c, nt = t_comp[i], t_tokens[i]
            n = nt - c
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, max_len - c - 1)
            if n <= 0:
                continue
            blocks_needed = max(0, -(-(c + n) // bs) - t_blocks[i])  # (cdiv inlined: a Python call from here)
            need += blocks_needed
            samples = c + n >= nt
            step_plan.append((i, n, blocks_needed, samples))
            budget -= n
            n_seqs += 1
            new_tot += n
            ctx += c
            pairs += n * c + n * (n + 1) // 2
            if n == 1 and t_outs[i] and c == nt - 1:
                n_dec += 1
            else:
                pf_tok += n
            if samples and (t_outs[i] + 1 >= r.max_tokens or nt + 1 >= max_len):
                step_finishes = True
        if budget_gate and budget > 0:
            break  # this step would look the head up (see budget_gate)
        if used + need > free:
            break
        if step_price is not None:
            d = step_price.step_time(n_seqs, new_tot, ctx, pairs)
        else:  # the index step j will get (apply_window)
            d = price(StepShape(n_seqs, n_dec, new_tot, pf_tok, ctx, pairs), scheduler.step_index + j)
        if observed and start + d >= next_arrival:
            break  # an observed window is over before the next arrival (see the docstring)
        # commit step j
        used += need
        firsts: list[Request] = []
        for i, n, nb_new, samples in step_plan:
            c = t_comp[i]
            tail_steps[i].append(_TailStep(j, n, c, min(c + n, t_tokens[i]), samples))
            t_comp[i] = c + n
            t_blocks[i] += nb_new
            if samples:
                if t_outs[i] == 0 or c != t_tokens[i] - 1:
                    prefilling -= 1  # (a prefill's last chunk: a decoder from the next step on)
                if t_outs[i] == 0:
                    firsts.append(tail[i])
                t_outs[i] += 1
                t_tokens[i] += 1
        if firsts:
            first_tokens.append((j, firsts))
        seqs_col.append(n_seqs)
        new_col.append(new_tot)
        prefill_col.append(pf_tok)
        decode_col.append(n_dec)
        durations.append(d)
        lookups.append(head is not None and budget > 0)
        start = start + d  # the same float arithmetic as the plain loop's clock
        starts.append(start)
        if step_finishes or not prefilling:
            break
    if len(durations) < 2:
        return None
    return Window(bulk, tail, tail_steps, seqs_col, new_col, prefill_col, decode_col, durations, lookups,
                  first_tokens, head if isinstance(head, Request) else None, bulk_blocks, tail_blocks,
                  starts=starts)


def _bulk_window(scheduler: Scheduler, bulk: list[Request], bulk_blocks: list[int], bulk_first: list[int],
                 bulk_need: list[int], ctx: int, k_max: int, free: int, price: Callable[[StepShape, int], float],
                 step_price: RooflinePrice | None, now: float, next_arrival: float, stop_at_arrival: bool,
                 observed: bool, head: Request | None, look: bool) -> Window | None:
    """:func:`plan_window`'s loop when ``running`` is the bulk alone: each step decodes one token of
    each request (context ``ctx`` at the first step, one more per request each step) -- no per-step
    shape, plan or tail; the steps end where the general loop's would, for the same reasons."""
    n_bulk = len(bulk)
    bs = scheduler.kv_cache_manager.block_size
    cols: tuple[Sequence[float], Sequence[float]]  # (durations, starts)
    if step_price is not None and _bulk_steps is not None:  # the same loop in C (sim.replay.compiled_window)
        cols = _bulk_steps(step_price, n_bulk, ctx, k_max, free, bulk_first, bs, now, next_arrival, stop_at_arrival,
                           observed)
    else:
        cols = _bulk_loop(scheduler.step_index, n_bulk, bs, bulk_first, bulk_need, ctx, k_max, free, price,
                          step_price, now, next_arrival, stop_at_arrival, observed)
    return _bulk(bulk, bulk_blocks, head, look, cols[0], cols[1])


def _bulk_loop(step_index: int, n_bulk: int, bs: int, bulk_first: list[int], bulk_need: list[int], ctx: int,
               k_max: int, free: int, price: Callable[[StepShape, int], float], step_price: RooflinePrice | None,
               now: float, next_arrival: float, stop_at_arrival: bool,
               observed: bool) -> tuple[list[float], list[float]]:
    """:func:`_bulk_window`'s steps, in Python: ``(durations, starts)`` (the oracle of
    ``sim.replay.compiled_window.bulk_steps``, and the path without a ``step_price`` or the build)."""
    durations: list[float] = []
    starts = [now]
    start = now
    used = 0  # blocks popped so far in the window
    for j in range(k_max):
        if j and stop_at_arrival and start >= next_arrival:  # next_arrival has the tolerance
            break
        if j == len(bulk_need):
            _extend_bulk_need(bulk_need, bulk_first, bs, min(k_max, 2 * j + 32))
        need = bulk_need[j]
        if used + need > free:
            break
        if step_price is not None:
            d = step_price.step_time(n_bulk, n_bulk, ctx, ctx + n_bulk)
        else:  # the index step j will get (apply_window)
            d = price(StepShape(n_bulk, n_bulk, n_bulk, 0, ctx, ctx + n_bulk), step_index + j)
        if observed and start + d >= next_arrival:
            break  # an observed window is over before the next arrival (see plan_window)
        used += need
        durations.append(d)
        start = start + d  # the same float arithmetic as the plain loop's clock
        starts.append(start)
        ctx += n_bulk
    return durations, starts


def _bulk(bulk: list[Request], bulk_blocks: list[int], head: Request | None, look: bool, durations: Sequence[float],
          starts: Sequence[float]) -> Window | None:
    """The bulk window of these steps (None under 2 steps)."""
    k = len(durations)
    if k < 2:
        return None
    n_bulk = len(bulk)
    bulk_col = constant_column(n_bulk, k)  # (copied by the step table, not converted)
    return Window(bulk, [], [], bulk_col, bulk_col, constant_column(0, k), bulk_col, durations, [look] * k, [],
                  head, bulk_blocks, [], starts=starts)
