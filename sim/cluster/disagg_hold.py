"""A replica's KV blocks held by a P/D transfer in flight, as its engine loop sees them: the engine
keeps stepping until the transfer lands instead of declaring a stall.

Mirrors vLLM 0.33.0's engine with a KV connector: while the connector has transfers in flight the
engine keeps stepping (``has_requests`` counts them; the NIXL connector reports the reads in
``get_finished``), so a waiting request that cannot fit because blocks are held for a transfer waits
for the transfer, it does not fail. The replay's step loop has that behaviour for an offload tier's
worker (``sim.replay.kv_transfer.LinkKVWorker``: a step that schedules nothing lasts until the first
pending job is done, and it is no stall while a job is pending); :class:`HoldWorker` is such a
worker with no jobs of its own: *pending* while the replica holds blocks for a transfer, *done* at
the transfer's landing; an empty step waits until the landing or the cluster's next routing
instant, whichever comes first (vLLM's engine polls: a request arriving meanwhile is scheduled at
once). ``sim.cluster.disagg`` sets it on a replica's step runner while that replica
holds blocks for a transfer and removes it when the last one lands, so a replica without holds steps
exactly as a plain one. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.core.transfer_job import KVConnectorOutput
from sim.replay.kv_transfer import ConnectorMetadataLike, LinkKVWorker
from sim.timing.transfer_link import TransferLink


class HoldWorker(LinkKVWorker):
    """The holds of one replica: request id -> landing time of the transfer holding its blocks;
    ``next_instant`` is the cluster's next routing instant (an arrival may bring this replica work)."""

    def __init__(self, next_instant: Callable[[], float]) -> None:
        super().__init__(TransferLink(float("inf")), 0)
        self.until: dict[str, float] = {}
        self.next_instant = next_instant

    def has_pending(self) -> bool:
        """Query: a transfer holding this replica's blocks has not landed yet."""
        return bool(self.until)

    def start_step(self, step: int, now: float, meta: ConnectorMetadataLike | None) -> float:
        """No job of its own: the forward never waits."""
        return 0.0

    def idle_until(self, step: int, now: float) -> float:
        """Query: an empty step lasts until the first hold's transfer lands or the next routing
        instant, whichever comes first (``now`` if one is now): the engine polls, so a request routed
        here while it waits is scheduled at once, as a plain idle engine's is."""
        first = min(self.until.values()) if self.until else now
        first = min(first, self.next_instant())
        return first if first > now else now

    def finish_step(self, step: int, end: float) -> KVConnectorOutput:
        """Nothing to report: the landing itself releases the hold (``sim.cluster.disagg``)."""
        return KVConnectorOutput(set(), set())
