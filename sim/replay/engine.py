"""The SimPy replay loop -- the only module that imports simpy.

Two processes share one ``simpy.Environment``:

* **arrivals** walks the request stream (sorted by ``arrival``), turns each record into a
  :class:`~sim.core.request.Request` at its arrival time and wakes an idle engine;
* **engine** runs steps back to back: at a step's start it takes every request that has arrived by
  then (pulling due ones itself, so same-instant event order and float rounding cannot hide one;
  "by then" is to 1 ns), calls ``schedule()``, asks the executor for the step, waits its duration,
  then applies the sampled tokens (``update_from_output``).

Timing semantics (documented contract, tested):

* a request becomes visible at the first engine step that **starts at or after** its arrival;
* an idle engine (nothing unfinished) starts its next step at the next arrival;
* ``first_scheduled`` is the start of the step that admitted the request, ``first_token`` the end of
  the step that sampled its first token, ``finish`` the end of the step that sampled its last.

With ``fast_forward`` and an executor that can price a step shape without running it (``price``),
runs of predictable steps (decodes, plus chunked prefills at the tail of ``running``) are played
by :mod:`sim.replay.decode_window` with per-block rather than per-token work; results are identical to
the plain loop (a test compares every table, stat and KV event).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import simpy

from sim.core.executor import Executor, StepResult, step_shape
from sim.core.kv_cache_spec import cdiv
from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.scheduler_output import SchedulerOutput
from sim.replay.decode_window import Window, apply_window, plan_window
from sim.replay.metrics import summarize
from sim.replay.recorder import ReplayRecorder
from workloads.trace_format import TraceRequest

ARRIVAL_EPS_S = 1e-9
"""An arrival counts as "at or before" a step start within this tolerance (float rounding)."""


class ReplayError(RuntimeError):
    """The replay cannot continue (bad request, stalled engine)."""


@dataclass
class ReplayResult:
    """Tables and totals of one replay."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    prefix_cache: PrefixCacheStats
    summary: dict[str, Any]
    wall_time_s: float = 0.0
    events: list[tuple[int, Any]] = field(default_factory=list)


@dataclass(slots=True)
class _Launched:
    """A scheduled step handed to the executor, with the state to record beside it."""

    out: SchedulerOutput
    result: StepResult
    start: float
    n_running: int
    n_waiting: int


