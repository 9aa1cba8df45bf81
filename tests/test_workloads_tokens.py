"""Compact prompts (RunTokens, TaggedTokens), the id layout, distributions and seeded streams."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.lazy_tokens import LazyTokens
from sim.core.request import token_array
from workloads.dists import Dist, lognormal, rng_for
from workloads.tokens import (
    K_AZURE,
    K_TEMPLATE,
    REGION_BITS,
    RunTokens,
    TaggedTokens,
    TokenSpace,
    header,
    region,
    run_ids,
)


def test_region_layout():
    assert region(1, 0) == 1 << 56 and region(K_AZURE, 5) - region(K_AZURE, 4) == 1 << REGION_BITS
    assert region(63, (1 << 24) - 1) + (1 << REGION_BITS) <= 1 << 62  # everything below 2**62
    with pytest.raises(ValueError):
        region(0, 0)
    with pytest.raises(ValueError):
        region(1, 1 << 24)
    assert len(header("user")) == 4 and header("user") != header("assistant")
    assert all(region(K_TEMPLATE, 0) <= t < region(K_TEMPLATE, 1) for t in header("tool"))


def test_run_tokens_roundtrip_and_merge():
    r = RunTokens.of((100, 3), (103, 2), [7, 8], (50, 0), RunTokens.of((200, 2)))
    assert isinstance(r, LazyTokens)
    assert token_array(r).tolist() == [100, 101, 102, 103, 104, 7, 8, 200, 201]
    assert len(r) == 9
    assert r.num_runs == 3  # (100,5) (7,2) (200,2): adjacent runs fused, empty run dropped
    assert r.prefix(4).materialize().tolist() == [100, 101, 102, 103]
    assert r.prefix(0).materialize().tolist() == [] and r.prefix(99) is r
    assert r.slice(3, 8).materialize().tolist() == [103, 104, 7, 8, 200]
    assert r.slice(5, 5).materialize().tolist() == []
    assert r.slice(9, 20).materialize().tolist() == []
    with pytest.raises(ValueError):
        RunTokens(np.array([1]), np.array([0]))


@pytest.mark.parametrize("seed", range(5))
def test_run_tokens_slice_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, 1000, size=20) * 1000
    lengths = rng.integers(1, 30, size=20)
    r = RunTokens(starts, lengths)
    full = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)])
    assert np.array_equal(r.materialize(), full)
    for _ in range(20):
        a, b = sorted(rng.integers(0, full.size + 1, size=2))
        assert np.array_equal(r.slice(int(a), int(b)).materialize(), full[a:b])


def test_from_ids_compresses_consecutive_ids():
    ids = np.arange(1, 2001)
    r = RunTokens.from_ids(ids, 64, 1 << 40, length=2000 * 64 - 5)
    assert r.num_runs == 1 and len(r) == 2000 * 64 - 5
    r2 = RunTokens.from_ids(np.array([5, 3]), 4, 0)
    assert r2.materialize().tolist() == [20, 21, 22, 23, 12, 13, 14, 15]


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(st.integers(0, 40), max_size=30),
    tokens_per_id=st.integers(1, 9),
    base=st.sampled_from([0, 1 << 40]),
    cut=st.integers(-3, 12),
)
def test_from_id_list_equals_from_ids_then_prefix(ids, tokens_per_id, base, cut):
    """The Mooncake loader's one-pass builder gives the runs ``from_ids(...).prefix`` gives: same
    starts, lengths (so same run count and hashing) and length, whatever the cut."""
    length = len(ids) * tokens_per_id - cut
    fast = RunTokens.from_id_list(ids, tokens_per_id, base, length)
    ref = RunTokens.from_ids(np.array(ids, dtype=np.int64), tokens_per_id, base).prefix(length)
    assert fast.starts.tolist() == ref.starts.tolist() and fast.lengths.tolist() == ref.lengths.tolist()
    assert len(fast) == len(ref) and fast.starts.dtype == fast.lengths.dtype == np.int64


def test_tagged_tokens_and_space():
    base = RunTokens.of((10, 5))
    t = TaggedTokens(base, 2, 999)
    assert len(t) == 6 and token_array(t).tolist() == [10, 11, 999, 12, 13, 14]
    assert token_array(TaggedTokens(np.arange(3), 0, 7)).tolist() == [7, 0, 1, 2]
    with pytest.raises(ValueError):
        TaggedTokens(base, 6, 1)
    space = TokenSpace(1000)
    a, b = space.fresh(3), space.fresh(2)
    assert a == (1000, 3) and b == (1003, 2) and run_ids(b).tolist() == [1003, 1004]
    with pytest.raises(ValueError):
        space.fresh(1 << 33)


def test_dists():
    rng = rng_for(0, 9)
    assert Dist.fixed(5).sample_int(rng, 3).tolist() == [5, 5, 5]
    u = Dist("uniform", low=2, high=4).sample_int(rng, 1000)
    assert set(u.tolist()) == {2, 3, 4}
    e = Dist("exponential", mean=10.0).sample(rng, 20000)
    assert 9.5 < e.mean() < 10.5
    g = Dist("geometric", mean=4.0).sample_int(rng, 20000)
    assert g.min() >= 1 and 3.8 < g.mean() < 4.2
    ln = lognormal(100, 400)
    x = ln.sample(rng, 20000)
    assert 95 < np.median(x) < 105 and 380 < np.percentile(x, 90) < 420
    c = Dist("lognormal", median=100, sigma=2, min=50, max=60).sample(rng, 100)
    assert c.min() >= 50 and c.max() <= 60
    assert Dist.fixed(0).one_int(rng, at_least=1) == 1
    for bad in (dict(dist="fixed"), dict(dist="uniform", low=3, high=1), dict(dist="geometric", mean=0.5),
                dict(dist="exponential", mean=-1.0), dict(dist="fixed", mean=1, min=3, max=2)):
        with pytest.raises(ValueError):
            Dist(**bad)


def test_rng_for_is_deterministic_and_independent():
    a = rng_for(7, 1, 2).random(5)
    assert np.array_equal(a, rng_for(7, 1, 2).random(5))
    assert not np.array_equal(a, rng_for(7, 1, 3).random(5))
    assert not np.array_equal(a, rng_for(8, 1, 2).random(5))
    rng_for(-1, 0).random()  # negative seeds are accepted
