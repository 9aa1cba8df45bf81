"""One replica of a cluster: the exact single engine, fed by the router instead of the trace.

Mirrors one vLLM engine process behind a router: its own ``Scheduler`` (and so its own
``KVCacheManager`` and ``BlockPool``), executor, recorder and step loop (``sim.replay``), run as one
process on the cluster's shared clock. What differs from ``sim.replay.engine.Replay``:

* :class:`RoutedIntake` -- the replica's intake gets requests pushed by the dispatcher when the
  router picks it; a step start asks the dispatcher to route everything due by then first, so a
  request arriving at a step's start is still seen by that step (the single engine's pull rule);
  ``next_arrival`` is the cluster's next routing instant (any arrival may come here), and the
  intake is ``observed``: the router reads this replica's gauges, KV events and in-flight
  requests then, so a decode fast-forward window is over before it (never past it, not even while
  the replica's admissions are blocked, where the single engine's windows may run past arrivals);
* :class:`ReplicaRecorder` -- the single engine's recorder, which also tells the cluster about
  first tokens and finishes (the responses the router proxies) and step ends (published metrics
  and KV-event batches);
* :meth:`Replica.stop` / :meth:`Replica.start` -- a fault: the loop is stopped where it stands,
  the engine with its cache is dropped, and a fresh one is built when the replica comes back;
* an engine built on first use (``lazy``, the default for a replica without a CPU tier): until the
  router sends it a request, or something reads its engine, a replica holds no pool, scheduler,
  executor or step runner, and its loop is the engine loop's idle path -- deliver what is due
  (route), then wait -- so a fleet of mostly idle replicas costs what its busy ones do. A never-used
  engine is a fresh one whenever it is built (nothing in it depends on the time), and the loop
  makes the same calls in the same order as the engine loop of an empty engine, so results are the
  same either way (tested);
* a replica with vLLM 0.33.0's CPU offload tier (its engine's ``CacheConfig.offload``) has its own
  tier and transfer worker (``sim.replay.kv_transfer.LinkKVWorker``), rebuilt empty with the engine
  after a fault; its requests get the tier columns, and :attr:`Replica.tier_parts` keeps each
  incarnation's tier and worker for the summary (``sim.cluster.cluster_tier``).

With one replica and no faults every engine operation happens in the single engine's order, so
its tables equal ``Replay``'s exactly (tested). Imports neither simpy nor torch.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.cluster.router import ReplicaFacts, ReplicaMetrics, RouterRequest
from sim.core.executor import Executor
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.replay.engine import LoopProcess, SimClock, engine_loop
from sim.replay.intake import RequestIntake
from sim.replay.kv_transfer import LinkKVWorker
from sim.replay.recorder import ReplayRecorder
from sim.replay.step_runner import StepRunner
from workloads.trace_format import TraceRequest

if TYPE_CHECKING:  # pragma: no cover
    from sim.cluster.kv_event_pipeline import KVEventPipeline
    from sim.core.offload.tier import OffloadTier
    from sim.replay.step_runner import Wait

_RUNNING, _WAITING, _KV_USAGE = 10, 11, 14  # indexes in sim.replay.metrics.STEP_COLUMNS


@dataclass(frozen=True)
class ReplicaSpec:
    """How to build one replica's engine (resolved by ``sim.experiment``)."""

    name: str
    facts: ReplicaFacts
    build_scheduler: Callable[[], Scheduler]
    build_executor: Callable[[Scheduler], Executor]
    fast_forward: bool = True
    reject_invalid: bool = True  # a request the engine refuses is recorded as rejected (else ReplayError)
    # the CPU offload tier's worker of one incarnation (sim.replay.kv_transfer); None: no tier
    build_kv_worker: Callable[[], LinkKVWorker | None] | None = None


class ClusterHooks:
    """What a replica reports to its cluster (implemented by ``sim.cluster.cluster``)."""

    next_time: float = float("inf")
    done: bool = False

    def route_due(self, t: float) -> None: ...

    def first_token(self, replica: int, request_id: str) -> None: ...

    def finished(self, replica: int, request_id: str) -> None: ...

    def step_end(self, replica: int, row: tuple[Any, ...]) -> None:
        """A step row was recorded (``sim.replay.metrics.STEP_COLUMNS`` order; see
        :func:`row_metrics`)."""

    def step_ends(self, replica: int, columns: tuple[Sequence[Any], ...], ends: Sequence[float] | None = None) -> None:
        """A fast-forward window's rows were recorded, given as columns in ``STEP_COLUMNS`` order:
        the same as :meth:`step_end` on each row in step order (an override does it in bulk).
        ``ends``: :func:`step_end_times` of ``columns`` when the window already has them (its
        steps' starts after the first: each is the previous start + duration, the same float)."""
        for row in zip(*columns, strict=True):
            self.step_end(replica, row)


