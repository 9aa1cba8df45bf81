"""Arrival processes and the placement of requests and sessions on the timeline."""

import itertools

import numpy as np
import pytest

from workloads import arrivals as arr
from workloads.dists import rng_for
from workloads.trace_format import TraceRequest


def _take(it, n):
    return np.fromiter(itertools.islice(it, n), dtype=np.float64)


def test_poisson_rate_and_cv():
    t = _take(arr.poisson(20.0, rng_for(1, 100)), 20000)
    gaps = np.diff(t)
    assert np.all(gaps >= 0) and t[0] > 0
    assert 19.0 < len(t) / t[-1] < 21.0
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_rate_and_cv(cv):
    t = _take(arr.gamma(5.0, cv, rng_for(2, 100)), 40000)
    gaps = np.diff(t)
    assert 4.6 < len(t) / t[-1] < 5.4
    assert abs(gaps.std() / gaps.mean() - cv) < 0.12 * cv


def test_bad_rates():
    with pytest.raises(ValueError):
        next(arr.poisson(0.0, rng_for(0)))
    with pytest.raises(ValueError):
        next(arr.gamma(1.0, 0.0, rng_for(0)))
    with pytest.raises(ValueError):
        arr.scaled(iter([1.0]), 0.0)


def test_cycled_and_scaled():
    t = _take(arr.scaled(arr.cycled(np.array([10.0, 11.0, 13.0])), 2.0), 7)
    # span 3, mean gap 1.5 -> period 4.5; then divided by rate_scale 2
    assert t.tolist() == [0.0, 0.5, 1.5, 2.25, 2.75, 3.75, 4.5]
    with pytest.raises(ValueError):
        next(arr.cycled(np.array([])))


def _req(i, t):
    return TraceRequest(f"r{i}", t, np.arange(4, dtype=np.int64), 1)


def test_retime_and_scale_keep_order():
    reqs = [_req(i, 100.0 + i) for i in range(3)]
    out = list(arr.retime(reqs, iter([1.0, 2.0, 5.0])))
    assert [r.arrival for r in out] == [1.0, 2.0, 5.0] and [r.id for r in out] == ["r0", "r1", "r2"]
    out = list(arr.scale_arrivals([_req(0, 10.0)], 4.0))
    assert out[0].arrival == 2.5


def test_merge_sessions_sorted_and_lazy():
    pulled = []

    def session(j, rel):
        pulled.append(j)
        for k, t in enumerate(rel):
            yield _req(f"{j}-{k}", t)

    def sessions():
        yield session(0, [0.0, 10.0, 20.0])
        yield session(1, [0.0, 1.0])
        yield session(2, [0.0, 0.5])
        yield session(3, [])  # an empty session is fine

    merged = arr.merge_sessions(sessions(), iter([0.0, 5.0, 5.0, 100.0, 200.0]))
    first = next(merged)
    assert first.id == "r0-0" and first.arrival == 0.0
    assert pulled == [0]  # session 1 is not started before its time comes
    rest = list(merged)
    got = [(r.id, r.arrival) for r in [first] + rest]
    assert got == [("r0-0", 0.0), ("r1-0", 5.0), ("r2-0", 5.0), ("r2-1", 5.5), ("r1-1", 6.0),
                   ("r0-1", 10.0), ("r0-2", 20.0)]


def test_merge_sessions_rejects_negative_relative_arrival():
    with pytest.raises(ValueError):
        list(arr.merge_sessions([[_req(0, -1.0)]], iter([0.0])))
