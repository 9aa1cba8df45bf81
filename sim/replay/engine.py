"""The SimPy replay: arrivals and engine steps on one clock -- the only module that imports simpy.

Two processes share one ``simpy.Environment``:

* **arrivals** walks the request stream (sorted by ``arrival``, :mod:`sim.replay.intake`), makes
  each record due at its arrival time and wakes an idle engine;
* **engine** drives a step loop -- :mod:`sim.replay.sync_loop` (vLLM's ``EngineCore.step``) or,
  with ``async_scheduling``, :mod:`sim.replay.async_loop` (``step_with_batch_queue``) -- turning
  each value it yields into a clock event: a float is a step of that many seconds
  (``env.timeout``), None an idle wait until the arrivals process wakes it.

Timing semantics (documented contract, tested):

* a request becomes visible at the first engine step that **starts at or after** its arrival
  (to 1 ns, ``ARRIVAL_EPS_S``);
* an idle engine (nothing unfinished) starts its next step at the next arrival;
* ``first_scheduled`` is the start of the step that admitted the request, ``first_token`` the end of
  the step that sampled its first token, ``finish`` the end of the step that sampled its last.

With ``attribution`` (``summary`` or ``full``) a :class:`~sim.replay.attribution.MissAttribution`
observes the pool and adds the miss causes to the tables and the summary; it changes no decision.

With ``fast_forward`` and an executor that can price a step shape without running it (``price``),
runs of predictable steps are played by :mod:`sim.replay.decode_window`; results are identical to
the plain loop (a test compares every table, stat and KV event).

:class:`SimClock` and :class:`LoopProcess` are the hook for several engines on one clock: any loop
of Wait values (an engine's, an arrival walker's, ``sim.cluster``'s router) runs as a process on a
shared clock, and a replica's loop can be stopped where it stands (a fault).

Invariant: the loops never see simpy; the only clock events are the ones made here, in the order
the loops ask for them. Nothing else in ``sim`` or ``workloads`` imports simpy (import contract).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import simpy

from sim.core.executor import Executor
from sim.core.native_build import warn_if_interpreted
from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.core.scheduler import Scheduler
from sim.replay.async_loop import async_steps
from sim.replay.attribution import MissAttribution
from sim.replay.errors import ReplayError
from sim.replay.gc_policy import replay_gc
from sim.replay.intake import ARRIVAL_EPS_S, RequestIntake
from sim.replay.kv_transfer import LinkKVWorker
from sim.replay.metrics import Frame, as_frame, summarize
from sim.replay.recorder import ReplayRecorder
from sim.replay.step_runner import StepRunner, Wait
from sim.replay.sync_loop import sync_steps
from sim.replay.tier_metrics import tier_summary
from workloads.trace_format import TraceRequest

if TYPE_CHECKING:  # pandas is imported only when a DataFrame is asked for (sim.replay.table)
    import pandas as pd

__all__ = ["LoopProcess", "Replay", "ReplayError", "ReplayResult", "SimClock", "engine_loop"]

_Process = Generator[simpy.Event, Any, None]


@dataclass
class ReplayResult:
    """Tables and totals of one replay.

    ``request_table`` / ``step_table`` are what the replay made: :class:`~sim.replay.table.Table`
    columns, written and summarised without pandas; ``requests`` / ``steps`` are their DataFrames,
    made on first use (then kept: the field holds the DataFrame from there on, so changes to it
    are seen by every later reader)."""

    request_table: Frame
    step_table: Frame
    prefix_cache: PrefixCacheStats
    summary: dict[str, Any]
    wall_time_s: float = 0.0
    events: list[tuple[int, Any]] = field(default_factory=list)
    blocks: pd.DataFrame | None = None  # replay.attribution: full -- one row per prompt block

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request (``sim.replay.metrics``), as a DataFrame."""
        self.request_table = frame = as_frame(self.request_table)
        return frame

    @property
    def steps(self) -> pd.DataFrame:
        """One row per engine step (``sim.replay.metrics``), as a DataFrame."""
        self.step_table = frame = as_frame(self.step_table)
        return frame


class LoopProcess:
    """A step loop (a generator of :data:`~sim.replay.step_runner.Wait` values) as one SimPy process.

    A float is a clock advance (``env.timeout``); None an idle wait until :meth:`wake`. This is the
    hook that lets several engine loops (``sim.cluster``), or a loop and an arrival walker, share
    one clock: every process on one :class:`SimClock` sees the same ``now``. :meth:`stop` ends the
    loop where it is (a replica going down): the generator is closed, its pending wait dropped.
    """

    def __init__(self, clock: SimClock, loop: Iterator[Wait], on_error: Callable[[Exception], None]) -> None:
        self.clock = clock
        self._loop = loop
        self._idle: simpy.Event | None = None
        self._on_error = on_error
        self.done = False
        self.process = clock.env.process(self._run())

    def _run(self) -> _Process:
        env = self.clock.env
        try:
            for wait in self._loop:
                if wait is None:
                    self._idle = env.event()
                    yield self._idle
                    self._idle = None
                else:
                    yield env.timeout(wait)
        except simpy.Interrupt:
            close = getattr(self._loop, "close", None)  # stopped from outside (the replica went down)
            if close is not None:
                close()
        except Exception as exc:
            self._on_error(exc)
            raise
        finally:
            self.done = True

    @property
    def idle(self) -> bool:
        """Query: the loop waits for :meth:`wake` (nothing to do)."""
        return self._idle is not None

    def wake(self) -> None:
        """Changes state: end an idle wait (no-op when the loop is not idle)."""
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def stop(self) -> None:
        """Changes state: end the loop now, wherever it waits (a step in flight is abandoned)."""
        if not self.done and self.process.is_alive:
            self.process.interrupt()


