"""Offline bounds (sim.experiment.bounds): Belady between the sequential LRU and the infinite cache."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.experiment.bounds import (
    belady_hit_rate,
    block_references,
    infinite_hit_rate,
    lru_hit_rate,
    offline_bounds,
)
from workloads.bounds import infinite_cache_hit_bound
from workloads.trace_format import TraceRequest


def _random_trace(seed: int, n: int, *, salts: bool, outputs: bool) -> list[TraceRequest]:
    """Requests built from a few shared stems (so that prefixes repeat) plus random tails."""
    rng = np.random.default_rng(seed)
    stems = [rng.integers(0, 6, size=int(rng.integers(2, 24))) for _ in range(4)]
    reqs = []
    for i in range(n):
        parts = [stems[int(rng.integers(len(stems)))]]
        if rng.random() < 0.5:
            parts.append(stems[int(rng.integers(len(stems)))])
        parts.append(rng.integers(0, 6, size=int(rng.integers(1, 10))))
        tokens = np.concatenate(parts).astype(np.int64)
        out_n = int(rng.integers(1, 6))
        reqs.append(TraceRequest(
            id=f"r{i}", arrival=float(i), tokens=tokens, output_tokens=out_n,
            output_token_ids=(rng.integers(0, 6, size=out_n).astype(np.int64)
                              if outputs and rng.random() < 0.5 else None),
            salt=(f"s{int(rng.integers(2))}" if salts and rng.random() < 0.5 else None),
            lora=("a" if salts and rng.random() < 0.2 else None),
            prompt_logprobs=bool(rng.random() < 0.1),
        ))
    return reqs


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), bs=st.integers(1, 4), cap=st.integers(0, 40),
       salts=st.booleans(), outputs=st.booleans())
def test_belady_between_lru_and_infinite(seed, n, bs, cap, salts, outputs):
    reqs = _random_trace(seed, n, salts=salts, outputs=outputs)
    refs = block_references(reqs, bs)
    inf, bel, lru = infinite_hit_rate(refs), belady_hit_rate(refs, cap), lru_hit_rate(refs, cap)
    assert lru <= bel + 1e-12
    assert bel <= inf + 1e-12
    assert inf == pytest.approx(infinite_cache_hit_bound(reqs, bs), abs=1e-12)
    # with room for every distinct block nothing is ever evicted
    big = refs.num_distinct_blocks
    assert belady_hit_rate(refs, big) == pytest.approx(inf, abs=1e-12)
    assert lru_hit_rate(refs, big) == pytest.approx(inf, abs=1e-12)
    # monotone in capacity
    assert belady_hit_rate(refs, cap + 3) >= bel - 1e-12


def test_hand_example():
    """A, then B (a different prompt), then A again: with room for one request's blocks LRU has
    evicted A; Belady keeps A (its next use comes first) and bypasses B."""
    a = np.arange(8, dtype=np.int64)
    b = np.arange(100, 108, dtype=np.int64)
    reqs = [TraceRequest(id=str(i), arrival=float(i), tokens=t, output_tokens=1) for i, t in enumerate([a, b, a])]
    refs = block_references(reqs, 4)  # each request: 2 blocks, lookup cap (8 - 1) // 4 = 1 block
    assert refs.num_references == 6 and refs.lookup.tolist() == [1, 1, 1]
    assert infinite_hit_rate(refs) == pytest.approx(4 / 24)
    assert belady_hit_rate(refs, 2) == pytest.approx(4 / 24)
    assert lru_hit_rate(refs, 2) == 0.0
    assert belady_hit_rate(refs, 0) == 0.0
    out = offline_bounds(refs, None)
    assert np.isnan(out["belady_hit_rate"]) and out["infinite_cache_hit_rate"] == pytest.approx(4 / 24)


def test_next_lookup_positions():
    a = np.arange(8, dtype=np.int64)
    reqs = [TraceRequest(id=str(i), arrival=float(i), tokens=a, output_tokens=1) for i in range(3)]
    refs = block_references(reqs, 4)
    # positions: r0 = [0, 1], r1 = [2, 3], r2 = [4, 5]; only block 0 of each request is looked up
    assert refs.next_lookup().tolist() == [2, 6, 4, 6, 6, 6]


def test_large_reference_string_is_fast():
    """The Belady loop is linear-ish: a few hundred thousand references well under a few seconds."""
    import time

    rng = np.random.default_rng(0)
    stems = [rng.integers(0, 1000, size=4096) for _ in range(20)]
    reqs = [TraceRequest(id=str(i), arrival=float(i), tokens=np.concatenate([stems[i % 20][: 1024 + (i * 37) % 3072],
                                                                            rng.integers(0, 1000, 64)]),
                         output_tokens=1) for i in range(400)]
    refs = block_references(reqs, 4)
    t = time.perf_counter()
    belady_hit_rate(refs, refs.num_distinct_blocks // 10)
    assert refs.num_references > 200_000
    assert time.perf_counter() - t < 10


def test_bounds_and_sweep_config_import_neither_simpy_nor_torch():
    import subprocess
    import sys

    code = ("import sys; sys.modules['simpy'] = None; sys.modules['torch'] = None\n"
            "import sim.experiment.bounds, sim.experiment.sweep_config, sim.experiment.sweep_point\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=__import__("pathlib").Path(__file__).parents[1])