def row_metrics(row: tuple[Any, ...]) -> ReplicaMetrics:
    """The gauges a step row publishes, as of the step's end."""
    return ReplicaMetrics(row[1] + row[2], row[_WAITING], row[_RUNNING], row[_KV_USAGE])


def step_end_times(columns: tuple[Sequence[Any], ...]) -> list[float]:
    """Each row's end (start + duration, the same float :func:`row_metrics` computes)."""
    return list(map(operator.add, columns[1], columns[2]))


def window_metrics(columns: tuple[Sequence[Any], ...], ends: Sequence[float]) -> Iterator[ReplicaMetrics]:
    """:func:`row_metrics` of every row given as columns, in row order."""
    return map(ReplicaMetrics, ends, columns[_WAITING], columns[_RUNNING], columns[_KV_USAGE])


class RoutedIntake(RequestIntake):
    """A replica's intake: requests come from the router (see the module docstring)."""

    observed = True  # the router reads this replica's state when it routes: windows end before it

    def __init__(self, hooks: ClusterHooks, scheduler: Scheduler, rec: ReplayRecorder, reject_invalid: bool) -> None:
        super().__init__((), scheduler, rec, reject_invalid=reject_invalid)
        self._hooks = hooks

    @property
    def next_arrival(self) -> float:
        """The cluster's next routing instant (an arrival or a fault handing requests back)."""
        return self._hooks.next_time

    @next_arrival.setter
    def next_arrival(self, value: float) -> None:
        pass  # the base class's own bookkeeping; the cluster decides

    def peek(self) -> TraceRequest | None:
        return None

    def deliver_due(self, t: float) -> None:
        self._hooks.route_due(t)

    def push(self, tr: TraceRequest, routed: RouterRequest | None = None) -> bool:
        """Changes state: the router sent ``tr`` here; it joins the next step's admissions. False
        when the engine refuses it at intake (``sim.replay.rejection``: recorded as ``rejected``).
        ``routed``: the router's view of it, whose prompt keys the engine takes where the router
        hashed as this engine does (``RouterRequest.engine_hasher``), instead of hashing again."""
        hasher = self.scheduler.hasher
        request = self._make_request(tr, None if routed is None or hasher is None else routed.engine_hasher(hasher))
        if request is None:
            return False
        self._pending.append(request)
        return True

    def drained(self) -> bool:
        return self._hooks.done and not self._pending

    @property
    def pending(self) -> list[Request]:
        return self._pending


class ReplicaRecorder(ReplayRecorder):
    """The single engine's recorder, reporting responses and step ends to the cluster."""

    def __init__(self, index: int, hooks: ClusterHooks) -> None:
        super().__init__(False, None)
        self.index = index
        self._hooks = hooks

    @property
    def is_empty(self) -> bool:
        """Query: nothing was recorded (no request, no step: a replica that never had work)."""
        return not self._rows and not len(self._requests) and not len(self._steps)

    def first_token(self, request: Request, now: float) -> None:
        super().first_token(request, now)
        self._hooks.first_token(self.index, request.request_id)

    def finished(self, request: Request, now: float) -> None:
        super().finished(request, now)
        self._hooks.finished(self.index, request.request_id)

    def step(self, *values: Any) -> None:
        super().step(*values)
        self._hooks.step_end(self.index, values)

    def steps(self, *columns: Sequence[Any], ends: Sequence[float] | None = None) -> None:
        """A fast-forward window's rows: appended in one go, then reported to the cluster as step
        ends in step order (the router's gauges and the KV-event batches are per step, as in the
        plain loop; nothing else runs between a window's rows, so the order of the two is free)."""
        super().steps(*columns)
        self._hooks.step_ends(self.index, columns, ends)


