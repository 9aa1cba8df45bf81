"""A window's raw KV-event batches merged (``KVEventPipeline.publish_rows`` on a raw log) against the
batches published one by one (the plain loop's ``publish`` per row, the oracle): at every delivery,
each replica's delivered events (kinds and hashes, in order) are the same, and so are the counts of
batches and events -- with no delay (everything merges), fixed and random delays (some batches due
past the window's end travel alone; a fixed delay known as one, and the same delay drawn row by
row), and windows whose first rows publish older events. As in a fleet, windows are published at
their end, the present, and deliveries never look back."""

from __future__ import annotations

import random

import pytest

from sim.cluster.kv_event_pipeline import KVEventPipeline, delay_sampler
from sim.core.kv_events import BlockRemoved, BlockStored

compiled_pool = pytest.importorskip("sim.core.compiled_pool")
KVEventLog = compiled_pool.KVEventLog


class _Sched:
    step_index = 0


def _pipeline(replicas: int, delay, scheds):
    got: list[tuple[int, list[int]]] = []
    p = KVEventPipeline(replicas, delay, lambda r, b: got.append((r, list(b.words))), raw=True)
    for i in range(replicas):
        p._collected[i] = KVEventLog(scheds[i])  # (a raw log bound to a stand-in scheduler)
    return p, got


def _play(seed: int, delay_spec, merged: bool, opaque: bool = False) -> tuple[list, int, int]:
    rng = random.Random(seed)
    replicas = 3
    scheds = [_Sched() for _ in range(replicas)]
    sampler = delay_sampler(delay_spec, 7)
    if opaque:  # (a sampler the pipeline cannot see is fixed: every row draws, the general loop)
        sampler = (lambda draw: lambda: draw())(sampler)
    p, got = _pipeline(replicas, sampler, scheds)
    now = 0.0  # the shared clock: a window's rows are published at its end, the present
    deliveries = []
    for _ in range(60):
        r = rng.randrange(replicas)
        log, sched = p._collected[r], scheds[r]
        k = rng.randint(1, 12)
        first = sched.step_index
        if rng.random() < 0.3:  # events of the step before the window, not yet published
            sched.step_index = first - 1 if first else 0
            log(BlockStored([rng.getrandbits(64)], None, [], 16, None))
        gaps = [rng.choice([0.001, 0.01, 0.02]) for _ in range(k)]
        end = now + rng.choice([0.0, 0.001, 0.03])  # the window ends now, or later than the last one
        ends = [end - sum(gaps[j + 1:]) for j in range(k)]  # (rows may end before the last window did)
        for j in range(k):
            sched.step_index = first + j
            for _ in range(rng.choice([0, 0, 1, 3])):
                ev = BlockStored if rng.random() < 0.6 else BlockRemoved
                hashes = [rng.getrandbits(64) for _ in range(rng.randint(1, 3))]
                log(BlockStored(hashes, None, [], 16, None) if ev is BlockStored else BlockRemoved(hashes, None))
        sched.step_index = first + k
        steps = range(first, first + k)
        if merged:
            p.publish_rows(r, steps, ends)
        else:  # the oracle: one publish per row whose step reaches the front event
            for step, end in zip(steps, ends, strict=True):
                if log.front() is not None and log.front() <= step:
                    p.publish(r, step, end)
        now = end
        got.clear()
        if rng.random() < 0.7:  # a routing instant now (deliveries are never in the past)
            p.deliver_until(now)
        per: dict[int, list[int]] = {}
        for replica, words in got:
            per.setdefault(replica, []).extend(words)
        deliveries.append(per)
    got.clear()
    p.deliver_until(float("inf"))
    per = {}
    for replica, words in got:
        per.setdefault(replica, []).extend(words)
    deliveries.append(per)
    return deliveries, p.num_batches, p.num_events


@pytest.mark.parametrize("delay", [0.0, 0.004, {"dist": "uniform", "low_s": 0.0, "high_s": 0.03}])
@pytest.mark.parametrize("seed", range(12))
def test_merged_window_batches_deliver_what_the_plain_batches_do(seed: int, delay) -> None:
    merged, plain = _play(seed, delay, True), _play(seed, delay, False)
    assert merged == plain == _play(seed, delay, True, opaque=True)
    assert plain[1] > 10 and plain[2] > plain[1]  # batches and events were made and delivered
