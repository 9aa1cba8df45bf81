"""A request stream read one record ahead, with its arrival order checked.

Both the single engine's intake (``sim.replay.intake``) and a fleet's dispatcher
(``sim.cluster.cluster``) walk the trace this way: they need the next arrival before deciding how
far the clock may go (vLLM's engine sees a request only once it has arrived; the fast-forward must
not play a step past it), and a stream whose arrivals go backwards is a broken trace.

Invariants: :meth:`peek` returns the same record until :meth:`pop`; arrivals are non-decreasing
(a violation raises ``ReplayError`` naming the request); ``next_arrival`` is the arrival of the
record :meth:`peek` returns, ``inf`` once the stream is exhausted (``done``). Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

from sim.replay.errors import ReplayError
from workloads.trace_format import TraceRequest


class ArrivalStream:
    """The stream of ``requests``, one record ahead (see the module docstring)."""

    def __init__(self, requests: Iterable[TraceRequest]) -> None:
        self._source: Iterator[TraceRequest] = iter(requests)
        self._lookahead: TraceRequest | None = None
        self._last_arrival = -math.inf
        self.done = False  # the source is exhausted (the lookahead may still hold its last record)

    def peek(self) -> TraceRequest | None:
        """The next record not yet popped, or None when there is none left."""
        if self._lookahead is None and not self.done:
            tr = next(self._source, None)
            if tr is None:
                self.done = True
            else:
                if not tr.arrival >= self._last_arrival:
                    raise ReplayError(
                        f"request {tr.id}: arrival {tr.arrival} is before the previous one ({self._last_arrival})"
                    )
                self._last_arrival = tr.arrival
                self._lookahead = tr
        return self._lookahead

    def pop(self) -> None:
        """Consume the record :meth:`peek` returned."""
        self._lookahead = None

    @property
    def next_arrival(self) -> float:
        """The arrival of the record :meth:`peek` returns (``inf`` when none is left)."""
        return self._lookahead.arrival if self._lookahead is not None else math.inf
