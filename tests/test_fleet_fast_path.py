"""The fleet's fast paths against their step-by-step oracles (issue 38 item 2).

* the fleet replay with ``replay.fast_forward`` (decode windows, rows and KV-event batches in bulk)
  equals the plain step loop on tables, every KV event (replica, step and content) and every routing
  decision (replica and believed hit) for the routers that read KV events;
* the KV-event pipeline's collector (a bisection over step tags, a window's batches found from the
  tags) equals a queue taken event by event, the plain pipeline it replaced, on random sinks,
  publishes, windows, faults and delays;
* the compiled index's batch dispatch (``CompiledKVEventIndex.apply``) leaves the index as the
  Python dispatch of each event does, CPU-medium events, cache resets and its own stops included.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster import kv_event_pipeline
from sim.cluster.kv_event_pipeline import KVEventPipeline
from sim.cluster.kv_view import EventCacheView
from sim.cluster.prefix_index import KVEventIndex, make_kv_event_index
from sim.cluster.router import ReplicaFacts
from sim.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from sim.experiment.config import load_config
from sim.experiment.run import replay_experiment
from sim.timing.latency import FixedLatency

ROOT = Path(__file__).resolve().parents[1]


def _fleet(router: str, fast_forward: bool, *extra: str) -> Any:
    overrides = ["workload.limit=120", "cluster.replicas=4", f"cluster.router={router}",
                 "replay.record_events=true", f"replay.fast_forward={str(fast_forward).lower()}", *extra]
    result, _ = replay_experiment(load_config(ROOT / "configs/mooncake_sample.yaml", overrides), progress=False)
    return result


@pytest.mark.parametrize("router", ["dynamo", "llm_d", "sglang"])
def test_fleet_fast_path_equals_step_by_step_on_tables_events_and_decisions(router: str) -> None:
    fast, plain = _fleet(router, True), _fleet(router, False)
    decisions = ["request_id", "replica", "believed_hit_tokens"]
    pd.testing.assert_frame_equal(fast.requests[decisions], plain.requests[decisions])
    pd.testing.assert_frame_equal(fast.requests, plain.requests)
    pd.testing.assert_frame_equal(fast.steps, plain.steps)
    assert fast.summary == plain.summary
    # each replica's events, step and content, in its order (a window plays its steps' block
    # operations at its start, so the interleaving of replicas in the recording may differ)
    assert _per_replica(fast) == _per_replica(plain)
    assert len(fast.events) > 100 and fast.summary["cluster"]["kv_events"]["batches"] > 10


def test_fleet_fast_path_equals_step_by_step_with_random_event_delays() -> None:
    delay = "cluster.kv_events.delay_s={dist: exponential, mean_s: 0.02}"
    fast, plain = _fleet("llm_d", True, delay), _fleet("llm_d", False, delay)
    pd.testing.assert_frame_equal(fast.requests, plain.requests)
    assert _per_replica(fast) == _per_replica(plain) and fast.summary == plain.summary


def _per_replica(result: Any) -> list[list[tuple[int, Any]]]:
    out: list[list[tuple[int, Any]]] = [[] for _ in result.replicas]
    for replica, event in zip(result.event_replicas, result.events, strict=True):
        out[replica].append(event)
    return out


class _QueuePipeline:
    """The plain pipeline: a queue of (step, event) per replica, taken from the front event by event."""

    def __init__(self, n: int, delay: Any) -> None:
        self.delay = delay
        self.collected: list[deque[tuple[int, Any]]] = [deque() for _ in range(n)]
        self.last_due = [0.0] * n
        self.epoch = [0] * n
        self.heap: list[tuple[float, int, int, int, list[Any]]] = []
        self.seq = 0
        self.got: list[tuple[int, list[Any]]] = []

    def publish(self, replica: int, step: int, end: float) -> None:
        c = self.collected[replica]
        if not c or c[0][0] > step:
            return
        batch = []
        while c and c[0][0] <= step:
            batch.append(c.popleft()[1])
        due = max(end + self.delay(), self.last_due[replica])
        self.last_due[replica] = due
        self.seq += 1
        heapq.heappush(self.heap, (due, self.seq, replica, self.epoch[replica], batch))

    def deliver_until(self, now: float) -> None:
        while self.heap and self.heap[0][0] <= now:
            _, _, replica, epoch, batch = heapq.heappop(self.heap)
            if epoch == self.epoch[replica]:
                self.got.append((replica, batch))

    def drop(self, replica: int) -> None:
        self.collected[replica].clear()
        self.epoch[replica] += 1


class _Sched:
    def __init__(self, tier: object | None) -> None:
        self.step_index = 0
        self.tier = tier


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), tiered=st.booleans(), ops=st.integers(20, 200))
def test_pipeline_collector_equals_the_queue(seed: int, tiered: bool, ops: int) -> None:
    rng = random.Random(seed)
    d1, d2 = random.Random(seed), random.Random(seed)  # one delay stream each, drawn in the same order
    got: list[tuple[int, list[Any]]] = []
    fast = KVEventPipeline(2, lambda: d1.uniform(0.0, 0.3), lambda r, b: got.append((r, b)))
    plain = _QueuePipeline(2, lambda: d2.uniform(0.0, 0.3))
    scheds = [_Sched(object() if tiered and r == 1 else None) for r in range(2)]
    sinks = [fast.sink(r, scheds[r]) for r in range(2)]
    now = 0.0
    serial = 0
    for _ in range(ops):
        r = rng.randrange(2)
        s = scheds[r]
        op = rng.random()
        if op < 0.5:  # events of the current step (a tiered engine also tags some one step back)
            for _ in range(rng.randrange(1, 4)):
                back = 1 if s.tier is not None and s.step_index and rng.random() < 0.3 else 0
                s.step_index -= back
                serial += 1
                ev = BlockRemoved([serial])
                sinks[r](ev)
                plain.collected[r].append((s.step_index, ev))
                s.step_index += back
            if rng.random() < 0.5:
                s.step_index += 1
        elif op < 0.7:  # a plain step's row
            now += rng.uniform(0.0, 0.1)
            fast.publish(r, s.step_index, now)
            plain.publish(r, s.step_index, now)
            s.step_index += 1
        elif op < 0.85:  # a window's rows: consecutive steps, or (as a caller may) any steps
            k = rng.randrange(1, 6)
            first = s.step_index - rng.randrange(0, 3)
            steps = list(range(first, first + k))
            if rng.random() < 0.2:
                steps = sorted(rng.sample(range(first, first + 9), k))
            ends = [now + 0.01 * (j + 1) for j in range(k)]
            now = ends[-1]
            fast.publish_rows(r, steps, ends)
            for step, end in zip(steps, ends, strict=True):
                plain.publish(r, step, end)
            s.step_index = max(s.step_index, steps[-1] + 1)
        elif op < 0.95:
            now += rng.uniform(0.0, 0.2)
            fast.deliver_until(now)
            plain.deliver_until(now)
        else:  # a fault: the replica's engine starts again from step 0
            fast.drop(r)
            plain.drop(r)
            s.step_index = 0
        assert got == plain.got
    fast.deliver_until(float("inf"))
    plain.deliver_until(float("inf"))
    assert got == plain.got


@pytest.mark.skipif(kv_event_pipeline._StepTagger is None, reason="sim.cluster.compiled_index is not built")
def test_the_compiled_sink_collects_what_the_closure_does(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    script = [(rng.randrange(3), BlockRemoved([rng.randrange(1 << 64)])) for _ in range(300)]

    def collect() -> tuple[list[int], list[Any]]:
        pipeline = KVEventPipeline(1, lambda: 0.0, lambda r, b: None)
        sched = _Sched(None)
        sink = pipeline.sink(0, sched)
        for advance, ev in script:
            sched.step_index += advance
            sink(ev)
        c = pipeline._collected[0]
        return c.steps, c.events

    compiled = collect()
    monkeypatch.setattr(kv_event_pipeline, "_StepTagger", None)
    assert collect() == compiled


def _facts(n: int) -> list[ReplicaFacts]:
    return [ReplicaFacts(16, 1000, 2048, "fast", 0, FixedLatency(0.01))] * n


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_compiled_batch_dispatch_equals_event_by_event(seed: int) -> None:
    rng = random.Random(seed)
    compiled = EventCacheView(_facts(3))
    if not hasattr(compiled.index, "apply"):
        pytest.skip("the compiled KV-event index is not built")
    plain = EventCacheView(_facts(3))
    plain.index = make_kv_event_index(3, compiled=False)
    plain._apply = None
    assert isinstance(plain.index, KVEventIndex)
    for _ in range(30):
        replica = rng.randrange(3)
        batch: list[Any] = []
        for _ in range(rng.randrange(0, 12)):
            hs = [rng.randrange(40) for _ in range(rng.randrange(1, 5))]
            medium = rng.choice(["GPU", "GPU", None, "CPU"])
            kind = rng.random()
            if kind < 0.45:
                batch.append(BlockStored(hs, None, [], 16, None, medium=medium))
            elif kind < 0.9:
                batch.append(BlockRemoved(hs, medium=medium))
            elif kind < 0.95:
                batch.append(AllBlocksCleared())
            else:
                batch.append(BlockRemoved(tuple(hs)))  # a non-list of hashes
        compiled.on_events(replica, batch)
        plain.on_events(replica, batch)
        for r in range(3):
            assert compiled.index.num_entries(r) == plain.index.num_entries(r)
        probe = list(range(40))
        assert compiled.index.match(probe, range(3)) == plain.index.match(probe, range(3))


def test_a_windows_step_ends_are_its_rows_start_plus_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode window hands the cluster its rows' ends (its next steps' starts) instead of the
    cluster adding start + duration per row: the same floats, row for row (the oracle is
    ``step_end_times``, what the cluster computes when no ends come)."""
    from sim.cluster.cluster import ClusterReplay
    from sim.cluster.replica import step_end_times

    seen = []
    step_ends = ClusterReplay.step_ends

    def spy(self: Any, replica: int, columns: Any, ends: Any = None) -> None:
        seen.append(ends is not None and [e.hex() for e in ends] == [e.hex() for e in step_end_times(columns)])
        step_ends(self, replica, columns, ends)

    monkeypatch.setattr(ClusterReplay, "step_ends", spy)
    _fleet("dynamo", True)
    assert len(seen) > 10 and all(seen)
