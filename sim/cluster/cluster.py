"""Cluster replay: N exact engines on one SimPy clock behind a router.

Mirrors a fleet of vLLM replicas behind an inference router. Three kinds of process share one
:class:`~sim.replay.engine.SimClock`:

* the **dispatcher** walks the request stream (arrival order, checked) and, at each arrival, lets
  the router choose among the replicas that are up, then pushes the request into that replica's
  intake and wakes it if idle; before each decision the router receives the KV-event batches due
  by then (:mod:`sim.cluster.kv_event_pipeline`);
* one **engine loop per replica** (:mod:`sim.cluster.replica`): the single engine, unchanged;
* the **faults**: at ``down_at`` a replica stops where it stands and loses its cache and its
  requests, which the router routes again at once (counted in ``reroutes``; their TTFT still
  runs from their original arrival); at ``up_at`` a fresh engine starts with an empty cache.

Events scale with work: a replica with nothing to do sleeps without events, KV batches and
metric scrapes cost no clock event, and the decode fast-forward of a busy replica runs up to the
next routing instant (the next arrival or fault: any of them may send it work).

Results: one request table (``replica`` where the request finished, ``reroutes``,
``believed_hit_tokens``), one step table (``replica`` column), the summary of the whole fleet
(``sim.replay.metrics.summarize`` over the combined tables, plus the ``cluster`` block of
:mod:`sim.cluster.cluster_summary`), and each replica's own tables and summary; with CPU offload
tiers, the tier's request columns and summary keys, per replica and summed over the fleet
(:mod:`sim.cluster.cluster_tier`); with a KV store the fleet shares (:mod:`sim.cluster.kv_store`), the
store's keys instead (:mod:`sim.cluster.kv_store_summary`).
With ``attribution`` (``summary`` or ``full``) every replica's pool is observed by a miss
attribution with the fleet's cause ``routed_away`` (:mod:`sim.cluster.fleet_attribution`): the
requests gain the ``miss_<cause>_tokens`` columns, the summaries ``miss_attribution``, and ``full``
the ``blocks`` rows (with ``replica``); it changes no decision.

Invariants: with one replica and no faults, replica 0's tables and summary equal
``sim.replay.engine.Replay``'s for the same stream, for every router (tested); every request
finishes exactly once (else ReplayError). A replica that never had work (``sim.cluster.replica``:
its engine is built on first use) adds no table rows: the replicas' tables are the same empty
tables, its summary the one of an empty engine at its end time, computed once per end time, so a
fleet of mostly idle replicas is summarised in the time its busy ones take. Imports neither simpy
nor torch.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sim.cluster.cluster_tier import fleet_tier_summary, replica_tier_summary, tier_row
from sim.cluster.fleet_attribution import FleetAttributions
from sim.cluster.fleet_tables import ReplicaTables, replica_tables, table_result
from sim.cluster.kv_event_pipeline import DelaySampler, KVEventPipeline
from sim.cluster.kv_store import KVStore
from sim.cluster.replica import ClusterHooks, Replica, ReplicaSpec, row_metrics, step_end_times, window_metrics
from sim.cluster.router import ClusterView, ReplicaMetrics, Router, RouterRequest
from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.core.scheduler import Scheduler
from sim.replay.arrival_stream import ArrivalStream
from sim.replay.attribution_records import check_attribution
from sim.replay.engine import ReplayResult, SimClock
from sim.replay.errors import ReplayError
from sim.replay.gc_policy import replay_gc
from sim.replay.intake import ARRIVAL_EPS_S
from sim.replay.metrics import as_frame, finalize_requests, summarize
from sim.replay.step_runner import Wait
from workloads.trace_format import TraceRequest

if TYPE_CHECKING:  # pandas is imported by the result's pandas path only (sim.cluster.fleet_tables)
    import pandas as pd


@dataclass(frozen=True)
class Fault:
    """Replica ``replica`` is down from ``down_at`` until ``up_at`` (None: for good)."""

    replica: int
    down_at: float
    up_at: float | None = None


@dataclass
class ClusterResult(ReplayResult):
    """Tables and totals of one cluster replay (the fleet's), each replica's own, and the KV events
    (when recorded) with the replica of each in ``event_replicas``."""

    replicas: list[ReplayResult] = field(default_factory=list)
    event_replicas: list[int] = field(default_factory=list)
    compared: list[tuple[str, ReplayResult]] = field(default_factory=list)  # cluster.compare's replays, by router


class ClusterReplay(ClusterHooks, ClusterView):
    """Replays a request stream through a router and N replicas (see the module docstring)."""

    def __init__(
        self,
        specs: Sequence[ReplicaSpec],
        router: Router,
        requests: Iterable[TraceRequest],
        *,
        kv_delay: DelaySampler = lambda: 0.0,
        metrics_interval_s: float = 0.05,
        faults: Sequence[Fault] = (),
        ttft_slo_s: float = 2.0,
        router_info: dict[str, Any] | None = None,
        integrity_check: bool = False,
        max_window_steps: int = 1 << 16,
        record_events: bool = False,
        attribution: str = "off",
        kv_store: KVStore | None = None,  # the fleet's shared store (sim.cluster.kv_store): its summary keys
        release_engines: bool = False,  # drop each replica's engine once the clock stops (Replica.release)
    ) -> None:
        self.kv_store, self.release_engines = kv_store, release_engines
        if not specs:
            raise ValueError("a cluster needs at least one replica")
        if attribution not in ("off", "summary", "full"):
            raise ValueError(f"attribution must be off, summary or full, got {attribution!r}")
        # miss attribution (sim.cluster.fleet_attribution): an observer on every incarnation's pool
        self.attributions = None if attribution == "off" else FleetAttributions(
            [s.facts for s in specs], full=attribution == "full", store=kv_store is not None)
        if self.attributions is not None:
            specs = [replace(s, build_scheduler=self.attributions.wrap(i, s.build_scheduler))
                     for i, s in enumerate(specs)]
        self.integrity_check = integrity_check
        self.clock = SimClock()
        self.router = router
        self.num_replicas = len(specs)
        self.facts = [s.facts for s in specs]
        self.metrics_interval_s = metrics_interval_s
        self.faults = sorted(faults, key=lambda f: f.down_at)
        self.ttft_slo_s = ttft_slo_s
        self.router_info = router_info or {"kind": router.name}
        self._stream = ArrivalStream(requests)
        self._index = 0
        self._pending_downs = len(self.faults)
        self._next_down = self.faults[0].down_at if self.faults else math.inf
        self.done = False
        self.next_time = -math.inf  # unknown until the stream is first read
        self.pipeline: KVEventPipeline | None = None
        if router.needs_kv_events or record_events:
            self.pipeline = KVEventPipeline(self.num_replicas, kv_delay, self._deliver_events, record_events,
                                            raw=router.raw_kv_events)
        self.replicas = [
            Replica(i, s, self.clock, self, integrity_check=integrity_check, max_window_steps=max_window_steps,
                    event_sink=self._sink_for(i))
            for i, s in enumerate(specs)
        ]
        self._metrics: list[deque[ReplicaMetrics]] = [deque([ReplicaMetrics()]) for _ in specs]
        self._keep_metrics = router.needs_metrics
        self._outstanding: list[dict[str, RouterRequest]] = [{} for _ in specs]
        self._where: dict[str, int] = {}
        self._believed: dict[str, int | None] = {}
        self._reroutes: dict[str, int] = {}
        self._trace: dict[str, tuple[int, float]] = {}  # request -> (stream index, original arrival)
        self._fault_log: list[tuple[int, float, float | None, int]] = []
        self._finished = 0
        self._idle_tables: dict[tuple[float, int], ReplicaTables] = {}  # (sim.cluster.fleet_tables)
        router.attach(self)

    def _sink_for(self, i: int) -> Any:
        if self.pipeline is None:
            return None
        pipeline = self.pipeline
        return lambda sched: pipeline.sink(i, sched)

    def _deliver_events(self, replica: int, batch: list[Any]) -> None:
        if self.router.needs_kv_events:
            self.router.on_kv_events(replica, batch)

    # -- ClusterView ---------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.clock.now

    def up(self) -> list[int]:
        return [r.index for r in self.replicas if r.is_up]

    def metrics(self, replica: int) -> ReplicaMetrics:
        hist = self._metrics[replica]
        dt = self.metrics_interval_s
        now = self.clock.now
        seen = math.floor(now / dt + 1e-9) * dt if dt > 0 else now
        while len(hist) > 1 and hist[1].time <= seen:
            hist.popleft()
        return hist[0]

    def engine(self, replica: int) -> Scheduler:
        return self.replicas[replica].scheduler

    def pending_tokens(self, replica: int) -> int:
        return sum(r.num_prompt_tokens for r in self.replicas[replica].intake.pending)

    # -- ClusterHooks (called by the replicas) ---------------------------------------------------
    def route_due(self, t: float) -> None:
        if self.next_time > t + ARRIVAL_EPS_S:
            return  # nothing due (the common case: a step inside a replica's window)
        while (tr := self._peek()) is not None and tr.arrival <= t + ARRIVAL_EPS_S:
            self._stream.pop()
            rr = RouterRequest(tr, self._index)
            self._trace[tr.id] = (self._index, tr.arrival)
            self._index += 1
            self._route(rr, tr)

    def first_token(self, replica: int, request_id: str) -> None:
        self.router.on_first_token(request_id, replica)

    def finished(self, replica: int, request_id: str) -> None:
        del self._outstanding[replica][request_id]
        self._finished += 1
        self.router.on_finish(request_id, replica)

    def step_end(self, replica: int, row: tuple[Any, ...]) -> None:
        if self._keep_metrics:
            self._metrics[replica].append(row_metrics(row))
        if self.pipeline is not None:
            self.pipeline.publish(replica, row[0], row[1] + row[2])

    def step_ends(self, replica: int, columns: tuple[Sequence[Any], ...], ends: Sequence[float] | None = None) -> None:
        # a window's rows in bulk: the metrics history and the KV-event batches are separate
        # structures, so filling one for every row and then the other is step_end row by row
        if ends is None:  # (else the window's own: ClusterHooks.step_ends)
            ends = step_end_times(columns)
        if self._keep_metrics:
            self._metrics[replica].extend(window_metrics(columns, ends))
        if self.pipeline is not None:
            self.pipeline.publish_rows(replica, columns[0], ends)

    # -- the dispatcher ------------------------------------------------------------------------
    def _peek(self) -> TraceRequest | None:
        tr = self._stream.peek()
        self.next_time = min(self._stream.next_arrival, self._next_down)
        return tr

    def _route(self, rr: RouterRequest, tr: TraceRequest) -> None:
        if self.pipeline is not None:
            self.pipeline.deliver_until(self.clock.now)
        up = self.up()
        if not up:
            raise ReplayError(f"request {rr.request_id}: no replica is up at t={self.clock.now:.6f}s")
        decision = self.router.route(rr)
        if decision.replica not in up:
            raise ReplayError(f"router {self.router.name} chose replica {decision.replica}, which is not up")
        self._believed[rr.request_id] = decision.believed_hit_tokens
        self._outstanding[decision.replica][rr.request_id] = rr
        self._where[rr.request_id] = decision.replica
        replica = self.replicas[decision.replica]
        if replica.intake.push(tr, rr):  # (rr: the prompt keys the router made, RoutedIntake.push)
            if self.attributions is not None:  # where else its prefix was resident, read now
                self.attributions.routed(decision.replica, replica.intake.pending[-1], up)
            replica.wake()
        else:  # refused at intake, as vLLM refuses it: the router sees the error reply at once
            self.finished(decision.replica, rr.request_id)

    def _arrivals(self) -> Iterator[Wait]:
        clock = self.clock
        while (tr := self._peek()) is not None:
            if tr.arrival > clock.now + ARRIVAL_EPS_S:
                yield tr.arrival - clock.now
            self.route_due(clock.now)
        self._check_done()

    def _fault_events(self) -> Iterator[Wait]:
        clock = self.clock
        events = [(f.down_at, 0, f) for f in self.faults]
        events += [(f.up_at, 1, f) for f in self.faults if f.up_at is not None]
        events.sort(key=lambda e: (e[0], e[1]))
        for t, kind, f in events:
            if t > clock.now:
                yield t - clock.now
            if kind == 0:
                self._down(f)
            else:
                self._up(f)

    def _down(self, f: Fault) -> None:
        i = f.replica
        held = list(self._outstanding[i].values())
        self.replicas[i].stop([rr.request_id for rr in held])
        self._outstanding[i] = {}
        if self.pipeline is not None:
            self.pipeline.drop(i)
        self._metrics[i] = deque([ReplicaMetrics(self.clock.now)])
        self.router.on_replica_down(i)
        self._pending_downs -= 1
        downs = [g.down_at for g in self.faults if g.down_at > self.clock.now]
        self._next_down = min(downs) if downs else math.inf
        self._fault_log.append((i, f.down_at, f.up_at, len(held)))
        now = self.clock.now
        for rr in held:
            self._reroutes[rr.request_id] = self._reroutes.get(rr.request_id, 0) + 1
            self._route(rr, replace(rr.trace, arrival=now))
        self._peek()
        self._check_done()

    def _up(self, f: Fault) -> None:
        self.replicas[f.replica].start()
        self.router.on_replica_up(f.replica)

    def _check_done(self) -> None:
        if self._stream.done and self._pending_downs == 0 and not self.done:
            self.done = True
            for r in self.replicas:
                r.wake()

    # -- run -----------------------------------------------------------------------------------
    def run(self) -> ClusterResult:
        t0 = time.perf_counter()
        clock = self.clock
        clock.start(self._arrivals())
        for r in self.replicas:
            r.start()
        if self.faults:
            clock.start(self._fault_events())
        with replay_gc():  # fewer, smaller GC passes, as the single engine's (sim.replay.gc_policy)
            clock.run()
        left = sum(len(o) for o in self._outstanding)
        if left or self._finished != len(self._trace):
            raise ReplayError(f"cluster replay ended with {left} unfinished requests")
        for r in self.replicas if self.release_engines else ():  # before the tables are built: the
            r.release(self.pipeline)  # pools would otherwise stay alive beside them (the peak RSS of large fleets)
        return self._result(time.perf_counter() - t0)

    def _replica_tables(self, r: Replica) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
        """Replica ``r``'s request and step frames and its summary (a fresh copy each)."""
        t = replica_tables(r.rec, r.end_time, r.total_evictions, self._idle_tables)
        return as_frame(t.requests), as_frame(t.steps), t.summary

    def _result(self, wall: float) -> ClusterResult:
        if type(self) is ClusterReplay and (fast := table_result(self, wall, ClusterResult)) is not None:
            return fast  # the common case from Tables, without pandas (its oracle: the path below)
        import pandas as pd

        from sim.cluster.cluster_summary import cluster_block
        per: list[ReplayResult] = []
        req_frames: list[pd.DataFrame] = []
        step_frames: list[pd.DataFrame] = []
        tiers = [replica_tier_summary(r.tier_parts) for r in self.replicas]  # {} without a CPU tier
        if any(tiers):  # a mixed fleet: an untiered replica's requests loaded nothing (0, "", 0)
            for r, tier in zip(self.replicas, tiers, strict=True):
                if not tier:
                    r.rec.enable_tier()
        records, block_frames = [], []
        for r, tier in zip(self.replicas, tiers, strict=True):
            rq, st, s = self._replica_tables(r)
            s.update(tier)
            blocks = None
            if self.attributions is not None:
                rq, blocks, rec = self.attributions.replica_tables(r.index, rq)
                s.update(rec.summary())
                records.append(rec)
                if blocks is not None:
                    block_frames.append(blocks.assign(replica=r.index))
            per.append(ReplayResult(rq, st, r.rec.stats, s, wall, blocks=blocks))
            if len(rq) or not req_frames:  # (pandas leaves empty frames out of a concat's dtypes too)
                req_frames.append(rq.assign(replica=r.index))
            if len(st) or not step_frames:
                step_frames.append(st.assign(replica=r.index))
        requests = pd.concat(req_frames, ignore_index=True)
        steps = pd.concat(step_frames, ignore_index=True)
        ids = requests["request_id"]
        requests["reroutes"] = ids.map(lambda x: self._reroutes.get(x, 0)).astype("int64")
        requests["believed_hit_tokens"] = ids.map(
            lambda x: self._believed.get(x) if self._believed.get(x) is not None else math.nan).astype("float64")
        if self._reroutes:  # TTFT and E2E from the user's arrival, not the re-route
            requests["replica_arrival"] = requests["arrival"]
            requests["arrival"] = ids.map(lambda x: self._trace[x][1]).astype("float64")
            requests = as_frame(finalize_requests(requests))
        order = ids.map(lambda x: self._trace[x][0]).to_numpy().argsort(kind="stable")
        requests = requests.iloc[order].reset_index(drop=True)
        stats = PrefixCacheStats()
        for r in self.replicas:
            stats.add(r.rec.stats)
        sim_time = max(r.end_time for r in self.replicas)
        base_cols = [c for c in requests.columns if c not in ("replica", "reroutes", "believed_hit_tokens")]
        summary = summarize(requests[base_cols], steps, stats, sim_time_s=sim_time,
                            num_evictions=sum(r.total_evictions for r in self.replicas))
        summary.update(fleet_tier_summary(tiers))
        if self.attributions is not None:
            summary.update(FleetAttributions.fleet_summary(records))
            if self.integrity_check:
                check_attribution(requests)
        span = float(requests["finish"].max() - requests["arrival"].min()) if len(requests) else 0.0
        kv = {"batches": self.pipeline.num_batches, "events": self.pipeline.num_events} if self.pipeline else {}
        summary["cluster"] = cluster_block(
            requests, steps, [r.rec.stats for r in self.replicas], router=self.router_info,
            ttft_slo_s=self.ttft_slo_s, span_s=span, faults=self._fault_log, kv_events=kv,
        )
        for row, tier in zip(summary["cluster"]["replicas"], tiers, strict=True):
            row.update(tier_row(tier))
        recorded = self.pipeline.recorded if self.pipeline is not None and self.pipeline.recorded else []
        blocks = pd.concat(block_frames, ignore_index=True) if block_frames else None
        result = ClusterResult(requests, steps, stats, summary, wall, events=[(s, e) for _, s, e in recorded],
                               blocks=blocks, replicas=per, event_replicas=[r for r, _, _ in recorded])
        if self.kv_store is not None:
            from sim.cluster.kv_store_summary import apply_store
            apply_store(result, per, self.kv_store)
        return result
