"""Request intake: the trace stream turned into scheduler Requests as the clock reaches them.

Mirrors vLLM's ``EngineCore`` input queue: requests that arrived while a step ran are added to the
scheduler (``add_request``) before the next ``schedule()``.

Invariants:

* arrivals are non-decreasing (checked on every record; a violation raises ReplayError);
* a request is *due* at time ``t`` when ``arrival <= t + ARRIVAL_EPS_S``, so float rounding of the
  clock cannot hide it from the step that starts at its arrival;
* ``uid`` is the delivery order (0, 1, ...);
* ``next_arrival`` is the arrival of the first undelivered record (``inf`` when the stream is done);
  the fast-forward must not play a step past it;
* a record the engine refuses (``sim.replay.rejection``: a prompt too long for ``max_model_len``, a
  request that can never fit the pool) is recorded as ``rejected`` with its reason and never
  reaches the scheduler, as vLLM refuses a request alone; with ``reject_invalid=False`` it raises
  ReplayError instead (the run stops).

Pure Python: imports neither simpy nor torch.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_right
from collections.abc import Iterable, Sequence

from sim.core.request import Request, RequestBlockHasher
from sim.core.scheduler import Scheduler
from sim.replay.arrival_stream import ArrivalStream
from sim.replay.errors import ReplayError
from sim.replay.recorder import ReplayRecorder
from sim.replay.rejection import reject_reason
from workloads.trace_format import TraceRequest

ARRIVAL_EPS_S = 1e-9
"""An arrival counts as "at or before" a step start within this tolerance (float rounding)."""


class RequestIntake:
    """Walks the request stream one record ahead; turns due records into pending Requests."""

    #: Whether something outside the engine reads its state at the next arrival (a cluster's router:
    #: ``sim.cluster.replica.RoutedIntake``). Then a fast-forward window must be over before it
    #: (``sim.replay.decode_window.plan_window``'s ``observed``); the single engine's own arrivals
    #: only join its queue, so a window may run past them while admissions are blocked.
    observed: bool = False

    def __init__(self, requests: Iterable[TraceRequest], scheduler: Scheduler, rec: ReplayRecorder,
                 *, reject_invalid: bool = True) -> None:
        self.scheduler = scheduler
        self.reject_invalid = reject_invalid
        self.rec = rec
        self._stream = ArrivalStream(requests)
        self.next_arrival = math.inf
        self._pending: list[Request] = []
        self._uid = 0

    def peek(self) -> TraceRequest | None:
        """The next not-yet-delivered request of the stream (arrival order is checked)."""
        tr = self._stream.peek()
        self.next_arrival = self._stream.next_arrival
        return tr

    def deliver_due(self, t: float) -> None:
        """Turn every request arriving at or before ``t`` (to ARRIVAL_EPS_S) into a pending Request."""
        while (tr := self.peek()) is not None and tr.arrival <= t + ARRIVAL_EPS_S:
            request = self._make_request(tr)
            if request is not None:
                self._pending.append(request)
            self._stream.pop()

    def admit_due(self, t: float) -> None:
        """Deliver what is due at ``t``, then hand every pending request to ``add_request`` (in
        arrival order: the waiting queue's FCFS order is the delivery order)."""
        self.deliver_due(t)
        if self._pending:
            for r in self._pending:
                self.scheduler.add_request(r)
            self._pending.clear()

    def due_counts(self, times: Sequence[float]) -> list[int]:
        """For each of the non-decreasing ``times``, how many records not yet handed to the
        scheduler arrive at or before it (to ARRIVAL_EPS_S); delivers them (they stay pending)."""
        if not times:
            return []
        self.deliver_due(times[-1])
        arrivals = [r.arrival_time for r in self._pending]
        if not arrivals:  # (a fleet's replica: nothing arrives inside its windows)
            return [0] * len(times)
        return [bisect_right(arrivals, t + ARRIVAL_EPS_S) for t in times]

    def drained(self) -> bool:
        """Nothing left to deliver or admit."""
        return self.peek() is None and not self._pending

    def _make_request(self, tr: TraceRequest, hasher: RequestBlockHasher | None = None) -> Request | None:
        """The scheduler Request of ``tr``, or None when it is rejected (recorded as such); ``hasher``:
        the request's block hasher in place of the scheduler's (one giving the same keys)."""
        sched = self.scheduler
        reason = reject_reason(tr, sched)
        if reason is not None and not self.reject_invalid:
            raise ReplayError(f"request {tr.id}: {reason}")
        try:
            self.rec.new_request(
                tr.id, tr.arrival, len(tr.tokens), tr.output_tokens, tr.salt, tr.lora, tr.tenant, tr.session,
                tr.prompt_logprobs, reject_reason=reason,
            )
        except ValueError as exc:
            raise ReplayError(str(exc)) from None
        if reason is not None:
            return None
        self._uid += 1
        try:
            return self._request(tr, hasher)
        except ValueError as exc:  # a record Request refuses (output_tokens >= 2**24): one line, no traceback
            raise ReplayError(str(exc)) from None

    def _request(self, tr: TraceRequest, hasher: RequestBlockHasher | None = None) -> Request:
        sched = self.scheduler
        return Request(
            tr.id,
            tr.tokens,
            trace_int(tr, "output_tokens", tr.output_tokens),
            uid=self._uid - 1,
            arrival_time=tr.arrival,
            cache_salt=tr.salt,
            lora_name=tr.lora,
            lora_int_id=0,
            priority=trace_int(tr, "priority", tr.priority),
            prompt_logprobs=bool(tr.prompt_logprobs),
            output_token_ids=tr.output_token_ids,
            hasher=(hasher or sched.hasher) if sched.cache_config.enable_prefix_caching else None,
        )


def trace_int(tr: TraceRequest, name: str, value: object) -> int:
    """A trace request's integer field ``name`` as a Python int (a numpy integer from a generator
    included), for the compiled ``Request`` (``sim.core.native_build``), which takes only ints
    there; anything else, a float included, is refused naming the request and field. Used by
    every caller that makes a ``Request`` of a ``TraceRequest`` (here and the cluster's router)."""
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ReplayError(f"request {tr.id}: field {name!r}: expected an int, got {value!r}") from None
