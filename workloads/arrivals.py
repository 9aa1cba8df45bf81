"""Arrival processes, and placing requests or whole sessions on the timeline (``poisson`` and
``gamma`` mirror vLLM's ``benchmark_serving`` ``--request-rate`` / ``--burstiness``).

Processes (all yield non-decreasing times in seconds, starting after one gap):

* ``poisson(rate)``: exponential gaps, mean ``1 / rate``;
* ``gamma(rate, cv)``: Gamma gaps with mean ``1 / rate`` and coefficient of variation ``cv``
  (``cv > 1`` is burstier than Poisson, ``cv = 1`` is Poisson);
* ``azure_times(path)``: the Azure LLM 2023 timestamps, relative to the first one, replayed in
  cycles if more arrivals are needed (cycle ``c`` is shifted by ``c * (span + mean gap)``);
* ``trace``: keep the source's own timestamps (only for trace sources).

``rate_scale`` sweeps load: rates are multiplied by it, timestamps divided by it.

Placement: a *request-level* source gets the i-th arrival as the i-th request's arrival
(:func:`retime`). A *session* source yields sessions whose requests carry arrivals relative to the
session start; :func:`merge_sessions` starts session j at the j-th arrival and merges all sessions
into one stream sorted by arrival (ties: earlier-started session first, then session order), with
only the sessions currently in progress held in memory.

Invariants: every process and every merged stream is non-decreasing in time. Imports neither
simpy nor torch.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Iterator

import numpy as np

from workloads.trace_format import TraceRequest

_CHUNK = 4096


def poisson(rate: float, rng: np.random.Generator) -> Iterator[float]:
    """Poisson arrivals of ``rate`` per second (infinite)."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    t = 0.0
    while True:
        for gap in rng.exponential(1.0 / rate, size=_CHUNK):
            t += float(gap)
            yield t


def gamma(rate: float, cv: float, rng: np.random.Generator) -> Iterator[float]:
    """Gamma-renewal arrivals: mean gap ``1/rate``, gap CV ``cv`` (shape ``1/cv**2``)."""
    if not rate > 0 or not cv > 0:
        raise ValueError(f"need rate > 0 and cv > 0, got rate={rate}, cv={cv}")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    t = 0.0
    while True:
        for gap in rng.gamma(shape, scale, size=_CHUNK):
            t += float(gap)
            yield t


def cycled(times: np.ndarray) -> Iterator[float]:
    """``times`` (sorted, relative to 0) then again shifted by span + mean gap, forever."""
    if times.size == 0:
        raise ValueError("no arrival times to replay")
    span = float(times[-1] - times[0])
    period = span + (span / (times.size - 1) if times.size > 1 else 1.0)
    base = times - times[0]
    for c in itertools.count():
        off = c * period
        for t in base:
            yield float(t) + off


def scaled(times: Iterator[float], rate_scale: float) -> Iterator[float]:
    """Times divided by ``rate_scale`` (a rate multiplied by it)."""
    if not (rate_scale > 0 and math.isfinite(rate_scale)):
        raise ValueError(f"rate_scale must be finite and > 0, got {rate_scale}")
    if rate_scale == 1.0:
        return times
    return (t / rate_scale for t in times)


def retime(requests: Iterable[TraceRequest], times: Iterator[float]) -> Iterator[TraceRequest]:
    """Give the i-th request the i-th time (requests keep their order)."""
    for req, t in zip(requests, times):
        req.arrival = t
        yield req


def scale_arrivals(requests: Iterable[TraceRequest], rate_scale: float) -> Iterator[TraceRequest]:
    """Keep the source's timestamps, divided by ``rate_scale``."""
    for req in requests:
        if rate_scale != 1.0:
            req.arrival = req.arrival / rate_scale
        yield req


def merge_sessions(
    sessions: Iterable[Iterable[TraceRequest]], starts: Iterator[float]
) -> Iterator[TraceRequest]:
    """Start session j at ``starts[j]`` and merge all sessions by absolute arrival.

    Each session yields requests whose ``arrival`` is relative to its start (>= 0, non-decreasing
    within the session); this rewrites it to ``start + relative``. A session is pulled from
    ``sessions`` only when its start time is reached, so generators stay lazy and only sessions
    in progress are held.
    """
    heap: list[tuple[float, int, float, TraceRequest, Iterator[TraceRequest]]] = []
    seq = itertools.count()
    pending = zip(iter(sessions), starts)
    nxt = next(pending, None)

    def push(it: Iterator[TraceRequest], start: float) -> None:
        req = next(it, None)
        if req is not None:
            if req.arrival < 0:
                raise ValueError(f"request {req.id}: negative arrival within its session")
            req.arrival = start + req.arrival
            heapq.heappush(heap, (req.arrival, next(seq), start, req, it))

    while heap or nxt is not None:
        while nxt is not None and (not heap or nxt[1] <= heap[0][0]):
            session, start = nxt
            push(iter(session), start)
            nxt = next(pending, None)
        if heap:
            _, _, start, req, it = heapq.heappop(heap)
            yield req
            push(it, start)
