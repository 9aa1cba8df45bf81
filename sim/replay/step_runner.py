"""One engine step, as both replay loops run it: ``schedule()``, execute, apply, record.

Mirrors vLLM's ``EngineCore.step`` pieces: ``scheduler.schedule()`` -> ``model_executor.
execute_model()`` -> ``scheduler.update_from_output()``. The loops (``sim.replay.sync_loop``,
``sim.replay.async_loop``) decide *when* each piece runs; this module does the pieces and records
them. Loops are generators of :data:`Wait` values, which the SimPy adapter
(``sim.replay.engine``) turns into clock events.

Invariants: an executor's step time is positive (else ReplayError), except that a step which
schedules nothing takes zero time whatever the executor says (no forward pass runs); admissions are recorded at the
step's start, first tokens and finishes at the time ``apply`` runs; ``after_step`` runs the
integrity check (when enabled) after every applied step or window.

Imports neither simpy nor torch: time is read through :class:`Clock`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sim.core.executor import Executor, StepResult, step_shape
from sim.core.kv_cache_spec import cdiv
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.scheduler_output import SchedulerOutput
from sim.core.step_price import RooflinePrice
from sim.core.transfer_job import KVConnectorOutput
from sim.replay.decode_window import Window, plan_window
from sim.replay.errors import ReplayError
from sim.replay.intake import ARRIVAL_EPS_S, RequestIntake
from sim.replay.kv_transfer import LinkKVWorker
from sim.replay.recorder import ReplayRecorder
from sim.replay.tier_window import play_window_transfers, tier_quiet, window_allowed
from sim.replay.window_apply import apply_window

Wait = float | None
"""What a loop yields: a float advances the clock by that many seconds (a step runs); None sleeps
until the next arrival (the engine is idle)."""


class Clock(Protocol):
    """The simulated time (``simpy.Environment`` is one)."""

    @property
    def now(self) -> float: ...


@dataclass(slots=True)
class Launched:
    """A scheduled step handed to the executor, with the state to record beside it."""

    out: SchedulerOutput
    result: StepResult
    start: float
    n_running: int
    n_waiting: int
    kv_output: KVConnectorOutput | None = None  # the offload tier's report of this step (None: no tier)


def empty_step_end(landing: float, now: float, next_arrival: float) -> float:
    """When an empty step starting at ``now`` with transfers pending ends: at the worker's
    ``landing`` (``idle_until``: the first job it may report is done) or at ``next_arrival``,
    whichever comes first -- never before ``now``.

    vLLM 0.33.0's engine does not sleep on a pending transfer: ``EngineCore.run_busy_loop`` keeps
    calling ``step`` while the scheduler ``has_requests`` (pending KV work counts), each step with
    nothing scheduled only polls the connector (the model runner's ``kv_connector_no_forward``:
    ``get_finished``), and between two steps ``_process_input_queue`` drains the requests that
    arrived (after an empty step ``_process_engine_step`` sleeps 1 ms for the transfer threads: a
    poll granularity not modelled -- the replay wakes at the arrival itself). So a request arriving
    while a load or store is in flight is scheduled at the first step after its arrival, not at the
    landing. The replay's empty step is that poll run compressed: one step to the first instant
    something can change -- a landing, or the next arrival (the engine's arrival stream; in a fleet
    the cluster's next routing instant, ``sim.cluster.replica.RoutedIntake.next_arrival``: any
    arrival may be routed here), whose step then sees the request (the loops admit at each step's
    start). The P/D hold worker (``sim.cluster.disagg_hold.HoldWorker``) applies the same cap
    itself; it is a no-op there."""
    end = landing if landing < next_arrival else next_arrival
    return end if end > now else now


class StepRunner:
    """The scheduler, executor, intake and recorder of one replay, and the step verbs over them."""

    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        intake: RequestIntake,
        rec: ReplayRecorder,
        clock: Clock,
        *,
        fast_forward: bool,
        integrity_check: bool,
        max_window_steps: int,
        on_step: Callable[[Scheduler], None] | None,
        kv_worker: LinkKVWorker | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.intake = intake
        self.rec = rec
        self.clock = clock
        # the fast-forward needs an executor that prices a shape without running it, and the
        # synchronous scheduler (sim.replay.decode_window's precondition)
        # (with an offload tier, only while its connector is quiet: sim.replay.tier_window)
        self.fast_forward = fast_forward and hasattr(executor, "price") and not scheduler.config.async_scheduling
        self.kv_worker = kv_worker
        # the executor's compiled pricing of a window step, when it has one (sim.core.step_price)
        self.step_price: RooflinePrice | None = getattr(executor, "step_price", None)
        # finished requests whose tokens are dropped after the next schedule(): with an offload tier
        # its build_connector_meta makes their final store pass (vLLM _build_store_jobs visits the
        # requests finished since the previous step), which reads their tokens and block hashes
        self._release_after_schedule: list[Request] = []
        self.integrity_check = integrity_check
        self.max_window_steps = max_window_steps
        self.on_step = on_step
        self.num_plain_steps = 0  # steps run through schedule()
        self.num_window_steps = 0  # steps played by the decode fast-forward

    def launch(self) -> Launched:
        """``schedule()`` one step and hand it to the executor; records admissions."""
        sched = self.scheduler
        start = self.clock.now
        self.num_plain_steps += 1
        finished_before = self._release_after_schedule
        out = sched.schedule()
        if finished_before:
            for r in finished_before:
                r.release_tokens()
            self._release_after_schedule = []
        result = self.executor.execute(out)
        if out.is_empty():
            # nothing scheduled: vLLM runs no forward pass (GPUModelRunner.execute_model returns
            # EMPTY_MODEL_RUNNER_OUTPUT at once), so the step costs no time in either loop
            result = StepResult(0.0, result.sampled_token_ids)
        elif not result.duration_s > 0:
            raise ReplayError(f"executor returned a non-positive step time {result.duration_s}")
        kv_output = None
        if self.kv_worker is not None:
            result, kv_output = self._transfers(out, result, start)
        for s in out.scheduled:
            if s.admitted:
                self.rec.admitted(s.request, s.hit_tokens, start, s.external_hit_tokens)
        return Launched(out, result, start, len(sched.running), len(sched.waiting), kv_output)

    def _transfers(
        self, out: SchedulerOutput, result: StepResult, start: float
    ) -> tuple[StepResult, KVConnectorOutput]:
        """The offload tier's transfers of a step (``sim.replay.kv_transfer``): the forward waits for
        the flushed stores; an empty step lasts until the first job it may report lands (the engine
        keeps stepping while transfers are pending, vLLM's ``has_pending_push_work``) or until the
        next arrival, whichever comes first (:func:`empty_step_end`)."""
        worker = self.kv_worker
        assert worker is not None
        wait = worker.start_step(out.step, start, out.kv_connector_metadata)
        if out.is_empty():
            end = empty_step_end(worker.idle_until(out.step, start + wait), start + wait, self.intake.next_arrival)
        else:
            end = start + wait + result.duration_s
        return StepResult(end - start, result.sampled_token_ids), worker.finish_step(out.step, end)

    def apply(self, out: SchedulerOutput, result: StepResult, kv_output: KVConnectorOutput | None = None) -> int:
        """``update_from_output`` at the current time (with the tier's report of the step, if any);
        records first tokens and finishes."""
        sched = self.scheduler
        firsts = [s.request for s in out.scheduled if s.samples and not s.request.output_token_ids]
        finished = sched.update_from_output(out, result.sampled_token_ids, kv_output)
        now = self.clock.now
        for r in firsts:
            if r.output_token_ids:
                self.rec.first_token(r, now)
        for r in finished:
            self.rec.finished(r, now)
            self.release(r)
        self.rec.add_stats(sched.make_stats())
        return len(finished)

    def release(self, request: Request) -> None:
        """Drop a finished request's tokens (bounded replay memory): now, or with an offload tier
        after the next ``schedule()``, whose connector still reads them."""
        if self.scheduler.tier is None:
            request.release_tokens()
        else:
            self._release_after_schedule.append(request)

    def busy(self) -> bool:
        """Query: the synchronous engine has a step to run -- unfinished requests, or with an offload
        tier anything :meth:`has_requests` counts (the connector's store pass and policy commit of a
        finished request run in the step after it)."""
        return self.scheduler.has_unfinished_requests() if self.kv_worker is None else self.has_requests()

    def has_requests(self) -> bool:
        """Query: vLLM's ``has_requests`` -- unfinished requests, finished ones not yet reported and,
        with an offload tier, pending transfers (``has_pending_push_work``)."""
        return self.scheduler.has_requests() or (self.kv_worker is not None and self.kv_worker.has_pending())

    def stalled(self, launched: Launched) -> bool:
        """Query: ``launched`` scheduled nothing, preempted nothing, and (with a tier) leaves no
        transfer pending and reported none -- no later step can do better (the waiting head cannot
        fit the pool)."""
        out = launched.out
        if not out.is_empty() or out.preempted:
            return False
        if self.kv_worker is None:
            return True
        kv = launched.kv_output
        return not self.kv_worker.has_pending() and (kv is None or kv.is_empty()) and not out.finished_req_ids

    def record_step(self, launched: Launched, finished: int) -> None:
        out = launched.out
        shape = step_shape(out)
        pool = self.scheduler.kv_cache_manager.block_pool
        self.rec.step(
            out.step, launched.start, launched.result.duration_s, len(out.scheduled), out.total_num_scheduled_tokens,
            shape.num_prefill_tokens, shape.num_decode_seqs, sum(1 for s in out.scheduled if s.admitted),
            len(out.preempted), finished, launched.n_running, launched.n_waiting, pool.get_num_free_blocks(),
            pool.num_cached_blocks, pool.get_usage(),
        )

    def after_step(self) -> None:
        if self.integrity_check:
            self.scheduler.check_integrity()
        if self.on_step is not None:
            self.on_step(self.scheduler)

    def plan_window(self) -> Window | None:
        """A fast-forward window starting now that ends before the next arrival becomes visible
        (with an offload tier: a window of decodes alone, planned while the connector is quiet)."""
        tier = self.scheduler.tier
        if tier is not None and not tier_quiet(self.scheduler, tier):
            return None
        window = plan_window(
            self.scheduler,
            self.max_window_steps,
            self.executor.price,  # type: ignore[attr-defined]  # checked in __init__ (fast_forward)
            self.clock.now,
            self.intake.next_arrival - ARRIVAL_EPS_S,
            observed=self.intake.observed,
            step_price=self.step_price,
        )
        if tier is not None and window is not None and not window_allowed(self.scheduler, tier, window):
            return None
        return window

    def play_window(self, window: Window) -> None:
        """Play a planned window's steps on the scheduler (``sim.replay.window_apply``), with an
        offload tier's transfers and connector bookkeeping (``sim.replay.tier_window``)."""
        sched = self.scheduler
        tier = sched.tier
        if tier is None:
            apply_window(sched, window)
            return
        assert self.kv_worker is not None
        play_window_transfers(sched, tier, self.kv_worker, window, lambda: apply_window(sched, window))

    def stall_message(self) -> str:
        sched = self.scheduler
        now = self.clock.now
        head = sched.waiting.peek() if sched.waiting else None
        cc = sched.cache_config
        usable = cc.num_gpu_blocks - 1
        if head is None:
            return f"engine stalled at t={now:.6f}s with nothing schedulable"
        need = cdiv(head.num_tokens, cc.block_size)
        return (
            f"engine stalled at t={now:.6f}s: request {head.request_id} ({head.num_tokens} tokens, "
            f"{need} blocks of {cc.block_size}) cannot be admitted into a pool of {usable} usable blocks "
            f"with {len(sched.running)} running (watermark {sched.config.watermark}); the pool is too small"
        )
