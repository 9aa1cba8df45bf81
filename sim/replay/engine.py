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

Invariant: the loops never see simpy; the only clock events are the ones made here, in the order
the loops ask for them. Nothing else in ``sim`` or ``workloads`` imports simpy (import contract).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import simpy

from sim.core.executor import Executor
from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.core.scheduler import Scheduler
from sim.replay.async_loop import async_steps
from sim.replay.attribution import MissAttribution
from sim.replay.errors import ReplayError
from sim.replay.intake import ARRIVAL_EPS_S, RequestIntake
from sim.replay.metrics import summarize
from sim.replay.recorder import ReplayRecorder
from sim.replay.step_runner import StepRunner
from sim.replay.sync_loop import sync_steps
from workloads.trace_format import TraceRequest

if TYPE_CHECKING:  # pandas is imported only when the tables are built (sim.replay.metrics)
    import pandas as pd

__all__ = ["Replay", "ReplayError", "ReplayResult"]

_Process = Generator[simpy.Event, Any, None]


@dataclass
class ReplayResult:
    """Tables and totals of one replay."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    prefix_cache: PrefixCacheStats
    summary: dict[str, Any]
    wall_time_s: float = 0.0
    events: list[tuple[int, Any]] = field(default_factory=list)
    blocks: pd.DataFrame | None = None  # replay.attribution: full -- one row per prompt block


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
    ) -> None:
        if attribution not in ("off", "summary", "full"):
            raise ValueError(f"attribution must be off, summary or full, got {attribution!r}")
        self.scheduler = scheduler
        self.rec = ReplayRecorder(progress, total)
        self.env = simpy.Environment()
        self.intake = RequestIntake(requests, scheduler, self.rec, reject_invalid=reject_invalid)
        self.runner = StepRunner(
            scheduler, executor, self.intake, self.rec, self.env, fast_forward=fast_forward,
            integrity_check=integrity_check, max_window_steps=max_window_steps, on_step=on_step,
        )
        self._idle: simpy.Event | None = None
        self._error: Exception | None = None
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
        self.env.process(self._guard(self._arrivals()))
        engine = self.env.process(self._guard(self._engine()))
        gc.freeze()  # what exists before the replay (modules, configs) stays out of its GC passes
        try:
            self.env.run(until=engine)
        except Exception:
            # SimPy re-creates a failed process's exception from its args; raise the original
            if self._error is not None:
                raise self._error from None
            raise
        finally:
            gc.unfreeze()
            self.rec.close()
        wall = time.perf_counter() - t0
        requests, steps = self.rec.tables()
        pool = self.scheduler.kv_cache_manager.block_pool
        summary = summarize(requests, steps, self.rec.stats, sim_time_s=self.env.now, num_evictions=pool.num_evictions)
        blocks = None
        if self.attribution is not None:
            requests, blocks = self.attribution.tables(requests, check=self.integrity_check)
            summary.update(self.attribution.records.summary())
        return ReplayResult(requests, steps, self.rec.stats, summary, wall, self.events, blocks)

    def _guard(self, gen: _Process) -> _Process:
        """Run a process body, remembering the first exception it raises."""
        try:
            return (yield from gen)
        except Exception as exc:
            if self._error is None:
                self._error = exc
            raise

    def _arrivals(self) -> _Process:
        """The arrival process: sleeps until the next arrival, delivers it, wakes an idle engine."""
        env = self.env
        intake = self.intake
        while (tr := intake.peek()) is not None:
            if tr.arrival > env.now + ARRIVAL_EPS_S:
                yield env.timeout(tr.arrival - env.now)
            intake.deliver_due(env.now)
            self._wake()
        self._wake()

    def _wake(self) -> None:
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _engine(self) -> _Process:
        """The engine process: the step loop's waits as clock events."""
        env = self.env
        loop = async_steps if self.scheduler.config.async_scheduling else sync_steps
        for wait in loop(self.runner):
            if wait is None:
                self._idle = env.event()
                yield self._idle
                self._idle = None
            else:
                yield env.timeout(wait)

    def _record_event(self, event: Any) -> None:
        self.events.append((self.scheduler.step_index, event))