class Replay:
    """Replays a request stream through a scheduler and an executor on a SimPy clock."""

    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        requests: Iterable[TraceRequest],
        *,
        fast_forward: bool = True,
        integrity_check: bool = False,
        progress: bool = False,
        total: int | None = None,
        record_events: bool = False,
        max_window_steps: int = 1 << 16,
        on_step: Callable[[Scheduler], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self._source: Iterator[TraceRequest] = iter(requests)
        self.fast_forward = fast_forward and hasattr(executor, "price") and not scheduler.config.async_scheduling
        self.integrity_check = integrity_check
        self.max_window_steps = max_window_steps
        self.on_step = on_step
        self.rec = ReplayRecorder(progress, total)
        self.env = simpy.Environment()
        self._pending: list[Request] = []
        self._idle: simpy.Event | None = None
        self._source_done = False
        self._lookahead: TraceRequest | None = None
        self._last_arrival = -math.inf
        self._next_arrival = math.inf
        self._uid = 0
        self._error: Exception | None = None
        self.num_plain_steps = 0  # steps run through schedule()
        self.num_window_steps = 0  # steps played by the decode fast-forward
        self.events: list[tuple[int, Any]] = []
        if record_events:
            scheduler.kv_cache_manager.block_pool.event_sink = self._record_event

    # -- public -------------------------------------------------------------------------------
    def run(self) -> ReplayResult:
        t0 = time.perf_counter()
        self.env.process(self._guard(self._arrivals()))
        engine = self.env.process(self._guard(self._engine()))
        try:
            self.env.run(until=engine)
        except Exception:
            # SimPy re-creates a failed process's exception from its args; raise the original
            if self._error is not None:
                raise self._error from None
            raise
        finally:
            self.rec.close()
        wall = time.perf_counter() - t0
        requests, steps = self.rec.tables()
        pool = self.scheduler.kv_cache_manager.block_pool
        summary = summarize(requests, steps, self.rec.stats, sim_time_s=self.env.now, num_evictions=pool.num_evictions)
        return ReplayResult(requests, steps, self.rec.stats, summary, wall, self.events)

    # -- arrivals -----------------------------------------------------------------------------
    def _guard(self, gen: Iterator[simpy.Event]) -> Generator[simpy.Event, Any, Any]:
        """Run a process body, remembering the first exception it raises."""
        try:
            return (yield from gen)
        except Exception as exc:
            if self._error is None:
                self._error = exc
            raise

    def _peek(self) -> TraceRequest | None:
        """The next not-yet-delivered request of the stream (arrival order is checked)."""
        if self._lookahead is None and not self._source_done:
            tr = next(self._source, None)
            if tr is None:
                self._source_done = True
            else:
                if not tr.arrival >= self._last_arrival:
                    raise ReplayError(
                        f"request {tr.id}: arrival {tr.arrival} is before the previous one ({self._last_arrival})"
                    )
                self._last_arrival = tr.arrival
                self._lookahead = tr
        self._next_arrival = self._lookahead.arrival if self._lookahead is not None else math.inf
        return self._lookahead

    def _deliver_due(self, t: float) -> None:
        """Turn every request arriving at or before ``t`` (to ARRIVAL_EPS_S) into a pending Request."""
        while (tr := self._peek()) is not None and tr.arrival <= t + ARRIVAL_EPS_S:
            self._pending.append(self._make_request(tr))
            self._lookahead = None

    def _arrivals(self) -> Iterator[simpy.Event]:
        """The arrival process: sleeps until the next arrival, delivers it, wakes an idle engine."""
        env = self.env
        while (tr := self._peek()) is not None:
            if tr.arrival > env.now + ARRIVAL_EPS_S:
                yield env.timeout(tr.arrival - env.now)
            self._deliver_due(env.now)
            self._wake()
        self._wake()

    def _wake(self) -> None:
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _make_request(self, tr: TraceRequest) -> Request:
        sched = self.scheduler
        max_len = sched.config.max_model_len
        if len(tr.tokens) > max_len:
            raise ReplayError(f"request {tr.id}: prompt of {len(tr.tokens)} tokens exceeds max_model_len {max_len}")
        try:
            self.rec.new_request(
                tr.id, tr.arrival, len(tr.tokens), tr.output_tokens, tr.salt, tr.lora, tr.tenant, tr.session,
                tr.prompt_logprobs,
            )
        except ValueError as exc:
            raise ReplayError(str(exc)) from None
        self._uid += 1
        return Request(
            tr.id,
            tr.tokens,
            tr.output_tokens,
            uid=self._uid - 1,
            arrival_time=tr.arrival,
            cache_salt=tr.salt,
            lora_name=tr.lora,
            lora_int_id=0,
            priority=tr.priority,
            prompt_logprobs=tr.prompt_logprobs,
            output_token_ids=tr.output_token_ids,
            hasher=sched.hasher if sched.cache_config.enable_prefix_caching else None,
        )

    def _admit_pending(self) -> None:
        if self._pending:
            for r in self._pending:
                self.scheduler.add_request(r)
            self._pending.clear()

    def _idle_wait(self) -> Iterator[simpy.Event]:
        self._idle = self.env.event()
        yield self._idle
        self._idle = None

    def _drained(self) -> bool:
        return self._peek() is None and not self._pending

    # -- the engine ---------------------------------------------------------------------------
    def _engine(self) -> Iterator[simpy.Event]:
        env = self.env
        sched = self.scheduler
        if sched.config.async_scheduling:
            yield from self._async_engine()
            return
        while True:
            # a step sees every request that arrived at or before its start (pulled, so that the
            # order of same-instant SimPy events and float rounding cannot hide one)
            self._deliver_due(env.now)
            self._admit_pending()
            if not sched.has_unfinished_requests():
                if self._drained():
                    return
                yield from self._idle_wait()
                continue
            if self.fast_forward:
                window = self._plan_window()
                if window is not None:
                    yield from self._run_window(window)
                    continue
            launched = self._launch()
            if launched.out.is_empty() and not launched.out.preempted:
                # (a step whose only work was preempting -- e.g. a request preempting itself -- is
                # empty but not stuck: vLLM runs it and admits in the next step)
                raise ReplayError(self._stall_message())
            yield env.timeout(launched.result.duration_s)
            finished = self._apply(launched.out, launched.result)
            self._record_step(launched, finished)
            self._after_step()

    def _launch(self) -> _Launched:
        """``schedule()`` one step and hand it to the executor; records admissions."""
        sched = self.scheduler
        start = self.env.now
        self.num_plain_steps += 1
        out = sched.schedule()
        result = self.executor.execute(out)
        if not result.duration_s > 0:
            raise ReplayError(f"executor returned a non-positive step time {result.duration_s}")
        for s in out.scheduled:
            if s.admitted:
                self.rec.admitted(s.request, s.hit_tokens, start)
        return _Launched(out, result, start, len(sched.running), len(sched.waiting))

    def _apply(self, out: SchedulerOutput, result: StepResult) -> int:
        """``update_from_output`` at the current time; records first tokens and finishes."""
        sched = self.scheduler
        firsts = [s.request for s in out.scheduled if s.samples and not s.request.output_token_ids]
        finished = sched.update_from_output(out, result.sampled_token_ids)
        now = self.env.now
        for r in firsts:
            if r.output_token_ids:
                self.rec.first_token(r, now)
        for r in finished:
            self.rec.finished(r, now)
            r.release_tokens()
        self.rec.add_stats(sched.make_stats())
        return len(finished)

    def _record_step(self, launched: _Launched, finished: int) -> None:
        out = launched.out
        shape = step_shape(out)
        pool = self.scheduler.kv_cache_manager.block_pool
        self.rec.step(
            out.step, launched.start, launched.result.duration_s, len(out.scheduled), out.total_num_scheduled_tokens,
            shape.num_prefill_tokens, shape.num_decode_seqs, sum(1 for s in out.scheduled if s.admitted),
            len(out.preempted), finished, launched.n_running, launched.n_waiting, pool.get_num_free_blocks(),
            pool.num_cached_blocks, pool.get_usage(),
        )

    def _after_step(self) -> None:
        if self.integrity_check:
            self.scheduler.check_integrity()
        if self.on_step is not None:
            self.on_step(self.scheduler)

    # -- asynchronous scheduling --------------------------------------------------------------
    def _async_engine(self) -> Iterator[simpy.Event]:
        """vLLM's ``EngineCore.step_with_batch_queue`` with two batches in flight.

        Each iteration at time t: deliver arrivals, ``schedule()`` the next batch (which runs on the
        device from t for its duration), and -- once two batches are queued, or nothing is left
        to schedule -- apply the outputs of the oldest batch (it finished at t). So step j is
        scheduled before step j-1's tokens are known (the scheduler's output placeholders), and
        a step's tokens arrive when the next step starts. No fast-forward in this mode.
        """
        env = self.env
        sched = self.scheduler
        in_flight: deque[_Launched] = deque()
        while True:
            self._deliver_due(env.now)
            self._admit_pending()
            new: _Launched | None = None
            if sched.has_requests():
                new = self._launch()
                if new.out.is_empty() and sched.waiting and not sched.running and all(
                    launched.out.is_empty() for launched in in_flight
                ):
                    raise ReplayError(self._stall_message())
                in_flight.appendleft(new)
                if len(in_flight) < 2 and sched.has_requests():
                    yield env.timeout(new.result.duration_s)  # don't wait for the in-flight batch
                    self._record_step(new, 0)
                    continue
            elif not in_flight:
                if self._drained():
                    return
                yield from self._idle_wait()
                continue
            oldest = in_flight.pop()
            finished = self._apply(oldest.out, oldest.result)
            if new is not None:
                yield env.timeout(new.result.duration_s)
                self._record_step(new, finished)
            self._after_step()

    # -- fast-forwarded steps -----------------------------------------------------------------
    def _plan_window(self) -> Window | None:
        return plan_window(
            self.scheduler,
            self.max_window_steps,
            self.executor.price,  # type: ignore[attr-defined]
            self.env.now,
            self._next_arrival - ARRIVAL_EPS_S,
        )

    def _run_window(self, window: Window) -> Iterator[simpy.Event]:
        env = self.env
        sched = self.scheduler
        first_step = sched.step_index
        n_running = len(sched.running)
        apply_window(sched, window)
        self.num_window_steps += window.k
        pool = sched.kv_cache_manager.block_pool
        total_blocks = pool.num_gpu_blocks - 1
        for j, (d, shape) in enumerate(zip(window.durations, window.shapes)):
            if j:
                self._deliver_due(env.now)
                self._admit_pending()
            start = env.now
            n_waiting = len(sched.waiting)
            yield env.timeout(d)
            for r in window.first_tokens[j]:
                self.rec.first_token(r, env.now)
            free, cached, n_finished = window.per_step[j]
            self.rec.step(
                first_step + j, start, d, shape.num_seqs, shape.num_new_tokens, shape.num_prefill_tokens,
                shape.num_decode_seqs, 0, 0, n_finished, n_running, n_waiting, free, cached,
                1.0 - free / total_blocks,
            )
        now = env.now
        for r in window.bulk + window.tail:
            if r.is_finished():
                self.rec.finished(r, now)
                r.release_tokens()
        self._after_step()

    # -- diagnostics --------------------------------------------------------------------------
    def _record_event(self, event: Any) -> None:
        self.events.append((self.scheduler.step_index, event))

    def _stall_message(self) -> str:
        sched = self.scheduler
        head = sched.waiting.peek() if sched.waiting else None
        cc = sched.cache_config
        usable = cc.num_gpu_blocks - 1
        if head is None:
            return f"engine stalled at t={self.env.now:.6f}s with nothing schedulable"
        need = cdiv(head.num_tokens, cc.block_size)
        return (
            f"engine stalled at t={self.env.now:.6f}s: request {head.request_id} ({head.num_tokens} tokens, "
            f"{need} blocks of {cc.block_size}) cannot be admitted into a pool of {usable} usable blocks "
            f"with {len(sched.running)} running (watermark {sched.config.watermark}); the pool is too small"
        )
