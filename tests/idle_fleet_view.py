"""A router's view of an idle fleet for router unit tests: ``n`` replicas of one 16-token-block
engine with nothing running or queued, so only the prefix scorer (and the router's tie-break)
separates them; ``t`` is the clock the router reads as ``now``."""

from __future__ import annotations

from sim.cluster.router import ClusterView, ReplicaFacts, ReplicaMetrics
from sim.core.scheduler import Scheduler
from sim.timing.latency import FixedLatency

BS = 16


class IdleFleetView(ClusterView):
    def __init__(self, n: int, cpu_tier: bool = False) -> None:
        self.num_replicas = n
        self.facts = [ReplicaFacts(BS, 1000, 2048, "fast", 0, FixedLatency(0.01), cpu_tier=cpu_tier)] * n
        self.t = 0.0

    @property
    def now(self) -> float:
        return self.t

    def up(self) -> list[int]:
        return list(range(self.num_replicas))

    def metrics(self, replica: int) -> ReplicaMetrics:
        return ReplicaMetrics()

    def engine(self, replica: int) -> Scheduler:  # pragma: no cover - the oracle's only
        raise NotImplementedError

    def pending_tokens(self, replica: int) -> int:  # pragma: no cover
        return 0
