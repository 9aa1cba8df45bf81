"""Dynamo's active blocks per worker (``sim.cluster.active_blocks``): the one-pass overlap of a
prompt against every worker equals the per-worker set intersection it replaced, and the counts
follow acquire, release and clear, on random request streams."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.active_blocks import ActiveBlocks, make_active_blocks


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), workers=st.sampled_from([1, 3, 70]), holders=st.sampled_from([None, True,
                                                                                                   False]))
def test_overlaps_equal_the_per_worker_intersection(seed: int, workers: int, holders: bool | None) -> None:
    rng = random.Random(seed)
    blocks = ActiveBlocks(workers, holders)
    assert blocks.keep_holders == (workers > 32 if holders is None else holders)
    oracle: list[dict[int, int]] = [{} for _ in range(workers)]
    active: list[tuple[int, list[int]]] = []
    for _ in range(60):
        op = rng.random()
        if op < 0.5:  # route a request: its prompt's hashes (a shared prefix, then its own)
            w = rng.randrange(workers)
            hashes = list(range(rng.randrange(0, 6))) + [rng.randrange(6, 40) for _ in range(rng.randrange(0, 5))]
            blocks.acquire(w, hashes)
            for h in hashes:
                oracle[w][h] = oracle[w].get(h, 0) + 1
            active.append((w, hashes))
        elif op < 0.85 and active:  # a response ends
            w, hashes = active.pop(rng.randrange(len(active)))
            blocks.release(w, hashes)
            for h in hashes:
                oracle[w][h] -= 1
                if not oracle[w][h]:
                    del oracle[w][h]
        elif op >= 0.85:  # a worker leaves the pool: its requests are gone
            w = rng.randrange(workers)
            blocks.clear(w)
            oracle[w].clear()
            active = [(x, hs) for x, hs in active if x != w]
        probe = {rng.randrange(40) for _ in range(rng.randrange(0, 12))}
        got = blocks.overlaps(probe)
        for w in range(workers):
            assert got.get(w, 0) == len(oracle[w].keys() & probe)
            assert blocks.num_active(w) == len(oracle[w])
            assert blocks.refs[w] == oracle[w]
        assert 0 not in got.values()
        assert all(blocks.holders.values())
        if not blocks.keep_holders:
            assert not blocks.holders


compiled_active = pytest.importorskip("sim.cluster.compiled_active", reason="compiled active blocks not built")


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), workers=st.sampled_from([1, 3, 16, 31, 32, 40, 64]))
def test_compiled_twin_answers_as_the_python_class(seed: int, workers: int) -> None:
    """Call for call on random streams (small tables: probing, tombstones and rebuilds happen),
    hashes spread over the whole 64-bit range as vLLM's event form is."""
    rng = random.Random(seed)
    oracle = ActiveBlocks(workers)
    native = compiled_active.CompiledActiveBlocks(workers, initial_slots=8)
    pool = [rng.randrange(2**64) for _ in range(48)]
    active: list[tuple[int, list[int]]] = []
    for _ in range(120):
        op = rng.random()
        if op < 0.5:
            w = rng.randrange(workers)
            hashes = pool[: rng.randrange(0, 8)] + [rng.choice(pool) for _ in range(rng.randrange(0, 6))]
            oracle.acquire(w, hashes)
            native.acquire(w, iter(hashes) if op < 0.1 else hashes)
            active.append((w, hashes))
        elif op < 0.9 and active:
            w, hashes = active.pop(rng.randrange(len(active)))
            oracle.release(w, hashes)
            native.release(w, hashes)
        elif op >= 0.9:
            w = rng.randrange(workers)
            oracle.clear(w)
            native.clear(w)
            active = [(x, hs) for x, hs in active if x != w]
        probe = {rng.choice(pool) for _ in range(rng.randrange(0, 16))}
        assert native.overlaps(probe) == oracle.overlaps(probe)
        assert [native.num_active(w) for w in range(workers)] == [oracle.num_active(w) for w in range(workers)]


def test_compiled_twin_refuses_what_the_python_class_refuses() -> None:
    native = compiled_active.CompiledActiveBlocks(2)
    native.acquire(0, [5])
    with pytest.raises(KeyError):
        native.release(1, [5])  # never acquired on worker 1
    with pytest.raises(IndexError):
        native.acquire(2, [1])
    with pytest.raises(ValueError, match="0 to 64 workers"):
        compiled_active.CompiledActiveBlocks(65)


def test_make_active_blocks_picks_the_compiled_twin_up_to_64_workers() -> None:
    assert type(make_active_blocks(64)) is compiled_active.CompiledActiveBlocks
    assert type(make_active_blocks(65)) is ActiveBlocks
    assert type(make_active_blocks(16, compiled=False)) is ActiveBlocks
