"""Miss attribution across a fleet: one :class:`~sim.replay.attribution_fleet.FleetAttribution` per
replica incarnation, told at each routing where else the request's prefix was resident, and their
records merged into the fleet's tables (mirrors nothing in vLLM: no router or engine records why a
request missed; this answers it for the ``sim.cluster`` replay).

At each routing (:meth:`FleetAttributions.routed`, called by the dispatcher right after the chosen
replica's intake took the request, before any step runs) the request's prompt chain -- as the
chosen replica hashed it -- is looked up on every other replica that is up, has prefix caching on
and hashes alike (same block size, hash algorithm, hash seed, extra-key format and hash block
size): the hit that replica's own lookup would grant it now, capped at ``P - 1`` tokens as vLLM's
``get_computed_blocks`` caps it (its coordinator's ``find_longest_cache_hit``, a query: cached
blocks, free or in use; with groups, every group's rule; with EAGLE, less the dropped block). The
largest such hit, first replica in index order on a tie, is handed to the chosen replica's
attribution in scheduler blocks; the chosen replica itself is not looked at (its lookup at
admission is the hit). A request that skips the cache, or a chosen replica without prefix caching,
gets nothing.

Tables: a replica's ``requests`` gain the ``miss_<cause>_tokens`` columns (``miss_routed_away_tokens``
among them) of its own records; with a fault, the records of the incarnation that admitted the
request last (a request re-routed away is classified again where it lands; one that never reached
its first admission has zeros). The fleet summary sums the replicas' records (``miss_attribution``,
``miss_attribution_isolation``, with a CPU tier ``miss_attribution_hits``; with a shared KV store,
whose loads are the hit source ``remote_hit``, not a miss: ``store``); ``full`` concatenates
the replicas' ``blocks.parquet`` rows with a ``replica`` column.

Invariants: reads pools, changes nothing (the replay's decisions are those of a run without it);
the causes of every request add up to its missed tokens. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sim.cluster.router import ReplicaFacts
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.replay.attribution_fleet import FleetAttribution
from sim.replay.attribution_records import CPU_HIT, REMOTE_HIT, AttributionRecords

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


def resident_prefix(attribution: FleetAttribution, request: Request) -> int:
    """Query: the tokens of ``request``'s prompt the attribution's replica would hit now (its
    coordinator's ``find_longest_cache_hit`` over the prompt's chain, capped at ``P - 1``)."""
    coordinator = attribution.scheduler.kv_cache_manager.coordinator
    return coordinator.find_longest_cache_hit(request.block_hashes, request.num_prompt_tokens - 1)[1]


def _hashing(f: ReplicaFacts) -> tuple[Any, ...]:
    """What makes two replicas' chains equal for the same request."""
    return (f.block_size, f.hash_algo, f.hash_seed, f.tagged_extra_keys)


class FleetAttributions:
    """The attributions of a fleet's replicas (see the module docstring)."""

    def __init__(self, facts: Sequence[ReplicaFacts], *, full: bool, store: bool = False) -> None:
        self.full = full
        self.ext_hit = REMOTE_HIT if store else CPU_HIT  # a shared store's loads are remote hits
        self.hashing = [_hashing(f) for f in facts]
        self.incarnations: list[list[FleetAttribution]] = [[] for _ in facts]

    def wrap(self, index: int, build: Callable[[], Scheduler]) -> Callable[[], Scheduler]:
        """``build`` with a fresh attribution observing each scheduler it builds (an incarnation)."""

        def build_observed() -> Scheduler:
            sched = build()
            att = FleetAttribution(sched, full=self.full, ext_hit=self.ext_hit)
            sched.kv_cache_manager.block_pool.observer = att
            self.incarnations[index].append(att)
            return sched

        return build_observed

    def _current(self, index: int) -> FleetAttribution | None:
        incs = self.incarnations[index]
        return incs[-1] if incs else None

    def routed(self, chosen: int, request: Request, up: Sequence[int]) -> None:
        """The dispatcher sent ``request`` (its intake's Request) to ``chosen``; ``up``: the replicas
        up now. Records on ``chosen`` how far another replica held its chain (a query elsewhere)."""
        mine = self._current(chosen)
        if mine is None or not mine.caching or request.skip_reading_prefix_cache:
            return
        best, where = 0, -1
        for k in up:
            if k == chosen or self.hashing[k] != self.hashing[chosen]:
                continue
            other = self._current(k)
            if other is None or not other.caching or other.hash_block_size != mine.hash_block_size:
                continue
            n = resident_prefix(other, request)
            if n > best:  # strict: the first replica in index order on a tie
                best, where = n, k
        if best >= mine.block_size:
            mine.note_routing(request.request_id, best // mine.block_size, where)

    # -- tables ---------------------------------------------------------------------------------
    def _merged(self, incs: Sequence[FleetAttribution], keep: set[str]) -> AttributionRecords:
        """One record set of ``incs``' records for the requests in ``keep``, the last incarnation
        that classified a request winning (a replica's faults)."""
        tiered = next((a.records for a in incs if a.records.tier), None)
        base = tiered if tiered is not None else incs[0].records
        merged = AttributionRecords(self.full, base.hash_block_size, base.blocks_per_chunk, fleet=True,
                                    ext_hit=self.ext_hit)
        owner: dict[str, int] = {}
        for n, a in enumerate(incs):
            a.flight.flush()
            owner.update(dict.fromkeys(a.records.counts, n))
            merged.counts.update(a.records.counts)
            merged.hits.update(a.records.hits)
        merged.counts = {rid: c for rid, c in merged.counts.items() if rid in keep}
        merged.hits = {rid: h for rid, h in merged.hits.items() if rid in keep}
        if self.full:
            merged.rows = [row for n, a in enumerate(incs) for row in a.records.rows
                           if row[0] in keep and owner.get(row[0]) == n]
        return merged

    def replica_tables(self, index: int, requests: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None,
                                                                         AttributionRecords]:
        """Replica ``index``'s ``requests`` with its miss columns, its block rows (``full``, else
        None) and its merged records."""
        ids = [str(x) for x in requests["request_id"]]
        incs = self.incarnations[index]
        merged = (self._merged(incs, set(ids)) if incs  # a replica never started: nothing admitted
                  else AttributionRecords(self.full, 1, None, fleet=True, ext_hit=self.ext_hit))
        return requests.assign(**merged.request_columns(ids)), merged.blocks_table(), merged

    @staticmethod
    def fleet_summary(records: Sequence[AttributionRecords]) -> dict[str, Any]:
        """The fleet's ``miss_attribution`` keys: the replicas' records summed."""
        tiered = next((r for r in records if r.tier), records[0])
        total = AttributionRecords(False, tiered.hash_block_size, tiered.blocks_per_chunk, fleet=True,
                                   ext_hit=tiered.ext_hit)
        for r in records:
            total.counts.update(r.counts)
            total.hits.update(r.hits)
        return total.summary()
