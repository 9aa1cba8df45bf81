"""The local prefill cadence (mirrors ``prefill_schedule_interval`` in vLLM 0.33.0's
``vllm/v1/core/sched/scheduler.py``: ``Scheduler.__init__`` and ``schedule``, an engine that is not
DP-coordinated).

With ``interval > 1``, a step holds prefill back -- running prefill chunks are skipped, the
waiting loop stops at the first request with more than one token to compute -- while fewer than
``interval`` executed steps have passed since the last step that carried prefill, *and* a running
request is decoding, *and* the last release step could drain the waiting queue
(``capacity_bound`` false: vLLM's escape, #44558, so a backed-up engine is not capped at one
budget per interval).

Invariants: the first step is never held (``last_prefill_step`` starts a full interval back);
only steps that schedule tokens count as executed (``schedule()`` calls that schedule nothing do
not expire the hold); ``capacity_bound`` is updated only on steps that ran the waiting loop without
holding. ``interval == 1`` never holds. Imports nothing from the project but the request.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.core.request import Request


class PrefillCadence:
    """The cadence state of one scheduler (see the module docstring). Cost: O(running) per step
    (the decode check) when ``interval > 1``, O(1) otherwise."""

    __slots__ = ("interval", "num_executed_steps", "last_prefill_step", "capacity_bound")

    def __init__(self, interval: int) -> None:
        if interval < 1:
            raise ValueError(f"prefill_schedule_interval must be >= 1, got {interval}")
        self.interval = interval
        self.num_executed_steps = 0
        # a full interval back, so the first step is never held (vLLM: last_prefill_step)
        self.last_prefill_step = -interval
        self.capacity_bound = False  # vLLM: prefill_capacity_bound

    def holds(self, running: Sequence[Request]) -> bool:
        """Query: whether this step defers prefill (vLLM ``schedule``: ``defer_prefills``)."""
        return (
            self.interval > 1
            and not self.capacity_bound
            # this call becomes executed step num_executed_steps + 1 if it schedules anything
            and (self.num_executed_steps + 1) - self.last_prefill_step < self.interval
            and any(not r.is_prefill_chunk for r in running)
        )

    def after_waiting_loop(self, held: bool, num_waiting: int, num_deferred: int) -> None:
        """Changes state: on a step that did not hold, record whether the waiting queue was left
        with requests that were not merely skipped (vLLM: ``prefill_capacity_bound = num_waiting >
        len(deferred_waiting)``)."""
        if not held:
            self.capacity_bound = num_waiting > num_deferred

    def end_step(self, num_scheduled_tokens: int, carried_prefill: bool) -> None:
        """Changes state: count an executed step, and restart the interval from it if it carried
        prefill (a running prefill chunk, or an admission with more than one token to compute)."""
        if num_scheduled_tokens > 0:
            self.num_executed_steps += 1
        if self.interval > 1 and carried_prefill:
            self.last_prefill_step = self.num_executed_steps