class SimClock:
    """One SimPy environment shared by every process of a replay (the :class:`Clock` of the loops)."""

    def __init__(self) -> None:
        self.env = simpy.Environment()
        self.error: Exception | None = None

    @property
    def now(self) -> float:
        return self.env.now

    def remember(self, exc: Exception) -> None:
        """The first exception a process raised (SimPy re-creates it from its args)."""
        if self.error is None:
            self.error = exc

    def start(self, loop: Iterator[Wait]) -> LoopProcess:
        """Changes state: run ``loop`` as a process from now on."""
        return LoopProcess(self, loop, self.remember)

    def run(self, until: LoopProcess | None = None) -> None:
        """Changes state: run until ``until`` finishes (default: until no event is left); raises the
        first exception a process raised."""
        try:
            self.env.run(until=until.process if until is not None else None)
        except Exception:
            if self.error is not None:
                raise self.error from None
            raise


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
        total: int | Callable[[], int] | None = None,
        record_events: bool = False,
        max_window_steps: int = 1 << 16,
        on_step: Callable[[Scheduler], None] | None = None,
        reject_invalid: bool = True,
        attribution: str = "off",
        kv_worker: LinkKVWorker | None = None,
    ) -> None:
        if attribution not in ("off", "summary", "full"):
            raise ValueError(f"attribution must be off, summary or full, got {attribution!r}")
        warn_if_interpreted()  # once per process, when the mypyc build is missing (sim.core.native_build)
        self.scheduler = scheduler
        self.rec = ReplayRecorder(progress, total)
        self.clock = SimClock()
        self.env = self.clock.env
        self.intake = RequestIntake(requests, scheduler, self.rec, reject_invalid=reject_invalid)
        self.runner = StepRunner(
            scheduler, executor, self.intake, self.rec, self.env, fast_forward=fast_forward,
            integrity_check=integrity_check, max_window_steps=max_window_steps, on_step=on_step,
            kv_worker=kv_worker,
        )
        if scheduler.tier is not None:  # the CPU offload tier: its request columns and summary keys
            if kv_worker is None:
                raise ValueError("a scheduler with a CPU offload tier needs a kv_worker (sim.replay.kv_transfer)")
            self.rec.enable_tier()
        self.kv_worker = kv_worker
        self._engine: LoopProcess | None = None
        self.events: list[tuple[int, Any]] = []
        if record_events:
            scheduler.kv_cache_manager.block_pool.event_sink = self._record_event
        self.attribution: MissAttribution | None = None
        if attribution != "off":
            # the observer needs a pool with the hooks of sim.core.cache_observer: both pools
            # (sim.core.pool_impl) have them, and tell them the same calls (tests/test_compiled_pool.py)
            self.attribution = MissAttribution(scheduler, full=attribution == "full")
            scheduler.kv_cache_manager.block_pool.observer = self.attribution
        self.integrity_check = integrity_check

    @property
    def num_plain_steps(self) -> int:
        """Steps run through ``schedule()``."""
        return self.runner.num_plain_steps

    @property
    def num_window_steps(self) -> int:
        """Steps played by the decode fast-forward."""
        return self.runner.num_window_steps

    def run(self) -> ReplayResult:
        t0 = time.perf_counter()
        clock = self.clock
        clock.start(self._arrivals())
        self._engine = clock.start(engine_loop(self.runner))
        try:
            with replay_gc():  # fewer, smaller GC passes (sim.replay.gc_policy)
                clock.run(until=self._engine)
        finally:
            self.rec.close()
        wall = time.perf_counter() - t0
        requests, steps = self.rec.tables()
        pool = self.scheduler.kv_cache_manager.block_pool
        summary = summarize(requests, steps, self.rec.stats, sim_time_s=self.env.now, num_evictions=pool.num_evictions)
        if self.scheduler.tier is not None:
            summary.update(tier_summary(self.scheduler.tier, self.kv_worker))
        blocks = None
        if self.attribution is not None:
            requests, blocks = self.attribution.tables(as_frame(requests), check=self.integrity_check)
            summary.update(self.attribution.records.summary())
        return ReplayResult(requests, steps, self.rec.stats, summary, wall, self.events, blocks)

    def _arrivals(self) -> Iterator[Wait]:
        """The arrival process: sleeps until the next arrival, delivers it, wakes an idle engine."""
        env = self.env
        intake = self.intake
        while (tr := intake.peek()) is not None:
            if tr.arrival > env.now + ARRIVAL_EPS_S:
                yield tr.arrival - env.now
            intake.deliver_due(env.now)
            self._wake()
        self._wake()

    def _wake(self) -> None:
        if self._engine is not None:
            self._engine.wake()

    def _record_event(self, event: Any) -> None:
        self.events.append((self.scheduler.step_index, event))


def engine_loop(runner: StepRunner) -> Iterator[Wait]:
    """The step loop of ``runner``'s scheduler: vLLM's sync ``EngineCore.step`` or, with
    ``async_scheduling``, ``step_with_batch_queue``."""
    return async_steps(runner) if runner.scheduler.config.async_scheduling else sync_steps(runner)
