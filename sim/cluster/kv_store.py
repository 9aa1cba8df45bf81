"""A KV store the whole fleet shares, behind each replica's offload connector (issue 34, item 2).

Mirrors a Mooncake Store / LMCache-server deployment of vLLM: each engine offloads the full blocks it
computed to one store, and looks the store up after its own GPU prefix cache. vLLM reaches such a
store through its KV-connector protocol, the one ``sim.core.offload`` models for vLLM 0.33.0's CPU
tier, so the store **is** that tier's mechanism, shared -- no second one:

* the store is one CPU-tier manager (vLLM's ``CPUOffloadingManager``, built as the connector builds
  its own: ``sim.core.offload.manager_impl``) -- one capacity, one LRU or ARC policy, chunks of one
  GPU block: the offload key is the block's hash, equal on every replica that hashes alike; every
  replica's engine is built with an offload tier
  (``CacheConfig.offload``: :meth:`KVStore.offload_config`) whose connector is handed the store's
  manager at construction (:meth:`KVStore.scheduler`: it builds none of its own), before any request;
* so each replica runs vLLM's connector protocol unchanged against the shared store: after the GPU
  lookup, ``get_num_new_matched_tokens`` counts the store's consecutive blocks (external matched
  tokens), the admission starts an async load, the request waits in ``WAITING_FOR_REMOTE_KVS`` and the
  steps it waits in charge no compute; computed blocks are offered to the store as they complete
  (``offload_prompt_only``, as the CPU tier), and a block another replica is still writing is a
  ``HIT_PENDING`` (the lookup defers), one another replica is loading is shared (the load pins it);
* each replica's transfers cross its own link to the store
  (:class:`~sim.timing.store_link.StoreLink`: read and write GB/s, a latency per transfer), driven
  by the replay's connector worker (``sim.replay.kv_transfer.LinkKVWorker``) as the CPU tier's are;
* a lookup that defers on a block another replica is still writing leaves its engine with nothing
  of its own in flight: vLLM's engine keeps stepping while it has requests, so the replica polls --
  empty steps of :data:`POLL_S` -- until the write lands (:class:`StoreKVWorker`);
* ``writers``: every replica writes (``all``); ``prefill`` names the replicas with a prefill role,
  which without prefill/decode roles is every replica, so it equals ``all`` in such a fleet; in a
  disaggregated one only the prefill pool is attached (``sim.experiment.cluster_store``).

Store-as-the-tier, not a level below a CPU tier: a replica with its own ``engine.kv_offloading_size``
and a store would need vLLM's ``TieringOffloadingManager`` (``v1/kv_offload/tiering/manager.py``: a
CPU primary tier that every load is promoted through); that staging is not modelled, so the two are
refused together (``sim.experiment.cluster_store``).

Events: the store's ``BlockStored`` / ``BlockRemoved`` carry :data:`MEDIUM_STORE` (vLLM's
``Medium.STORAGE`` of its secondary tiers, ``v1/kv_offload/base.py``), placeholders with the block's
hash (the engine's own event hash). They leave through the replicas' KV-event streams: the store's
one raw event list is drained by whichever replica ends a step next, so an event's replica is the
publisher, not the writer; a router keeps store residency fleet-wide (``sim.cluster.tier_index.
StoreIndex``). Routers that read the CPU tier's ``"CPU"`` events never see the store's as a replica's
tier (the replicas' ``ReplicaFacts.cpu_tier`` stays false).

Invariants: capacity > 0 (a 0-capacity store is no store: ``sim.experiment.store_config``); one
manager for the fleet, its integrity the CPU tier's; attach before the first request.
Imports neither simpy nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
from sim.core.hashing import BlockHasher
from sim.core.offload.events import OffloadingEventsTracker
from sim.core.offload.manager_impl import OffloadingManager, make_offloading_manager
from sim.core.scheduler import Scheduler
from sim.replay.kv_transfer import LinkKVWorker
from sim.timing.store_link import StoreLink

MEDIUM_STORE = "STORAGE"
"""The store's events' medium (vLLM 0.33.0 ``Medium.STORAGE``: the fs / obj secondary tiers)."""


@dataclass(frozen=True)
class StoreSpec:
    """A resolved store: ``num_blocks`` GPU blocks of ``kv_bytes_per_block`` bytes each, its policy,
    each replica's link (``read_gb_s``, ``write_gb_s``, ``latency_s``) and its ``writers``."""

    num_blocks: int
    policy: str = "lru"
    read_gb_s: float = 25.0
    write_gb_s: float = 25.0
    latency_s: float = 0.0
    writers: str = "all"
    kv_bytes_per_block: int = 0
    block_size: int = 16

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"a store holds at least one block, got {self.num_blocks}")
        if not (self.read_gb_s > 0 and self.write_gb_s > 0):
            raise ValueError("a store link's bandwidths must be > 0 GB/s")


