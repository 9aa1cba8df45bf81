"""Cache-blind routers: ``round_robin``, ``random``, ``least_loaded`` and ``session_affinity``.

Mirror the classic policies of every inference gateway (SGLang router ``sgl-router/src/policies/``
``round_robin.rs`` / ``random.rs``; Dynamo's ``--router-mode round-robin|random``; a
least-outstanding-requests balancer): they see only their own bookkeeping of what they sent and
what came back (:class:`InFlight`), never the engines.

* ``round_robin`` cycles over the replicas that are up;
* ``random`` picks one uniformly;
* ``least_loaded`` picks the fewest outstanding requests (``by: requests``) or outstanding tokens
  (``by: tokens``: prompt tokens until the first token streams back, plus output tokens until the
  response ends), lowest index on a tie;
* ``session_affinity`` keeps a session on the replica it was first sent to while the session was
  seen within ``ttl_s`` (sticky sessions with a TTL, like a cookie-based balancer); new, expired
  or session-less requests, and sessions whose replica went down, go to the least loaded.

Invariants: each router's state changes only in ``route`` and the response / health callbacks.
Imports neither simpy nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.cluster.router import ClusterView, Decision, Router, RouterRequest


@dataclass(slots=True)
class _Outstanding:
    replica: int
    prompt: int
    output: int
    prefilled: bool = False


class InFlight:
    """Per replica: requests sent and not finished, and their outstanding tokens."""

    def __init__(self, num_replicas: int) -> None:
        self.requests = [0] * num_replicas
        self.tokens = [0] * num_replicas
        self._open: dict[str, _Outstanding] = {}

    def sent(self, request: RouterRequest, replica: int) -> None:
        o = _Outstanding(replica, request.prompt_len, request.output_tokens)
        self._open[request.request_id] = o
        self.requests[replica] += 1
        self.tokens[replica] += o.prompt + o.output

    def first_token(self, request_id: str) -> None:
        o = self._open.get(request_id)
        if o is not None and not o.prefilled:
            o.prefilled = True
            self.tokens[o.replica] -= o.prompt

    def finished(self, request_id: str) -> None:
        o = self._open.pop(request_id, None)
        if o is not None:
            self.requests[o.replica] -= 1
            self.tokens[o.replica] -= o.output + (0 if o.prefilled else o.prompt)

    def replica_down(self, replica: int) -> None:
        """Forget what was outstanding there (those requests are routed again)."""
        for rid in [rid for rid, o in self._open.items() if o.replica == replica]:
            del self._open[rid]
        self.requests[replica] = 0
        self.tokens[replica] = 0

    def least(self, candidates: list[int], by: str = "requests") -> int:
        load = self.requests if by == "requests" else self.tokens
        return min(candidates, key=lambda i: load[i])


class TrackedRouter(Router):
    """A router that tracks its own in-flight requests (what it sent, what came back)."""

    def attach(self, view: ClusterView) -> None:
        super().attach(view)
        self.inflight = InFlight(view.num_replicas)

    def on_first_token(self, request_id: str, replica: int) -> None:
        self.inflight.first_token(request_id)

    def on_finish(self, request_id: str, replica: int) -> None:
        self.inflight.finished(request_id)

    def on_replica_down(self, replica: int) -> None:
        self.inflight.replica_down(replica)

    def _send(self, request: RouterRequest, replica: int) -> Decision:
        self.inflight.sent(request, replica)
        return Decision(replica)


class RoundRobinRouter(TrackedRouter):
    name = "round_robin"

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self._next = 0

    def route(self, request: RouterRequest) -> Decision:
        assert self.view is not None
        n = self.view.num_replicas
        up = set(self.view.up())
        for k in range(n):  # the next replica that is up, in index order
            i = (self._next + k) % n
            if i in up:
                self._next = (i + 1) % n
                return self._send(request, i)
        raise AssertionError("route() called with no replica up")


class RandomRouter(TrackedRouter):
    name = "random"

    def route(self, request: RouterRequest) -> Decision:
        assert self.view is not None
        return self._send(request, self.pick_random(self.view.up()))


class LeastLoadedRouter(TrackedRouter):
    name = "least_loaded"

    def __init__(self, seed: int, by: str = "requests") -> None:
        super().__init__(seed)
        self.by = by

    def route(self, request: RouterRequest) -> Decision:
        assert self.view is not None
        return self._send(request, self.inflight.least(self.view.up(), self.by))


class SessionAffinityRouter(TrackedRouter):
    name = "session_affinity"

    def __init__(self, seed: int, ttl_s: float = 300.0) -> None:
        super().__init__(seed)
        self.ttl_s = ttl_s
        self._sessions: dict[str, tuple[int, float]] = {}  # session -> (replica, last seen)

    def route(self, request: RouterRequest) -> Decision:
        assert self.view is not None
        now = self.view.now
        up = self.view.up()
        session = request.session
        pinned = self._sessions.get(session) if session is not None else None
        if pinned is not None and now - pinned[1] <= self.ttl_s and pinned[0] in up:
            replica = pinned[0]
        else:
            replica = self.inflight.least(up)
        if session is not None:
            self._sessions[session] = (replica, now)
        return self._send(request, replica)

    def on_replica_down(self, replica: int) -> None:
        super().on_replica_down(replica)
        for s in [s for s, (r, _) in self._sessions.items() if r == replica]:
            del self._sessions[s]
