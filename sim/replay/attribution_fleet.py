"""Miss attribution on one replica of a cluster: the single engine's checklist plus ``routed_away``
(mirrors nothing in vLLM; the fleet is N vLLM engines behind a router, each with its own
``KVCacheManager``, so a prefix cached on one replica is a miss on every other).

A :class:`FleetAttribution` is a :class:`~sim.replay.attribution.MissAttribution` that the cluster
(:mod:`sim.cluster.fleet_attribution`) tells, at each routing, how far the request's prompt chain
was resident on another replica: ``n`` scheduler blocks -- the hit another replica's own lookup
would have granted it then (the chain from block 0, cached there: free or in use; capped at
``P - 1`` tokens) -- and which replica. Its first admission on this replica then classifies each
missed block ``j`` of the lookup range as the single engine does, except that a block ``j < n``
takes the cause

* ``routed_away`` -- the fleet held the block and the whole chain before it, on a replica the router
  did not choose: sent there, the request would have hit it --

right after the causes of a block held on *this* replica (``unreachable``, ``eagle``; with a CPU
tier ``cpu_partial_chunk`` and the CPU-held ``unreachable``) and before ``in_flight``, ``evicted``,
``isolation`` and ``cold``: those say why this replica lacked it, which matters less than that the
router sent the request away from a replica that had it. Equal keys imply equal extra keys (the
salt, LoRA and multimodal keys are in the hash chain), so ``routed_away`` is always "under the same
extra keys"; a token-equal chain under other keys on another replica stays ``isolation`` or
``cold``. The residency is read at the routing and the classification happens at the admission,
later: the other replica may have evicted the blocks meanwhile (routing is what it is judged by).

The decision is per scheduler block (``j < n``), the same for all group blocks of the span, so
``routed_away`` (code 12, after the CPU cause) never competes by code in a grouped layout (a block
whose needed group blocks are all cached here stays ``unreachable`` / ``eagle``).

With ``n = 0`` (one replica, or no other replica holding the chain's first block) every cause is
the single engine's: ``replicas: 1`` equals the single engine, attribution on (tested). Cost: the
single engine's, plus a per-block pass instead of the set-based count for a request with ``n`` past
its hit. Imports neither simpy nor torch.
"""

from __future__ import annotations

from sim.core.hashing import BlockHash
from sim.core.kv_cache_block import BlockKey
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.replay.attribution import MissAttribution
from sim.replay.attribution_records import CPU_HIT, EAGLE, ROUTED_AWAY, UNREACHABLE, AttributionRecords, BlockRow
from sim.replay.attribution_tier import CpuBlock

NOWHERE = (0, -1)
"""No other replica held the chain's first block at the routing."""


class FleetAttribution(MissAttribution):
    """A replica's miss attribution, with ``routed_away`` (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, *, full: bool = False, ext_hit: str = CPU_HIT) -> None:
        super().__init__(scheduler, full=full)
        self.records = AttributionRecords(full, self.hash_block_size, self.records.blocks_per_chunk, fleet=True,
                                          ext_hit=ext_hit)  # (REMOTE_HIT: the tier is a fleet's shared store)
        self.routed: dict[str, tuple[int, int]] = {}  # request -> (blocks resident elsewhere, on which replica)
        self._away = NOWHERE  # the request being classified

    def note_routing(self, request_id: str, num_blocks: int, replica: int) -> None:
        """Changes state: ``request_id`` was routed here while ``replica`` held its first
        ``num_blocks`` blocks (the last routing counts: a request re-routed after a fault)."""
        self.routed[request_id] = (num_blocks, replica)

    def _attribute(self, r: Request, num_hits: int, hashes: list[BlockHash], tokens: list[BlockHash] | None) -> None:
        self._away = self.routed.pop(r.request_id, NOWHERE)
        try:
            super()._attribute(r, num_hits, hashes, tokens)
        finally:
            self._away = NOWHERE

    def _classify_key(
        self, r: Request, hashes: list[BlockHash], tokens: list[BlockHash] | None, j: int, raw: int, gid: int,
        key: BlockKey, end: int, first: bool,
    ) -> tuple[int, BlockRow]:
        cause, row = super()._classify_key(r, hashes, tokens, j, raw, gid, key, end, first)
        num, where = self._away
        if j < num and cause != UNREACHABLE and cause != EAGLE:  # held here: the local causes first
            return ROUTED_AWAY, ((j, gid, key, ROUTED_AWAY, {"resident_on": where}) if self.full else None)
        return cause, row

    def _count_unitary(
        self, r: Request, hashes: list[BlockHash], tokens: list[BlockHash] | None, first: int, cap: int,
        gpu_boundary: bool = True, held: dict[int, CpuBlock] | None = None,
    ) -> dict[int, int]:
        if self._away[0] <= first:  # nothing resident elsewhere past the hit: the set-based count
            return super()._count_unitary(r, hashes, tokens, first, cap, gpu_boundary, held)
        out: dict[int, int] = {}  # the per-block rule of MissAttribution._attribute, counted
        get = self.pool.cached_block_hash_to_block.get_one_block
        for j in range(first, cap):
            cpu = held.get(j) if held else None
            if cpu is not None and get(hashes[j]) is None:
                cause = self._classify_held(j, hashes[j], cpu)[0]
            else:
                cause = self._classify_key(r, hashes, tokens, j, j, 0, hashes[j], (j + 1) * self.block_size,
                                           j == first and gpu_boundary)[0]
            out[cause] = out.get(cause, 0) + 1
        return out
