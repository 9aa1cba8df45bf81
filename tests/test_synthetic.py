import numpy as np
import pytest

from workloads.bounds import infinite_cache_hit_bound
from workloads.synthetic import shared_prefix


def test_deterministic():
    a = shared_prefix(50, seed=3)
    b = shared_prefix(50, seed=3)
    c = shared_prefix(50, seed=4)
    assert [r.id for r in a] == [f"syn-{i}" for i in range(50)]
    for x, y in zip(a, b):
        assert x.arrival == y.arrival and np.array_equal(x.tokens, y.tokens)
    assert any(not np.array_equal(x.tokens, y.tokens) for x, y in zip(a, c))


def test_prefixes_shared_and_suffixes_unique():
    reqs = shared_prefix(200, num_prefixes=3, prefix_tokens=64, suffix_tokens=32, vocab_size=1000)
    prefixes = {tuple(r.tokens[:64]) for r in reqs}
    assert len(prefixes) == 3
    by_session = {}
    for r in reqs:
        by_session.setdefault(r.session, set()).add(tuple(r.tokens[:64]))
        assert 16 <= len(r.tokens) - 64 <= 48
        assert r.tokens.dtype == np.int64 and r.tokens.min() >= 0 and r.tokens.max() < 1000
        assert r.output_tokens == 64
    assert all(len(v) == 1 for v in by_session.values())
    assert len({tuple(r.tokens[64:]) for r in reqs}) == 200
    # zipf 1: prefix 0 is the most popular
    counts = {k: sum(r.session == k for r in reqs) for k in by_session}
    assert max(counts, key=counts.get) == "prefix-0"
    # every request after the first of its prefix hits the whole prefix (block 16 divides 64)
    bound = infinite_cache_hit_bound(reqs, 16)
    expected = (200 - 3) * 64 / sum(len(r.tokens) for r in reqs)
    assert abs(bound - expected) < 1e-3


def test_no_jitter_and_uniform():
    reqs = shared_prefix(100, suffix_tokens=10, prefix_tokens=5, jitter=False, zipf=0.0)
    assert {len(r.tokens) for r in reqs} == {15}


def test_poisson_rate():
    reqs = shared_prefix(4000, rate=20.0, prefix_tokens=8, suffix_tokens=8, seed=1)
    arr = np.array([r.arrival for r in reqs])
    assert np.all(np.diff(arr) >= 0) and arr[0] > 0
    rate = len(arr) / arr[-1]
    assert 19.0 < rate < 21.0
    gaps = np.diff(arr)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1  # exponential gaps: CV ~ 1


def test_bound_cap_salt_and_lora():
    from workloads.trace_format import TraceRequest

    toks = np.arange(64, dtype=np.int64)
    same = [TraceRequest(f"r{i}", float(i), toks, 1) for i in range(2)]
    # second request: 64 tokens = 4 full blocks of 16 but vLLM caps hits at (64-1)//16 = 3 blocks
    assert infinite_cache_hit_bound(same, 16) == pytest.approx(3 * 16 / 128)
    # not within a request: one request alone has no hits
    assert infinite_cache_hit_bound([TraceRequest("x", 0.0, np.zeros(64, np.int64), 1)], 16) == 0.0
    salted = [TraceRequest("a", 0.0, toks, 1, salt="s1"), TraceRequest("b", 1.0, toks, 1, salt="s2")]
    assert infinite_cache_hit_bound(salted, 16) == 0.0
    lora = [TraceRequest("a", 0.0, toks, 1, lora="l1"), TraceRequest("b", 1.0, toks, 1, lora="l1"),
            TraceRequest("c", 2.0, toks, 1, lora="l2")]
    assert infinite_cache_hit_bound(lora, 16) == pytest.approx(3 * 16 / 192)
