"""The synchronous engine loop: one step at a time, each step's tokens applied before the next.

Mirrors vLLM's ``EngineCore.step`` (no batch queue): at a step's start, admit every request that
has arrived by then, ``schedule()``, execute, wait the step's duration, ``update_from_output``.
With fast-forward, runs of predictable steps are played as one window
(``sim.replay.decode_window``): one clock event for the whole window, and the same per-step records
as the plain loop, written in bulk.

Invariants: a step sees every request that arrived at or before its start (pulled by the loop, so
that the order of same-instant clock events and float rounding cannot hide one); an idle engine
sleeps until the next arrival; a step that schedules nothing and preempts nothing is a stall
(ReplayError: the pool cannot hold the waiting head).

A generator of :data:`~sim.replay.step_runner.Wait` values; imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from sim.replay.decode_window import Window, constant_column
from sim.replay.errors import ReplayError
from sim.replay.step_runner import StepRunner, Wait


def sync_steps(run: StepRunner) -> Iterator[Wait]:
    """The loop body of the synchronous engine until the stream is drained and every request done."""
    intake = run.intake
    while True:
        intake.admit_due(run.clock.now)
        if not run.busy():
            if intake.drained():
                return
            yield None
            continue
        if run.fast_forward:
            window = run.plan_window()
            if window is not None:
                yield from window_steps(run, window)
                continue
        launched = run.launch()
        if run.stalled(launched):
            # (a step whose only work was preempting -- e.g. a request preempting itself -- is
            # empty but not stuck: vLLM runs it and admits in the next step)
            raise ReplayError(run.stall_message())
        yield launched.result.duration_s
        finished = run.apply(launched.out, launched.result, launched.kv_output)
        run.record_step(launched, finished)
        run.after_step()


def window_steps(run: StepRunner, window: Window) -> Iterator[Wait]:
    """Play a planned window as one clock event: its block operations at once, one wait to its end
    (landing on the float the plain loop's step-by-step clock reaches), then its rows in bulk.

    When no single wait lands there (``exact_delay`` is None: a window longer than the time
    before it, whose end the sum ``now + d`` skips over in rounding), the window waits its steps'
    durations one by one, the plain loop's own additions (other processes may run at those
    instants -- an arrival's wake is a no-op on a busy loop, and a fleet routes nothing inside a
    window -- so nothing reaches this engine before the window's end)."""
    sched = run.scheduler
    rec = run.rec
    first_step = sched.step_index
    n_running = len(sched.running)
    n_waiting = len(sched.waiting)
    run.play_window(window)
    k = window.k
    run.num_window_steps += k
    starts = window.starts
    yield from window_waits(run.clock.now, starts[k], window.durations)
    # arrivals inside a window are allowed only while admissions are blocked (plan_window); each
    # still counts as waiting from the first step that starts at or after it (the plain loop admits
    # it there), and joins the queue at the window's end, before anything else happens
    counts = run.intake.due_counts(starts[1:k])
    waiting = constant_column(n_waiting, k) if not any(counts) else [n_waiting, *(n_waiting + n for n in counts)]
    for j, firsts in window.first_tokens:
        for r in firsts:
            rec.first_token(r, starts[j + 1])
    free = window.free_blocks
    n_finished = constant_column(0, k)
    n_finished[k - 1] = len(window.finished)
    durations = window.durations
    ends: Sequence[float] | None
    if run.kv_worker is not None:  # a tiered step records its end minus its start (StepRunner._transfers)
        durations = [starts[j + 1] - starts[j] for j in range(k)]
        ends = None  # (start + (end - start) may round off the end: the hook adds them itself)
    else:  # each row's end: the next step's start, the float start + duration made when planning
        ends = starts[1:]
    zeros = constant_column(0, k)
    rec.steps(  # (lists, arrays where constant, a range of step indexes: NumericColumnTable.extend)
        range(first_step, first_step + k), starts[:k], durations, window.num_seqs, window.num_new_tokens,
        window.num_prefill_tokens, window.num_decode_seqs, zeros, zeros, n_finished, constant_column(n_running, k),
        waiting, free, window.cached_blocks, window.usage,  # (usage: apply_window's, 1 - free / usable blocks)
        ends=ends,
    )
    now = starts[k]
    for r in window.finished:  # in running order (apply_window frees them in that order)
        rec.finished(r, now)
        run.release(r)
    run.after_step()


def window_waits(now: float, end: float, durations: Sequence[float]) -> list[float]:
    """The clock waits of a window from ``now`` to ``end`` (the float the plain loop reaches by
    adding ``durations`` one by one): one wait when one lands exactly, else the durations themselves."""
    d = exact_delay(now, end)
    return [d] if d is not None else list(durations)


def exact_delay(now: float, end: float) -> float | None:
    """The wait ``d`` with ``now + d == end`` in floats, or None if there is none.

    ``end - now`` is exact when ``now >= end / 2`` (Sterbenz), so a window late in a replay always
    has one. Earlier, ``end - now`` can round either way, and ``now + d`` may even skip ``end``:
    one ulp more of ``d`` moves the exact sum from a rounding tie below ``end`` to one above it
    (about 1 % of windows that start before a quarter second, measured on random durations)."""
    d = end - now
    while now + d < end:
        d = math.nextafter(d, math.inf)
    while now + d > end:
        d = math.nextafter(d, -math.inf)
    return d if now + d == end else None
