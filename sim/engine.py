"""The SimPy replay loop -- the only module that imports simpy.

Two processes share one ``simpy.Environment``:

* **arrivals** walks the request stream (sorted by ``arrival``), turns each record into a
  :class:`~sim.request.Request` at its arrival time and wakes an idle engine;
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
by :mod:`sim.decode_window` with per-block rather than per-token work; results are identical to
the plain loop (a test compares every table, stat and KV event).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import simpy

from sim.decode_window import Window, apply_window, plan_window
from sim.executor import Executor, StepResult, step_shape
from sim.kv_cache_manager import PrefixCacheStats, cdiv
from sim.metrics import REQUEST_COLUMNS, STEP_COLUMNS, RecordTable, finalize_requests, summarize
from sim.request import Request
from sim.scheduler import Scheduler, SchedulerOutput
from workloads.trace_format import TraceRequest


_COL = {name: i for i, name in enumerate(REQUEST_COLUMNS)}
_FIRST_SCHEDULED, _FIRST_TOKEN, _FINISH = _COL["first_scheduled"], _COL["first_token"], _COL["finish"]
_HIT_TOKENS, _READMIT, _PREEMPTIONS = _COL["hit_tokens"], _COL["readmit_hit_tokens"], _COL["num_preemptions"]
_OUTPUT_TOKENS = _COL["output_tokens"]

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


class _Progress:
    """A tqdm bar over finished requests, or nothing."""

    def __init__(self, enabled: bool, total: int | None) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="req", desc="replay", mininterval=0.5, smoothing=0.05)

    def update(self, n: int) -> None:
        if self.bar is not None and n:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


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
        self._progress = _Progress(progress, total)
        self.env = simpy.Environment()
        self._pending: list[Request] = []
        self._idle: simpy.Event | None = None
        self._source_done = False
        self._lookahead: TraceRequest | None = None
        self._last_arrival = -math.inf
        self._next_arrival = math.inf
        self._uid = 0
        self._req_rows: dict[str, list[Any]] = {}  # request id -> its (mutable) row
        self._req = RecordTable(REQUEST_COLUMNS)
        self._steps = RecordTable(STEP_COLUMNS)
        self._stats = PrefixCacheStats()
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
            self._progress.close()
        wall = time.perf_counter() - t0
        requests = finalize_requests(self._req.to_frame())
        steps = self._steps.to_frame()
        pool = self.scheduler.kv_cache_manager.block_pool
        summary = summarize(
            requests, steps, self._stats, sim_time_s=self.env.now, num_evictions=pool.num_evictions
        )
        return ReplayResult(requests, steps, self._stats, summary, wall, self.events)

    # -- processes ----------------------------------------------------------------------------
    def _guard(self, gen: Iterator[simpy.Event]) -> Iterator[simpy.Event]:
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
            if self._idle is not None and not self._idle.triggered:
                self._idle.succeed()
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

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
                if self._peek() is None and not self._pending:
                    return
                self._idle = env.event()
                yield self._idle
                self._idle = None
                continue
            if self.fast_forward:
                window = self._plan_window()
                if window is not None:
                    yield from self._run_window(window)
                    continue
            yield from self._step()

    # -- asynchronous scheduling ------------------------------------------------------------
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
        in_flight: deque[tuple[SchedulerOutput, StepResult, float, int, int]] = deque()
        while True:
            self._deliver_due(env.now)
            self._admit_pending()
            start = env.now
            new: tuple[SchedulerOutput, StepResult, float, int, int] | None = None
            if sched.has_requests():
                self.num_plain_steps += 1
                out = sched.schedule()
                if out.is_empty() and sched.waiting and not sched.running and all(o.is_empty() for o, *_ in in_flight):
                    raise ReplayError(self._stall_message())
                result = self.executor.execute(out)
                if not result.duration_s > 0:
                    raise ReplayError(f"executor returned a non-positive step time {result.duration_s}")
                for sr in out.scheduled:
                    if sr.admitted:
                        self._on_admit(sr.request, sr.hit_tokens, start)
                new = (out, result, start, len(sched.running), len(sched.waiting))
                in_flight.appendleft(new)
                if len(in_flight) < 2 and sched.has_requests():
                    yield env.timeout(result.duration_s)  # don't wait for the in-flight batch
                    self._record_step(new, 0)
                    continue
            elif not in_flight:
                if self._peek() is None and not self._pending:
                    return
                self._idle = env.event()
                yield self._idle
                self._idle = None
                continue
            old_out, old_result, *_ = in_flight.pop()
            firsts = [sr.request for sr in old_out.scheduled if sr.samples and not sr.request.output_token_ids]
            finished = sched.update_from_output(old_out, old_result.sampled_token_ids)
            now = env.now
            for r in firsts:
                if r.output_token_ids:
                    self._req_rows[r.request_id][_FIRST_TOKEN] = now
            for r in finished:
                self._on_finish(r, now)
            stats = sched.make_stats()
            if stats is not None:
                self._stats.add(stats)
            if new is not None:
                yield env.timeout(new[1].duration_s)
                self._record_step(new, len(finished))
            self._after_step()

    def _record_step(self, entry: tuple["SchedulerOutput", StepResult, float, int, int], finished: int) -> None:
        out, result, start, n_running, n_waiting = entry
        shape = step_shape(out)
        pool = self.scheduler.kv_cache_manager.block_pool
        self._steps.append(
            out.step, start, result.duration_s, len(out.scheduled), out.total_num_scheduled_tokens,
            shape.num_prefill_tokens, shape.num_decode_seqs, sum(1 for s in out.scheduled if s.admitted),
            len(out.preempted), finished, n_running, n_waiting, pool.get_num_free_blocks(),
            pool.num_cached_blocks, pool.get_usage(),
        )

    # -- one plain step -----------------------------------------------------------------------
    def _step(self) -> Iterator[simpy.Event]:
        env = self.env
        sched = self.scheduler
        start = env.now
        self.num_plain_steps += 1
        out = sched.schedule()
        if out.is_empty():
            raise ReplayError(self._stall_message())
        result = self.executor.execute(out)
        if not result.duration_s > 0:
            raise ReplayError(f"executor returned a non-positive step time {result.duration_s}")
        admitted = 0
        for s in out.scheduled:
            if s.admitted:
                admitted += 1
                self._on_admit(s.request, s.hit_tokens, start)
        shape = step_shape(out)
        n_running, n_waiting = len(sched.running), len(sched.waiting)
        firsts = [s.request for s in out.scheduled if s.samples and not s.request.output_token_ids]
        yield env.timeout(result.duration_s)
        finished = sched.update_from_output(out, result.sampled_token_ids)
        now = env.now
        for r in firsts:
            if r.output_token_ids:
                self._req_rows[r.request_id][_FIRST_TOKEN] = now
        for r in finished:
            self._on_finish(r, now)
        stats = sched.make_stats()
        if stats is not None:
            self._stats.add(stats)
        pool = sched.kv_cache_manager.block_pool
        self._steps.append(
            out.step,
            start,
            result.duration_s,
            len(out.scheduled),
            out.total_num_scheduled_tokens,
            shape.num_prefill_tokens,
            shape.num_decode_seqs,
            admitted,
            len(out.preempted),
            len(finished),
            n_running,
            n_waiting,
            pool.get_num_free_blocks(),
            pool.num_cached_blocks,
            pool.get_usage(),
        )
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
        rows = self._req_rows
        for j, (d, shape) in enumerate(zip(window.durations, window.shapes)):
            if j:
                self._deliver_due(env.now)
                self._admit_pending()
            start = env.now
            n_waiting = len(sched.waiting)
            yield env.timeout(d)
            for r in window.first_tokens[j]:
                rows[r.request_id][_FIRST_TOKEN] = env.now
            free, cached, n_finished = window.per_step[j]
            self._steps.append(
                first_step + j, start, d, shape.num_seqs, shape.num_new_tokens, shape.num_prefill_tokens,
                shape.num_decode_seqs, 0, 0, n_finished, n_running, n_waiting, free, cached,
                1.0 - free / total_blocks,
            )
        now = env.now
        for r in window.bulk + window.tail:
            if r.is_finished():
                self._on_finish(r, now)
        if self.integrity_check:
            sched.check_integrity()
        if self.on_step is not None:
            self.on_step(sched)

    # -- bookkeeping --------------------------------------------------------------------------
    def _make_request(self, tr: TraceRequest) -> Request:
        sched = self.scheduler
        max_len = sched.config.max_model_len
        if len(tr.tokens) > max_len:
            raise ReplayError(
                f"request {tr.id}: prompt of {len(tr.tokens)} tokens exceeds max_model_len {max_len}"
            )
        uid = self._uid
        self._uid += 1
        req = Request(
            tr.id,
            tr.tokens,
            tr.output_tokens,
            uid=uid,
            arrival_time=tr.arrival,
            cache_salt=tr.salt,
            lora_name=tr.lora,
            lora_int_id=0,
            priority=tr.priority,
            prompt_logprobs=tr.prompt_logprobs,
            output_token_ids=tr.output_token_ids,
            hasher=sched.hasher if sched.cache_config.enable_prefix_caching else None,
        )
        if tr.id in self._req_rows:
            raise ReplayError(f"duplicate request id {tr.id!r}")
        self._req_rows[tr.id] = self._req.append_mutable(
            tr.id, tr.arrival, None, None, None, req.num_prompt_tokens, tr.output_tokens, None, 0, "",
            tr.salt, tr.lora, tr.tenant, tr.session, tr.prompt_logprobs,
        )
        return req

    def _admit_pending(self) -> None:
        if self._pending:
            for r in self._pending:
                self.scheduler.add_request(r)
            self._pending.clear()

    def _on_admit(self, request: Request, hit_tokens: int, start: float) -> None:
        row = self._req_rows[request.request_id]
        if row[_FIRST_SCHEDULED] is None:
            row[_FIRST_SCHEDULED] = start
            row[_HIT_TOKENS] = hit_tokens
        else:
            prev = row[_READMIT]
            row[_READMIT] = f"{prev};{hit_tokens}" if prev else str(hit_tokens)
            row[_PREEMPTIONS] = request.num_preemptions

    def _on_finish(self, request: Request, now: float) -> None:
        row = self._req_rows[request.request_id]
        row[_FINISH] = now
        row[_PREEMPTIONS] = request.num_preemptions
        row[_OUTPUT_TOKENS] = len(request.output_token_ids)
        request.release_tokens()
        self._progress.update(1)

    def _after_step(self) -> None:
        if self.integrity_check:
            self.scheduler.check_integrity()
        if self.on_step is not None:
            self.on_step(self.scheduler)

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