POLL_S = 0.001
"""How long an empty step of a replica waiting on another replica's write lasts: vLLM 0.33.0's
``DEFAULT_TIER_POLL_INTERVAL_S`` (``v1/kv_offload/tiering/manager.py``), its pause between polls of
the secondary tiers."""


@dataclass(slots=True)
class StoreKVWorker(LinkKVWorker):
    """A replica's connector worker over its :class:`StoreLink`, which also knows its engine and
    the store: a waiting request whose lookup deferred on a block **another** replica is still
    writing (``HIT_PENDING``) keeps the engine polling -- the step it runs is empty and lasts
    :data:`POLL_S` -- instead of stalling, as vLLM's engine keeps stepping while it has requests.
    A replica's own pending writes keep it stepping as in the CPU tier (``has_pending``)."""

    sched: Scheduler | None = None
    manager: OffloadingManager | None = None
    num_polls: int = 0

    def _waits_on_others(self) -> bool:
        """Query: requests wait here while blocks of other replicas' stores are being written."""
        sched, mgr = self.sched, self.manager
        if sched is None or mgr is None or not sched.waiting or not mgr.num_write_pending:
            return False
        tier = sched.tier
        assert tier is not None
        own = sum(len(j.keys) for j in tier.connector.jobs.values() if j.is_store)
        return mgr.num_write_pending > own

    def has_pending(self) -> bool:
        return LinkKVWorker.has_pending(self) or self._waits_on_others()

    def idle_until(self, step: int, now: float) -> float:
        end = LinkKVWorker.idle_until(self, step, now)
        if end == now and not LinkKVWorker.has_pending(self) and self._waits_on_others():
            self.num_polls += 1
            return now + POLL_S
        return end


class KVStore:
    """The fleet's store (see the module docstring). Methods change state unless they say Query."""

    def __init__(self, spec: StoreSpec) -> None:
        self.spec = spec
        # the connector's own choice of manager (sim.core.offload.manager_impl: the compiled LRU
        # table when built, else the Python CPUOffloadingManager), shared
        self.manager: OffloadingManager = make_offloading_manager(spec.num_blocks, spec.policy, 0, spec.block_size)
        # one tracker for the fleet: placeholders with the block's hash, medium STORAGE
        self.tracker = OffloadingEventsTracker(spec.block_size, 1, False, MEDIUM_STORE)
        self._last: Scheduler | None = None  # the engine attached last

    def offload_config(self) -> OffloadConfig:
        """Query: the tier each replica's engine is built with (its connector given the store's manager)."""
        return OffloadConfig(num_cpu_chunks=self.spec.num_blocks, blocks_per_chunk=1, policy=self.spec.policy)  # type: ignore[arg-type]

    def scheduler(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                  hasher: BlockHasher | None) -> Scheduler:
        """A replica's engine on the store: built with :meth:`offload_config` in ``cache_config`` and
        the store's manager handed to its connector (``Scheduler(offload_manager=...)``: the
        connector builds no manager of its own), then attached (:meth:`attach`)."""
        return self.attach(Scheduler(scheduler_config, cache_config, hasher, offload_manager=self.manager))

    def attach(self, sched: Scheduler) -> Scheduler:
        """Point ``sched``'s connector at the store's event tracker; ``sched`` was just built with
        :meth:`offload_config` and the store's manager, and has seen no request."""
        tier = sched.tier
        if tier is None or tier.connector.blocks_per_chunk != 1 or tier.connector.manager is not self.manager:
            raise ValueError("a store replica's engine needs the store's offload config (one block per chunk) "
                             "and its manager (Scheduler(offload_manager=store.manager))")
        assert not tier.connector.req_status, "attach the store before any request"
        tier.connector.events_tracker = self.tracker
        self._last = sched  # its worker comes next (sim.cluster.replica builds engine, executor, worker)
        return sched

    def build_worker(self) -> StoreKVWorker:
        """The link to the store and the connector worker of the engine attached last."""
        s = self.spec
        return StoreKVWorker(StoreLink(s.read_gb_s, s.latency_s, True, write_gb_s=s.write_gb_s), s.kv_bytes_per_block,
                             sched=self._last, manager=self.manager)

    def check_integrity(self) -> None:
        """Query: the shared manager's invariants (the CPU tier's)."""
        self.manager.check_integrity()
