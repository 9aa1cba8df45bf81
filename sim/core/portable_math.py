"""Elementwise ``exp`` and ``pow`` that give the same floats on every x86-64 host.

Why not numpy's: numpy dispatches its float64 ``exp``, ``log`` and ``power`` loops by the CPU it
runs on (``numpy._core._multiarray_umath.__cpu_dispatch__``). On a host with AVX-512 they run
SIMD kernels (SVML) whose last-ulp rounding differs from the scalar C library's; on an AVX2-only
host they call the C library. A seeded workload -- a lognormal think time, a Zipf weight -- would
then differ by an ulp from host to host, and a closed-loop generator turns that ulp into different
arrivals (the ``agent_synthetic`` snapshot did: its ``arrival`` digest changed between an AVX-512
and an AVX2 host with the same numpy). Python's ``math`` functions call the C library's scalar
routines on every host, so these helpers map them over an array: the same results everywhere
(equal to numpy's on hosts where numpy itself falls back to the C library), at about 60 ns per
element. Use them wherever a seeded stream's values pass through a transcendental function.

Invariant: ``exp(x)[i] == math.exp(x[i])`` and ``power(b, e)[i] == math.pow(b[i], e)`` exactly;
shapes and float64 dtype are kept. Pure Python + numpy (``sim.core``).
"""

from __future__ import annotations

import math

import numpy as np


def exp(x: np.ndarray) -> np.ndarray:
    """``e ** x`` elementwise, by the C library's scalar ``exp`` (see the module docstring)."""
    a = np.asarray(x, dtype=np.float64)
    return np.fromiter(map(math.exp, a.ravel().tolist()), dtype=np.float64, count=a.size).reshape(a.shape)


def power(base: np.ndarray, exponent: float) -> np.ndarray:
    """``base ** exponent`` elementwise, by the C library's scalar ``pow`` (see the module docstring)."""
    a = np.asarray(base, dtype=np.float64)
    e = float(exponent)
    return np.fromiter((math.pow(v, e) for v in a.ravel().tolist()), dtype=np.float64,
                       count=a.size).reshape(a.shape)
