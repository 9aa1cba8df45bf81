"""KV events from the replicas to the router: per-step batches, delivered after a delay.

Mirrors vLLM's KV-event publishing (``vllm/distributed/kv_events.py``: the engine drains the
events of a step after ``update_from_output`` and publishes them as one batch over ZMQ) and a
subscriber that sees them later (llm-d's ``kvevents.Pool``, Dynamo's ``KvIndexer`` over NATS).

* each replica's block pool writes into a collector, tagged with the scheduler step they belong
  to (``Scheduler.step_index``; the decode fast-forward sets it per played step); a replica with a
  CPU offload tier adds the tier's events (``medium="CPU"``) after the pool's of the same step, as
  vLLM appends ``connector.take_events()`` to the batch (``sim.core.offload.tier``);
* when the replica records step ``s`` (at its end time), every collected event of steps ``<= s``
  becomes one batch, due at ``end + delay`` with ``delay`` drawn from the configured distribution
  -- never before the replica's previous batch (a ZMQ stream keeps its order);
* the router receives every batch due by the time it routes (:meth:`deliver_until`): no clock
  event is spent on a batch, so idle replicas and quiet routers cost nothing;
* a replica that goes down drops its undelivered batches (a crash loses the socket buffer), and
  batches of an earlier incarnation are never delivered after it comes back.

Raw batches (``raw=True``, for a router whose ``on_kv_events`` only feeds its KV-event index:
``Router.raw_kv_events``): a replica whose pool is compiled and which has no CPU tier writes its
events into a :class:`sim.core.compiled_pool.KVEventLog` -- kind and hashes as 64-bit words, in C,
no Python object per block event -- and its batches are :class:`~sim.core.compiled_pool.RawEventBatch`
slices of it, cut at the same steps, due at the same times, counted the same (``len``: events).
A fast-forward window's batches that are due by its end (all of them without a delay) travel as
one batch, counted as the batches it holds (``publish_rows``): the next delivery -- never before
the present -- takes them all at once either way, and a raw router's index keeps each replica's
blocks apart, so it reads the same at every routing instant.
The event objects stay where something reads more than kind and hashes: recorded events
(``record``), a replica with a CPU tier (the tiered index reads parent and tokens), the Python
pool, and every other router; the object path is the raw path's oracle in the tests.

Invariants: batches of one replica are delivered in step order; delivery times never decrease
per replica. Imports neither simpy nor torch.
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from sim.core.kv_events import EventSink, KVCacheEvent

if TYPE_CHECKING:
    from sim.core.compiled_pool import KVEventLog, RawEventBatch

    EventBatch: TypeAlias = list[KVCacheEvent] | RawEventBatch

_Log: type[KVEventLog] | None
_Pool: type | None
try:  # the compiled pool's raw event log (sim.core.compiled_pool); not built: event objects only
    from sim.core.compiled_pool import CompiledBlockPool as _Pool
    from sim.core.compiled_pool import KVEventLog as _Log
except ImportError:  # pragma: no cover
    _Log = _Pool = None

_StepTagger: Callable[[list[int], list[Any], Any], EventSink] | None
try:  # the sink in C (sim.cluster.compiled_index): the same appends without a Python frame per event
    from sim.cluster.compiled_index import StepTagger as _StepTagger
except ImportError:  # pragma: no cover - not built: the closure below, same lists
    _StepTagger = None

DelaySampler = Callable[[], float]


@dataclass(frozen=True, slots=True)
class FixedDelay:
    """A fixed delay: every draw is ``value`` (a window's merged batches need no draw to know it)."""

    value: float

    def __call__(self) -> float:
        return self.value


def delay_sampler(spec: dict[str, Any] | float, seed: int) -> DelaySampler:
    """A delay distribution in seconds: a number (fixed), or ``{dist: fixed|uniform|exponential|
    lognormal, ...}`` with ``mean_s`` (fixed, exponential), ``low_s``/``high_s`` (uniform),
    ``median_s``/``sigma`` (lognormal)."""
    if not isinstance(spec, dict):
        return FixedDelay(float(spec))
    rng = random.Random(seed)
    dist = spec.get("dist", "fixed")
    if dist == "fixed":
        return FixedDelay(float(spec["mean_s"]))
    if dist == "uniform":
        lo, hi = float(spec["low_s"]), float(spec["high_s"])
        return lambda: rng.uniform(lo, hi)
    if dist == "exponential":
        mean = float(spec["mean_s"])
        return lambda: rng.expovariate(1.0 / mean) if mean > 0 else 0.0
    if dist == "lognormal":
        import math

        mu, sigma = math.log(float(spec["median_s"])), float(spec["sigma"])
        return lambda: rng.lognormvariate(mu, sigma)
    raise ValueError(f"unknown delay distribution {dist!r}")


class _Collected:
    """One replica's events not yet batched: their step tags and the events, in emission order,
    read from ``start`` (the front is dropped in bulk once it is most of the lists). ``sorted``:
    the tags never decrease (an untiered engine's: ``step_index`` only grows), so a step's cut is a
    bisection; a tiered engine's tier events are tagged one step back (``sim.core.offload.tier``),
    so its cut is found by walking, as a queue's front would be taken."""

    __slots__ = ("steps", "events", "start", "sorted")

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.events: list[KVCacheEvent] = []
        self.start = 0
        self.sorted = True

    def __len__(self) -> int:
        return len(self.steps) - self.start

    def front(self) -> int | None:
        """Query: the step tag of the first event not yet taken (None: none left)."""
        return self.steps[self.start] if self.start < len(self.steps) else None

    def take(self, step: int) -> list[KVCacheEvent] | None:
        """Changes state: the events from the front up to the first tagged after ``step`` (None:
        none). Cost: a bisection and a slice, not a Python step per event."""
        steps, start = self.steps, self.start
        n = len(steps)
        if start == n or steps[start] > step:
            return None
        if self.sorted:
            cut = bisect_right(steps, step, start)
        else:
            cut = start + 1
            while cut < n and steps[cut] <= step:
                cut += 1
        batch = self.events[start:cut]
        if cut == n:
            del steps[:], self.events[:]  # (the same lists: the sinks hold their append methods)
            self.start = 0
        elif cut > 4096 and 2 * cut > n:
            del steps[:cut], self.events[:cut]
            self.start = 0
        else:
            self.start = cut
        return batch

    def clear(self) -> None:
        del self.steps[:], self.events[:]
        self.start = 0


class KVEventPipeline:
    """Collectors, batches in flight and their delivery (see the module docstring)."""

    def __init__(self, num_replicas: int, delay: DelaySampler,  # deliver(replica, EventBatch)
                 deliver: Callable[[int, Any], None], record: bool = False, raw: bool = False) -> None:
        self.delay = delay
        self._fixed = delay.value if isinstance(delay, FixedDelay) else None
        self._deliver = deliver
        self._collected: list[_Collected | KVEventLog] = [_Collected() for _ in range(num_replicas)]
        self.raw = raw and not record and _Log is not None
        self._last_due = [0.0] * num_replicas
        self._epoch = [0] * num_replicas
        # (due, seq, replica, epoch, batch, batches merged into it: publish_rows)
        self._in_flight: list[tuple[float, int, int, int, EventBatch, int]] = []
        self._seq = 0
        self.num_batches = 0
        self.num_events = 0
        self.recorded: list[tuple[int, int, KVCacheEvent]] | None = [] if record else None

    def sink(self, replica: int, scheduler: Any) -> EventSink:
        """The event sink of a replica's block pool (events tagged with ``scheduler.step_index``):
        its raw log where the module docstring says so, else a collector of event objects."""
        log = self._raw_log(replica, scheduler)
        if log is not None:
            return log
        c = self._collected[replica]
        assert isinstance(c, _Collected)
        if getattr(scheduler, "tier", None) is not None:
            c.sorted = False  # (kept for the rest of the run: a later incarnation has the same tier)
        tag, keep = c.steps.append, c.events.append
        recorded = self.recorded
        if recorded is None and _StepTagger is not None:
            return _StepTagger(c.steps, c.events, scheduler)
        if recorded is None:
            def collect(event: KVCacheEvent) -> None:
                tag(scheduler.step_index)
                keep(event)

            return collect

        def collect_recorded(event: KVCacheEvent) -> None:
            step = scheduler.step_index
            tag(step)
            keep(event)
            recorded.append((replica, step, event))

        return collect_recorded

    def _raw_log(self, replica: int, scheduler: Any) -> KVEventLog | None:
        """The replica's raw log, bound to ``scheduler``, when its events may travel raw (None:
        objects). A replica keeps one kind of collector (its incarnations have the same spec)."""
        if _Log is None:
            return None
        c = self._collected[replica]
        pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
        raw = self.raw and getattr(scheduler, "tier", None) is None and type(pool) is _Pool
        if isinstance(c, _Log):
            if raw:
                c.bind(scheduler)
                return c
            if len(c):
                raise ValueError(f"replica {replica}: raw KV events not yet batched, and a sink of objects asked for")
            self._collected[replica] = _Collected()
            return None
        if raw and not len(c):
            log = self._collected[replica] = _Log(scheduler)
            return log
        return None

    def publish(self, replica: int, step: int, end: float) -> None:
        """Changes state: the replica finished step ``step`` at ``end``: batch what it emitted."""
        batch = self._collected[replica].take(step)
        if batch is None:
            return
        due = max(end + self.delay(), self._last_due[replica])
        self._last_due[replica] = due
        self._seq += 1
        heapq.heappush(self._in_flight, (due, self._seq, replica, self._epoch[replica], batch, 1))

    def publish_rows(self, replica: int, steps: Sequence[int], ends: Sequence[float]) -> None:
        """Changes state: :meth:`publish` for each of a window's steps, in step order (the events
        were all collected before: the window's engine work is done when its rows are recorded)."""
        c = self._collected[replica]
        n = len(steps)
        if len(ends) != n:
            raise ValueError(f"{n} steps but {len(ends)} ends")
        if n and steps[-1] - steps[0] == n - 1:
            if _Log is not None and isinstance(c, _Log):
                self._publish_merged(replica, c, steps, ends)
                return
            # a window's rows (consecutive step indexes): the row that publishes the front event
            # is found from its tag, the first row whose step reaches it -- a Python step per
            # batch, not per row; the rows skipped publish nothing, as in the loop below
            first = steps[0]
            while (front := c.front()) is not None:
                j = front - first
                if j >= n:
                    return
                j = max(j, 0)
                self.publish(replica, steps[j], ends[j])
            return
        for step, end in zip(steps, ends, strict=True):
            front = c.front()
            if front is None:
                return  # no event left to batch: the later steps publish nothing
            if front <= step:
                self.publish(replica, step, end)

    def _publish_merged(self, replica: int, log: KVEventLog, steps: Sequence[int], ends: Sequence[float]) -> None:
        """:meth:`publish_rows` of a window's rows (consecutive steps) on a raw log, the batches
        that are due by the window's end merged into one (a raw router only feeds its index, whose
        replicas' bits are independent, so what it reads at a routing instant is the same): each
        row that publishes draws its delay and gets its due as in :meth:`publish`, in row order
        (the same draws); while those dues are at most the window's end -- the present, so every
        later delivery takes all of them at once, in the same order -- their events travel as one
        batch, due at the first one's due and counted as that many batches; the rest (a delay
        past the window's end) are published one by one, as before. A fixed delay needs no loop
        when every row's due is at most the window's end (the common case): the dues are then
        known from the first and the last row alone."""
        first, last, bound = steps[0], steps[-1], ends[-1]
        # the rows that publish: the first whose step reaches each event's tag (the tags up to the
        # first step: row 0); the tags' distinct values come in order (tags_upto, in C)
        tags = log.tags_upto(last)
        if not tags:
            return
        early = bisect_right(tags, first)
        fixed = self._fixed
        if fixed is not None:
            # every draw is `fixed`, and a window's row ends never decrease (a step ends when the
            # next starts), so the running max of the dues is the last row's, and the first row's
            # due heads the merged batch when that last one is at most the window's end
            top = max(ends[tags[-1] - first if tags[-1] > first else 0] + fixed, self._last_due[replica])
            if top <= bound:
                head_due = max(ends[0 if early else tags[0] - first] + fixed, self._last_due[replica])
                self._last_due[replica] = top
                self._push(replica, head_due, log.take(last), len(tags) - early + (1 if early else 0))
                return
        rows = ([0] if early else []) + [t - first for t in tags[early:]]
        merged, head_due = 0, 0.0
        for i, j in enumerate(rows):
            due = max(ends[j] + self.delay(), self._last_due[replica])
            self._last_due[replica] = due
            if due > bound:  # (dues never decrease: the rest are past the window's end too)
                if merged:
                    self._push(replica, head_due, log.take(steps[rows[i - 1]]), merged)
                    merged = 0
                self._push(replica, due, log.take(steps[j]), 1)
                continue
            if not merged:
                head_due = due
            merged += 1
        if merged:
            self._push(replica, head_due, log.take(last), merged)

    def _push(self, replica: int, due: float, batch: EventBatch | None, count: int) -> None:
        assert batch is not None
        self._seq += 1
        heapq.heappush(self._in_flight, (due, self._seq, replica, self._epoch[replica], batch, count))

    def deliver_until(self, now: float) -> None:
        """Changes state: hand the router every batch due by ``now``, in due order."""
        heap = self._in_flight
        while heap and heap[0][0] <= now:
            _, _, replica, epoch, batch, count = heapq.heappop(heap)
            if epoch != self._epoch[replica]:
                continue  # sent by an incarnation that crashed since
            self.num_batches += count
            self.num_events += len(batch)
            self._deliver(replica, batch)

    def detach(self, replica: int) -> None:
        """Changes state: the run is over: the replica's raw log lets go of the scheduler it tags
        events with, so a released engine is freed (``Replica.release``). Nothing is lost: every
        event was taken by then, and a log that is detached takes no more events."""
        c = self._collected[replica]
        if _Log is not None and isinstance(c, _Log):
            c.bind(None)

    def drop(self, replica: int) -> None:
        """Changes state: the replica went down: its collected and in-flight events are lost."""
        self._collected[replica].clear()
        self._epoch[replica] += 1
