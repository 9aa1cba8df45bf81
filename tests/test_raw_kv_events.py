"""Raw KV events (issue 38 item 2) against their oracle, the event objects.

* the compiled pool writing into a :class:`~sim.core.compiled_pool.KVEventLog` in C records, on
  random pool operations, the kinds, hashes and step tags of the objects the same pool emits --
  and of the Python pool's objects handed to a log (the sink protocol);
* a log's batches (``take``) are the object collector's cuts, event for event;
* the compiled index applying a raw batch (``apply_raw``) ends as applying the objects
  (``apply``), and the view's Python path for raw batches (Python, sharded and tiered indexes)
  ends as the object path;
* a fleet whose routers read raw batches equals the object fleet on tables, routing decisions,
  KV-event counts and every router index's final state, faults included.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import EventLog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compiled_pool import _apply, _op, _state

from sim.cluster import kv_event_pipeline
from sim.cluster.kv_view import EventCacheView
from sim.cluster.prefix_index import KVEventIndex, ShardedKVEventIndex, make_kv_event_index
from sim.cluster.router import ReplicaFacts
from sim.cluster.tier_index import ANY
from sim.core.block_pool import BlockPool
from sim.core.kv_events import MEDIUM_CPU, AllBlocksCleared, BlockRemoved, BlockStored
from sim.core.pool_impl import compiled_pool_class
from sim.experiment.config import load_config
from sim.experiment.run import replay_experiment
from sim.timing.latency import FixedLatency

compiled_pool = pytest.importorskip("sim.core.compiled_pool")
compiled_index = pytest.importorskip("sim.cluster.compiled_index")
KVEventLog, RawEventBatch = compiled_pool.KVEventLog, compiled_pool.RawEventBatch
STORED, REMOVED, CLEARED = compiled_pool.EVENT_STORED, compiled_pool.EVENT_REMOVED, compiled_pool.EVENT_CLEARED
CompiledBlockPool = compiled_pool_class()
ROOT = Path(__file__).resolve().parents[1]


class _Sched:
    step_index = 0


def _kind(event: Any) -> int:
    return STORED if type(event) is BlockStored else REMOVED if type(event) is BlockRemoved else CLEARED


def _runs_of(events: list) -> list[tuple[int, list[int]]]:
    return [(_kind(e), list(getattr(e, "block_hashes", []))) for e in events]


class _Tagged(EventLog):
    """An object sink that also keeps each event's step tag (what the pipeline's collector does)."""

    def __init__(self, sched: _Sched) -> None:
        super().__init__()
        self.sched = sched
        self.steps: list[int] = []

    def __call__(self, event: Any) -> None:
        self.steps.append(self.sched.step_index)
        self.append(event)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(num_blocks=st.integers(2, 14), ops=st.lists(_op, max_size=80), algo=st.sampled_from(["sha256", "fast"]),
       grouped=st.booleans(), observed=st.booleans(), cuts=st.lists(st.integers(0, 40), max_size=8))
def test_compiled_pool_log_records_the_objects_events(num_blocks: int, ops: list, algo: str, grouped: bool,
                                                      observed: bool, cuts: list[int]) -> None:
    sched = _Sched()
    objects = _Tagged(sched)
    raw, from_python = KVEventLog(sched), KVEventLog(sched)
    pools = (CompiledBlockPool(num_blocks, True, objects), CompiledBlockPool(num_blocks, True, raw),
             BlockPool(num_blocks, True, from_python))
    if observed:  # the pool takes its slow eviction path with an observer
        for p in pools:
            p.observer = _Sink()
    holders: tuple[list, list, list] = ([], [], [])
    for i, (op, seed, k) in enumerate(ops):
        sched.step_index = i // 3
        answers = [_apply(p, h, op, seed, k, algo, grouped) for p, h in zip(pools, holders)]
        assert answers[0] == answers[1] == answers[2], (op, seed, k)
        assert _state(pools[0]) == _state(pools[1])
    assert len(raw) == len(from_python) == len(objects)
    assert raw.tags() == from_python.tags() == objects.steps
    for last in [-1, *cuts, 10**9]:  # the distinct tags up to a step, in order (a window's publishing rows)
        assert raw.tags_upto(last) == from_python.tags_upto(last) == sorted({t for t in objects.steps if t <= last})
    # cut at random steps, then everything: the batches are the object events' cuts, in order
    taken: dict[str, list] = {"raw": [], "py": []}
    start = 0
    for step in sorted(cuts) + [10**9]:
        end = start
        while end < len(objects.steps) and objects.steps[end] <= step:
            end += 1
        for name, log in (("raw", raw), ("py", from_python)):
            batch = log.take(step)
            assert (batch is None) == (end == start)
            if batch is not None:
                assert len(batch) == end - start and batch.runs() == _runs_of(objects[start:end])
                taken[name].append(batch.runs())
            assert log.tags_upto(10**9) == list(dict.fromkeys(log.tags()))
        start = end
    assert taken["raw"] == taken["py"] and len(raw) == 0 and raw.front() is None


class _Sink:
    def on_cache(self, *args: object) -> None:
        pass

    def on_evict(self, *args: object) -> None:
        pass


def test_log_front_take_compacts_and_clears_in_order() -> None:
    sched = _Sched()
    log = KVEventLog(sched)
    assert log.front() is None and log.take(5) is None
    for i in range(10_000):
        sched.step_index = i // 2
        log(BlockRemoved([i]) if i % 3 else BlockStored([i, i + 1], None, [], 4, None))
    got: list[tuple[int, int]] = []
    for step in range(0, 5_000, 7):
        assert log.front() == (len(got) and got[-1][1]) or log.front() is not None
        b = log.take(step)
        got.extend((k, h[0]) for k, h in b.runs())
    assert [h for _, h in got] == list(range(len(got)))
    log.clear()
    assert len(log) == 0 and log.take(10**9) is None


def test_log_refuses_events_it_cannot_hold() -> None:
    log = KVEventLog(_Sched())
    with pytest.raises(ValueError, match="GPU events only"):
        log(BlockRemoved([1], medium=MEDIUM_CPU))
    with pytest.raises(TypeError, match="BlockStored, BlockRemoved or AllBlocksCleared"):
        log("not an event")
    index = compiled_index.CompiledKVEventIndex(2)
    bad = RawEventBatch.__new__(RawEventBatch)
    from array import array

    with pytest.raises(ValueError, match="malformed raw KV-event words"):
        index.apply_raw(0, array("Q", [STORED | 5 << 8, 1]))
    with pytest.raises(ValueError, match="malformed raw KV-event words at word 2"):  # checked before any change
        index.apply_raw(0, array("Q", [STORED | 1 << 8, 7, 9 | 1 << 8, 8]))
    assert index.num_entries(0) == 0 and index.match([7], [0]) == {}
    with pytest.raises(TypeError, match="array"):
        index.apply_raw(0, array("q", [1]))
    assert len(bad) == 0


def _random_events(rng: random.Random, n: int) -> list:
    out: list = []
    for _ in range(n):
        r = rng.random()
        hashes = [rng.randrange(40) * 0x9E3779B97F4A7C15 % 2**64 for _ in range(rng.randrange(0, 6))]
        if r < 0.5:
            out.append(BlockStored(hashes, None, [], 4, None))
        elif r < 0.97:
            out.append(BlockRemoved(hashes[:1] or [0]))
        else:
            out.append(AllBlocksCleared())
    return out


def _index_state(index: Any, replicas: int) -> tuple:
    probe = [h * 0x9E3779B97F4A7C15 % 2**64 for h in range(40)]
    return (tuple(index.num_entries(r) for r in range(replicas)),
            tuple(tuple(sorted(index.match([h], range(replicas)).items())) for h in probe))


def _batches(rng: random.Random, replicas: int, n: int) -> list[tuple[int, list]]:
    return [(rng.randrange(replicas), _random_events(rng, rng.randrange(1, 12))) for _ in range(n)]


def _raw(events: list) -> Any:
    log = KVEventLog(_Sched())
    for e in events:
        log(e)
    return log.take(0)


@given(seed=st.integers(0, 2**32 - 1), replicas=st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_raw_batches_leave_every_index_as_the_objects_do(seed: int, replicas: int) -> None:
    batches = _batches(random.Random(seed), replicas, 60)
    facts = [ReplicaFacts(4, 100, 64, "sha256", 0, FixedLatency(0.01)) for _ in range(replicas)]
    for make in (lambda: make_kv_event_index(replicas), lambda: KVEventIndex(replicas),
                 lambda: ShardedKVEventIndex(replicas, lambda n: compiled_index.CompiledKVEventIndex(n, 8))):
        views = [EventCacheView(facts), EventCacheView(facts)]
        for v in views:
            v.index = make()
            v._apply = getattr(v.index, "apply", None)
            v._apply_raw = getattr(v.index, "apply_raw", None)
        for replica, events in batches:
            views[0].on_events(replica, events)
            views[1].on_events(replica, _raw(events))
        assert _index_state(views[0].index, replicas) == _index_state(views[1].index, replicas)


def test_raw_batches_in_a_tiered_view_touch_the_gpu_medium_as_objects_do() -> None:
    # replica 0 has a CPU tier (objects: its GPU and CPU events), replica 1 none (raw batches)
    facts = [ReplicaFacts(4, 100, 64, "sha256", 0, FixedLatency(0.01), cpu_tier=t) for t in (True, False)]
    rng = random.Random(3)
    views = [EventCacheView(facts, ANY), EventCacheView(facts, ANY)]
    assert views[0].tiers is not None and views[0]._apply_raw is None
    for _ in range(80):
        events = _random_events(rng, rng.randrange(1, 10))
        cpu = [BlockStored([rng.randrange(40)], None, [1], 4, None, medium=MEDIUM_CPU)]
        views[0].on_events(0, events + cpu)
        views[1].on_events(0, events + cpu)
        views[0].on_events(1, events)
        views[1].on_events(1, _raw(events))
    assert views[0].tiers.cpu.held == views[1].tiers.cpu.held  # type: ignore[union-attr]
    assert views[0].index.held == views[1].index.held  # type: ignore[attr-defined]


def _fleet(router: str, raw: bool, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[Any, list]:
    """A 4-replica fleet on the sample trace; raw=False: every batch as objects (the oracle)."""
    views: list[EventCacheView] = []
    kinds: list[type] = []
    init, on_events = EventCacheView.__init__, EventCacheView.on_events

    def keep(self: EventCacheView, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        views.append(self)

    def seen(self: EventCacheView, replica: int, events: Any) -> None:
        kinds.append(type(events))
        on_events(self, replica, events)

    with monkeypatch.context() as m:
        m.setattr(EventCacheView, "__init__", keep)
        m.setattr(EventCacheView, "on_events", seen)
        if not raw:
            m.setattr(kv_event_pipeline, "_Log", None)
        overrides = ["workload.limit=150", "cluster.replicas=4", f"cluster.router={router}", *extra]
        result, _ = replay_experiment(load_config(ROOT / "configs/mooncake_sample.yaml", overrides), progress=False)
    assert (RawEventBatch in kinds) == raw and kinds
    return result, [_index_state(v.index, 4) for v in views]


@pytest.mark.parametrize("router,extra", [
    ("dynamo", ()), ("{kind: llm_d, prefix: precise}", ()), ("mooncake", ()),
    ("dynamo", ("cluster.faults=[{replica: 1, down_at: 20.0, up_at: 40.0}]",)),
    ("dynamo", ("cluster.disaggregation={prefill: 2, decode: 2, link_gb_s: 50.0}",)),
])
def test_raw_fleet_equals_the_object_fleet(router: str, extra: tuple[str, ...],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (fast, fast_index), (plain, plain_index) = _fleet(router, True, monkeypatch, *extra), \
        _fleet(router, False, monkeypatch, *extra)
    decisions = ["request_id", "replica", "believed_hit_tokens"]
    pd.testing.assert_frame_equal(fast.requests[decisions], plain.requests[decisions])
    pd.testing.assert_frame_equal(fast.requests, plain.requests)
    pd.testing.assert_frame_equal(fast.steps, plain.steps)
    assert fast.summary == plain.summary and fast.summary["cluster"]["kv_events"]["events"] > 1000
    assert fast_index == plain_index
