"""The synchronous engine loop: one step at a time, each step's tokens applied before the next.

Mirrors vLLM's ``EngineCore.step`` (no batch queue): at a step's start, admit every request that
has arrived by then, ``schedule()``, execute, wait the step's duration, ``update_from_output``.
With fast-forward, runs of predictable steps are played as one window
(``sim.replay.decode_window``), with the same per-step records as the plain loop.

Invariants: a step sees every request that arrived at or before its start (pulled by the loop, so
that the order of same-instant clock events and float rounding cannot hide one); an idle engine
sleeps until the next arrival; a step that schedules nothing and preempts nothing is a stall
(ReplayError: the pool cannot hold the waiting head).

A generator of :data:`~sim.replay.step_runner.Wait` values; imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Iterator

from sim.replay.decode_window import Window, apply_window
from sim.replay.errors import ReplayError
from sim.replay.step_runner import StepRunner, Wait


def sync_steps(run: StepRunner) -> Iterator[Wait]:
    """The loop body of the synchronous engine until the stream is drained and every request done."""
    sched = run.scheduler
    intake = run.intake
    while True:
        intake.admit_due(run.clock.now)
        if not sched.has_unfinished_requests():
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
        if launched.out.is_empty() and not launched.out.preempted:
            # (a step whose only work was preempting -- e.g. a request preempting itself -- is
            # empty but not stuck: vLLM runs it and admits in the next step)
            raise ReplayError(run.stall_message())
        yield launched.result.duration_s
        finished = run.apply(launched.out, launched.result)
        run.record_step(launched, finished)
        run.after_step()


def window_steps(run: StepRunner, window: Window) -> Iterator[Wait]:
    """Play a planned window: its block operations at once, then its steps' times and records."""
    sched = run.scheduler
    rec = run.rec
    clock = run.clock
    first_step = sched.step_index
    n_running = len(sched.running)
    apply_window(sched, window)
    run.num_window_steps += window.k
    pool = sched.kv_cache_manager.block_pool
    total_blocks = pool.num_gpu_blocks - 1
    for j, (d, shape) in enumerate(zip(window.durations, window.shapes)):
        if j:
            # arrivals inside a window are allowed only while admissions are blocked
            # (plan_window); they still join the waiting queue at the step they arrive by
            run.intake.admit_due(clock.now)
        start = clock.now
        n_waiting = len(sched.waiting)
        yield d
        for r in window.first_tokens[j]:
            rec.first_token(r, clock.now)
        free, cached, n_finished = window.per_step[j]
        rec.step(
            first_step + j, start, d, shape.num_seqs, shape.num_new_tokens, shape.num_prefill_tokens,
            shape.num_decode_seqs, 0, 0, n_finished, n_running, n_waiting, free, cached,
            1.0 - free / total_blocks,
        )
    now = clock.now
    for r in window.bulk + window.tail:
        if r.is_finished():
            rec.finished(r, now)
            r.release_tokens()
    run.after_step()
