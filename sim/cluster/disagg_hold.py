"""A replica's KV blocks held by a P/D transfer in flight, as its engine loop sees them: the engine
keeps stepping until the transfer lands instead of declaring a stall.

Mirrors vLLM 0.33.0's engine with a KV connector: while the connector has transfers in flight the
engine keeps stepping (``has_requests`` counts them; the NIXL connector reports the reads in
``get_finished``), so a waiting request that cannot fit because blocks are held for a transfer waits
for the transfer, it does not fail. The replay's step loop has that behaviour for an offload tier's
worker (``sim.replay.kv_transfer.LinkKVWorker``: a step that schedules nothing lasts until the first
pending job is done, and it is no stall while a job is pending); :class:`HoldWorker` is such a
worker with no jobs of its own: *pending* while the replica holds blocks for a transfer, *done* at
the transfer's landing. ``sim.cluster.disagg`` sets it on a replica's step runner while that replica
holds blocks for a transfer and removes it when the last one lands, so a replica without holds steps
exactly as a plain one. Imports neither simpy nor torch.
"""

from __future__ import annotations

from sim.core.transfer_job import KVConnectorOutput
from sim.replay.kv_transfer import ConnectorMetadataLike, LinkKVWorker
from sim.timing.transfer_link import TransferLink


class HoldWorker(LinkKVWorker):
    """The holds of one replica: request id -> landing time of the transfer holding its blocks."""

    def __init__(self) -> None:
        super().__init__(TransferLink(float("inf")), 0)
        self.until: dict[str, float] = {}

    def has_pending(self) -> bool:
        """Query: a transfer holding this replica's blocks has not landed yet."""
        return bool(self.until)

    def start_step(self, step: int, now: float, meta: ConnectorMetadataLike | None) -> float:
        """No job of its own: the forward never waits."""
        return 0.0

    def idle_until(self, step: int, now: float) -> float:
        """Query: an empty step lasts until the first hold's transfer lands (``now`` if one does now)."""
        first = min(self.until.values()) if self.until else now
        return first if first > now else now

    def finish_step(self, step: int, end: float) -> KVConnectorOutput:
        """Nothing to report: the landing itself releases the hold (``sim.cluster.disagg``)."""
        return KVConnectorOutput(set(), set())
