"""Small parametric distributions for generator knobs (lengths, counts, times); mirrors nothing in
vLLM.

A :class:`Dist` is immutable and samples with a caller-supplied ``numpy.random.Generator``, so a
generator's output depends only on its seed. Kinds and their parameters:

* ``fixed``: always ``mean``;
* ``uniform``: uniform on ``[low, high]`` (integers inclusive when sampled as ints);
* ``exponential``: mean ``mean``;
* ``lognormal``: ``median * exp(sigma * N(0, 1))`` (``median`` is the 50th percentile; the
  p90 / median ratio is ``exp(1.2816 * sigma)``);
* ``geometric``: integers >= 1 with mean ``mean`` (>= 1).

Samples are then clamped to ``[min, max]`` when those are set. ``sample_int`` rounds to the
nearest integer after clamping and never returns less than ``max(min, 0)`` rounded.

Invariants: a ``Dist`` is immutable and its samples depend only on the generator passed in.
Imports numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from sim.core import portable_math

DistKind = Literal["fixed", "uniform", "exponential", "lognormal", "geometric"]


@dataclass(frozen=True, slots=True)
class Dist:
    """A distribution; see the module docstring for the meaning of each field per kind."""

    dist: DistKind = "fixed"
    mean: float | None = None
    median: float | None = None
    sigma: float = 1.0
    low: float | None = None
    high: float | None = None
    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        need = {
            "fixed": ("mean",),
            "uniform": ("low", "high"),
            "exponential": ("mean",),
            "lognormal": ("median",),
            "geometric": ("mean",),
        }[self.dist]
        for name in need:
            v = getattr(self, name)
            if v is None or not math.isfinite(v):
                raise ValueError(f"{self.dist} distribution needs a finite '{name}'")
        if self.dist == "uniform" and self.low > self.high:  # type: ignore[operator]
            raise ValueError("uniform distribution needs low <= high")
        if self.dist in ("exponential", "lognormal") and (self.mean or self.median or 0) <= 0:
            raise ValueError(f"{self.dist} distribution needs a positive location")
        if self.dist == "geometric" and self.mean < 1:  # type: ignore[operator]
            raise ValueError("geometric distribution needs mean >= 1")
        if self.sigma < 0:
            raise ValueError("sigma must be >= 0")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("min must be <= max")

    @classmethod
    def fixed(cls, value: float) -> Dist:
        return cls("fixed", mean=float(value))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` float samples, clamped to ``[min, max]``."""
        if self.dist == "fixed":
            x = np.full(n, float(self.mean))  # type: ignore[arg-type]
        elif self.dist == "uniform":
            x = rng.uniform(self.low, self.high, size=n)  # type: ignore[arg-type]
        elif self.dist == "exponential":
            x = rng.exponential(self.mean, size=n)  # type: ignore[arg-type]
        elif self.dist == "lognormal":
            x = float(self.median) * portable_math.exp(self.sigma * rng.standard_normal(n))  # type: ignore[arg-type]  # same floats on every host
        else:  # geometric, support 1, 2, ...
            x = rng.geometric(1.0 / float(self.mean), size=n).astype(np.float64)  # type: ignore[arg-type]
        if self.min is not None or self.max is not None:
            x = np.clip(x, self.min, self.max)
        return x

    def sample_int(self, rng: np.random.Generator, n: int, *, at_least: int = 0) -> np.ndarray:
        """``n`` integer samples (rounded), never below ``at_least``."""
        if self.dist == "uniform":
            lo, hi = math.ceil(self.low), math.floor(self.high)  # type: ignore[arg-type]
            x = rng.integers(lo, max(lo, hi) + 1, size=n).astype(np.float64)
            if self.min is not None or self.max is not None:
                x = np.clip(x, self.min, self.max)
        else:
            x = self.sample(rng, n)
        return np.maximum(np.rint(x).astype(np.int64), at_least)

    def one_int(self, rng: np.random.Generator, *, at_least: int = 0) -> int:
        return int(self.sample_int(rng, 1, at_least=at_least)[0])

    def one(self, rng: np.random.Generator) -> float:
        return float(self.sample(rng, 1)[0])


def lognormal(median: float, p90: float, lo: float | None = None, hi: float | None = None) -> Dist:
    """A lognormal with the given median and 90th percentile (``p90 >= median``)."""
    sigma = math.log(p90 / median) / 1.2815515655446004 if p90 > median else 0.0
    return Dist("lognormal", median=median, sigma=sigma, min=lo, max=hi)


@lru_cache(maxsize=64)
def zipf_cdf(n: int, skew: float) -> np.ndarray:
    """The cumulative weights of ranks ``0 .. n-1`` with weight ``(r + 1) ** -skew``, normalised,
    the last exactly 1.0 (``np.searchsorted(cdf, u, side="right")`` maps a uniform ``u`` to a rank).
    Cached and read-only: the tenants' and the RAG corpus's draws share it."""
    w = portable_math.power(np.arange(1, n + 1, dtype=np.float64), -skew)  # same floats on every host
    c = np.cumsum(w / w.sum())
    c[-1] = 1.0
    c.flags.writeable = False
    return c


def rng_for(seed: int, *keys: int) -> np.random.Generator:
    """An independent PCG64 stream for ``(seed, *keys)`` (keys: a purpose tag, an item index)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & ((1 << 64) - 1), *keys])))