class Replica:
    """One engine on the shared clock, with its faults (see the module docstring)."""

    def __init__(self, index: int, spec: ReplicaSpec, clock: SimClock, hooks: ClusterHooks, *,
                 integrity_check: bool = False, max_window_steps: int = 1 << 16,
                 event_sink: Callable[[Scheduler], Any] | None = None, lazy: bool = True) -> None:
        self.index = index
        self.spec = spec
        self.clock = clock
        self.hooks = hooks
        self.rec = ReplicaRecorder(index, hooks)
        self.integrity_check = integrity_check
        self.max_window_steps = max_window_steps
        self.event_sink = event_sink
        # a tiered replica builds at once: its tier's summary and request columns exist from the start
        self.lazy = lazy and not spec.facts.cpu_tier
        self.is_up = False
        self.process: LoopProcess | None = None
        self.num_evictions = 0  # of earlier incarnations
        self.incarnations = 0
        self.end_time = 0.0
        self._scheduler: Scheduler | None = None  # this incarnation's engine, once built
        self._intake: RoutedIntake | None = None
        self._runner: StepRunner | None = None
        self.tier_parts: list[tuple[OffloadTier, LinkKVWorker | None]] = []  # one per tiered incarnation
        self.released = self.released_built = False  # the run is over, the engine (if any) dropped

    @property
    def built(self) -> bool:
        """Query: this incarnation's engine exists (always, unless ``lazy`` and nothing used it yet),
        or existed until ``release``."""
        return self._scheduler is not None or self.released_built

    @property
    def scheduler(self) -> Scheduler:
        """This incarnation's engine (built now if it was not: a router reading it)."""
        if self._scheduler is None:
            self._build()
        assert self._scheduler is not None
        return self._scheduler

    @property
    def intake(self) -> RoutedIntake:
        """This incarnation's intake (built with the engine)."""
        if self._intake is None:
            self._build()
        assert self._intake is not None
        return self._intake

    def start(self) -> None:
        """Changes state: a fresh engine (empty cache) from now on -- built now, or on first use
        when ``lazy`` -- and its loop started now."""
        self._scheduler = self._intake = self._runner = None
        self.is_up = True
        self.incarnations += 1
        if not self.lazy:
            self._build()
        self.process = self.clock.start(self._loop())

    def _build(self) -> None:
        """Changes state: build this incarnation's engine, intake and step runner."""
        if self.released:  # (a router or test reading the engine after release would get a fresh one)
            raise RuntimeError(f"replica {self.index}'s engine was released after the run")
        assert self.is_up, "a replica that is down has no engine"
        sched = self.spec.build_scheduler()
        if self.event_sink is not None:
            sched.kv_cache_manager.block_pool.event_sink = self.event_sink(sched)
        executor = self.spec.build_executor(sched)
        worker = self.spec.build_kv_worker() if self.spec.build_kv_worker is not None else None
        if sched.tier is not None:  # the CPU offload tier: its request columns (once) and its summary
            if worker is None:
                raise ValueError(f"{self.spec.name}: a scheduler with a CPU offload tier needs a kv_worker")
            if not self.tier_parts:
                self.rec.enable_tier()
            self.tier_parts.append((sched.tier, worker))
        self._scheduler = sched
        self._intake = RoutedIntake(self.hooks, sched, self.rec, self.spec.reject_invalid)
        self._runner = StepRunner(sched, executor, self._intake, self.rec, self.clock.env,
                                  fast_forward=self.spec.fast_forward, integrity_check=self.integrity_check,
                                  max_window_steps=self.max_window_steps, on_step=None, kv_worker=worker)

    def _loop(self) -> Iterator[Wait]:
        while self._runner is None:  # no engine yet: the engine loops' idle path, call for call
            self.hooks.route_due(self.clock.now)  # (intake.admit_due's delivery; a push builds the engine)
            if self._runner is not None:
                break  # the same instant's admit_due in the engine loop delivers nothing more
            if self.hooks.done:  # (intake.drained: nothing can come here any more)
                self.end_time = self.clock.now
                return
            yield None
        yield from engine_loop(self._runner)
        self.end_time = self.clock.now

    def stop(self, held: list[str]) -> None:
        """Changes state: the replica goes down now, with its cache and the requests it ``held``
        (routed here and not finished: the cluster's own count, which also covers a request a
        fast-forward window had finished ahead of the clock); their rows are forgotten."""
        assert self.process is not None
        self.process.stop()
        if self._scheduler is not None:
            self.num_evictions += self._scheduler.kv_cache_manager.block_pool.num_evictions
        self.is_up = False
        for rid in held:
            self.rec.forget(rid)

    def release(self, pipeline: KVEventPipeline | None = None) -> None:
        """Changes state: after the run, drop this incarnation's engine -- its pool, tables and
        intake, most of a used replica's memory -- keeping what the results read: ``rec``,
        ``tier_parts``, ``end_time`` and the eviction count (``total_evictions`` is unchanged).
        ``pipeline``: the fleet's KV-event pipeline, whose raw log for this replica holds the engine's
        scheduler (its step tags) and would otherwise keep the whole engine alive."""
        if pipeline is not None:
            pipeline.detach(self.index)
        self.num_evictions = self.total_evictions  # (the live engine's folded in: a down one had its own)
        self.released, self.released_built = True, self._scheduler is not None
        self._scheduler = self._intake = self._runner = None

    def wake(self) -> None:
        if self.process is not None:
            self.process.wake()

    @property
    def total_evictions(self) -> int:
        live = self._scheduler if self.is_up else None
        return self.num_evictions + (live.kv_cache_manager.block_pool.num_evictions if live is not None else 0)
