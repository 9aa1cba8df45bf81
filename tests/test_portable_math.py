"""``sim.core.portable_math``: the seeded streams' transcendental functions give the C library's
scalar results, whatever SIMD kernels numpy picks on the host (see the module docstring)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.core import portable_math
from workloads.dists import Dist, rng_for


@given(st.lists(st.floats(-700.0, 700.0), max_size=50))
def test_exp_is_the_c_librarys_exp(xs: list[float]) -> None:
    out = portable_math.exp(np.array(xs, dtype=np.float64))
    assert out.dtype == np.float64 and out.shape == (len(xs),)
    assert out.tolist() == [math.exp(x) for x in xs]


@given(st.lists(st.floats(1.0, 1e6), max_size=50), st.floats(-3.0, 3.0))
def test_power_is_the_c_librarys_pow(bs: list[float], e: float) -> None:
    assert portable_math.power(np.array(bs), e).tolist() == [math.pow(b, e) for b in bs]


def test_shapes_are_kept() -> None:
    x = np.arange(6, dtype=np.float64).reshape(2, 3) / 7
    assert portable_math.exp(x).shape == (2, 3)
    assert portable_math.power(x + 1, -1.1).shape == (2, 3)


def test_a_lognormal_sample_is_median_times_the_c_exp_of_its_normal() -> None:
    d = Dist("lognormal", median=19.0, sigma=1.4)
    got = d.sample(rng_for(7, 3), 1000).tolist()
    z = rng_for(7, 3).standard_normal(1000).tolist()
    assert got == [19.0 * math.exp(1.4 * v) for v in z]
