"""The asynchronous engine loop: two batches in flight (vLLM's ``AsyncScheduler``).

Mirrors vLLM's ``EngineCore.step_with_batch_queue``. Each iteration at time t: admit arrivals,
``schedule()`` the next batch (it runs on the device from t for its duration), and -- once two
batches are queued, or nothing is left to schedule -- apply the outputs of the oldest batch (it
finished at t). So step j is scheduled before step j-1's tokens are known (the scheduler's output
placeholders), and a step's tokens arrive when the next step starts.

A batch that schedules nothing (e.g. the only running request has its last token in flight and the
waiting head does not fit) takes zero time, as in vLLM, which runs no forward pass for it: the next
iteration starts at the same instant (:meth:`~sim.replay.step_runner.StepRunner.launch`).

Invariants: at most two batches in flight; outputs are applied oldest first; no fast-forward in
this mode; a stall (nothing schedulable, nothing running, nothing in flight) raises ReplayError.

A generator of :data:`~sim.replay.step_runner.Wait` values; imports neither simpy nor torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from sim.replay.errors import ReplayError
from sim.replay.step_runner import Launched, StepRunner, Wait


def async_steps(run: StepRunner) -> Iterator[Wait]:
    """The loop body of the two-batch engine until the stream is drained and every batch applied."""
    sched = run.scheduler
    in_flight: deque[Launched] = deque()
    while True:
        run.intake.admit_due(run.clock.now)
        new: Launched | None = None
        if run.has_requests():
            new = run.launch()
            if run.stalled(new) and sched.waiting and not sched.running and all(
                # (an empty batch may still carry an offload tier's report of finished transfers)
                launched.out.is_empty() and (launched.kv_output is None or launched.kv_output.is_empty())
                for launched in in_flight
            ):
                raise ReplayError(run.stall_message())
            in_flight.appendleft(new)
            if len(in_flight) < 2 and run.has_requests():
                yield new.result.duration_s  # don't wait for the in-flight batch
                run.record_step(new, 0)
                continue
        elif not in_flight:
            if run.intake.drained():
                return
            yield None
            continue
        oldest = in_flight.pop()
        finished = run.apply(oldest.out, oldest.result, oldest.kv_output)
        if new is not None:
            yield new.result.duration_s
            run.record_step(new, finished)
        run.after_step()
