"""Dynamo's logit per worker (``ActiveCounts.logits``, ``sim.cluster.active_blocks``): the formula on a
hand-computed table, the compiled twin's floats equal to the Python oracle's bit for bit on random
states and prompts (repeated hashes, ``array('Q')`` prompts, CPU-tier credit, 64 workers), and a
Dynamo fleet routing the same with either (one hasher, a mixed fleet, a softmax temperature)."""

from __future__ import annotations

import random
from array import array
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster import dynamo_router
from sim.cluster.active_blocks import ActiveBlocks, ActiveCounts
from sim.experiment.config import load_config
from sim.experiment.run import replay_experiment

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("isl, prefill, overlap, host, held, active, want", [
    # raw prefill blocks (prefill + isl) / bs, less the credit, floored at 0; + active + new blocks
    (64, 0, 0, 0, 0, 0, 4 + 0 + 4),
    (64, 32, 0, 0, 0, 10, 6 + 10 + 4),
    (64, 0, 3, 0, 3, 5, 1 + 5 + 1),
    (70, 0, 4, 0, 4, 4, 0.375 + 4 + 1),   # 70 / 16 = 4.375 blocks; the partial fifth block is new
    (64, 0, 6, 0, 0, 0, 0 + 0 + 4),       # a credit beyond the prompt's blocks floors at 0
    (64, 0, 1, 2, 1, 1, 4 - 1 - 0.75 * 2 + 1 + 3),  # CPU-tier blocks earn host_weight each
])
def test_logit_formula_on_a_table(isl: int, prefill: int, overlap: int, host: int, held: int, active: int,
                                  want: float) -> None:
    hashes = list(range(100, 100 + isl // 16))
    for blocks in (ActiveBlocks(2), dynamo_router.make_active_blocks(2)):
        blocks.acquire(1, list(range(1000, 1000 + active - held)) + hashes[:held])
        got = blocks.logits(hashes, [0, 1], {1: overlap}, [0, prefill], isl, 16, 1.0, 1.0,
                            {1: host} if host else {}, 0.75)
        assert got == [(isl + 15) // 16 * 1.0 + isl / 16, want]


compiled_active = pytest.importorskip("sim.cluster.compiled_active", reason="compiled active blocks not built")


def _state(rng: random.Random, workers: int, pool: list[int], blocks: list[ActiveCounts]) -> None:
    active: list[tuple[int, list[int]]] = []
    for _ in range(rng.randrange(0, 60)):
        if rng.random() < 0.7 or not active:
            w = rng.randrange(workers)
            hashes = pool[: rng.randrange(0, 10)] + [rng.choice(pool) for _ in range(rng.randrange(0, 8))]
            active.append((w, hashes))
            for b in blocks:
                b.acquire(w, hashes)
        else:
            w, hashes = active.pop(rng.randrange(len(active)))
            for b in blocks:
                b.release(w, hashes)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), workers=st.sampled_from([1, 3, 16, 31, 32, 63, 64]))
def test_compiled_logits_are_the_python_floats(seed: int, workers: int) -> None:
    rng = random.Random(seed)
    oracle = ActiveBlocks(workers)
    native = compiled_active.CompiledActiveBlocks(workers, initial_slots=8)
    pool = [rng.randrange(2**64) for _ in range(40)]
    _state(rng, workers, pool, [oracle, native])
    for _ in range(5):
        prompt = [rng.choice(pool) if rng.random() < 0.6 else rng.randrange(2**64) for _ in range(rng.randrange(25))]
        members = sorted(rng.sample(range(workers), rng.randrange(1, workers + 1)))
        overlaps = {w: rng.randrange(0, 30) for w in members if rng.random() < 0.5}
        host = rng.choice([None, {}, {w: rng.randrange(1, 9) for w in members if rng.random() < 0.5}])
        args = (members, overlaps, [rng.randrange(0, 5000) for _ in range(workers)], rng.randrange(0, 600),
                rng.choice([1, 16, 32, 48]), rng.choice([1.0, 0.5, 1.7]), rng.choice([1.0, 0.3, 2.0]), host,
                rng.choice([0.75, 0.0, 1.3]))
        want = [x.hex() for x in oracle.logits(prompt, *args)]
        assert [x.hex() for x in native.logits(prompt, *args)] == want
        assert [x.hex() for x in native.logits(array("Q", prompt), *args)] == want
        assert [x.hex() for x in native.logits(native.words(prompt), *args)] == want
        assert native.words(prompt) == array("Q", prompt) and oracle.words(prompt) is prompt
        # a repeated hash counts once, as in a set; the table is left as it was (no mark stays)
        assert native.overlaps(prompt) == native.overlaps(set(prompt)) == oracle.overlaps(set(prompt))
        assert native.overlaps(array("Q", prompt)) == oracle.overlaps(set(prompt))
    assert [native.num_active(w) for w in range(workers)] == [oracle.num_active(w) for w in range(workers)]


def test_compiled_logits_refuse_what_they_cannot_compute() -> None:
    native = compiled_active.CompiledActiveBlocks(2)
    with pytest.raises(IndexError):
        native.logits([1], [0, 2], {}, [0, 0], 16, 16, 1.0, 1.0)
    with pytest.raises(ValueError, match="block size 0"):
        native.logits([1], [0], {}, [0, 0], 16, 0, 1.0, 1.0)
    with pytest.raises(TypeError, match="array\\('Q'\\)"):
        native.logits(array("q", [1]), [0], {}, [0, 0], 16, 16, 1.0, 1.0)
    native.acquire(1, array("Q", [7, 8]))
    native.release(1, [7, 8])  # an array's words and a list's ints are the same hashes
    assert native.num_active(1) == 0


def _fleet(router: str, python_blocks: bool, monkeypatch: pytest.MonkeyPatch, *extra: str) -> Any:
    with monkeypatch.context() as m:
        if python_blocks:
            m.setattr(dynamo_router, "make_active_blocks", ActiveBlocks)
        overrides = ["workload.limit=150", f"cluster.router={router}", *extra]
        result, _ = replay_experiment(load_config(ROOT / "configs/mooncake_sample.yaml", overrides), progress=False)
    return result


@pytest.mark.parametrize("router, extra", [
    ("dynamo", ("cluster.replicas=4",)),
    ("{kind: dynamo, temperature: 0.5}", ("cluster.replicas=4",)),
    ("dynamo", ("cluster.replicas=[{count: 2}, {count: 2, engine: {block_size: 32}}]",)),
])
def test_dynamo_fleet_routes_alike_with_the_compiled_logits(router: str, extra: tuple[str, ...],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    fast, plain = _fleet(router, False, monkeypatch, *extra), _fleet(router, True, monkeypatch, *extra)
    decisions = ["request_id", "replica", "believed_hit_tokens"]
    pd.testing.assert_frame_equal(fast.requests[decisions], plain.requests[decisions])
    pd.testing.assert_frame_equal(fast.requests, plain.requests)
    assert fast.summary == plain.summary
    assert fast.requests["replica"].nunique() > 1
