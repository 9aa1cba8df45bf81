"""``cluster.kv_store``: a KV store the whole fleet shares (issue 34, item 2), checked once.

Mirrors a Mooncake Store / LMCache-server deployment behind vLLM's connector seam: every replica
offloads the full blocks it computed to one store and looks the store up after its own GPU prefix
cache (vLLM 0.33.0's ``OffloadingConnector`` protocol, which ``sim.core.offload`` models for the CPU
tier; ``sim.cluster.kv_store`` says how the store reuses it). The keys:

* ``capacity_gib`` or ``capacity_blocks`` -- the store's size, in GiB of KV (of the fleet's model:
  ``floor(GiB * 2**30 / round_up(kv_bytes_per_block, 4096))`` blocks, the CPU tier's rule) or in
  GPU blocks; 0 (with no ``policy``) is no store at all;
* ``policy`` -- ``lru`` (default) or ``arc``, the CPU tier's policies (vLLM's ``eviction_policy``);
* ``read_gb_s`` / ``write_gb_s`` -- each replica's own link to the store, GB/s (1e9 B/s) for loads
  (store -> GPU) and stores (GPU -> store); default 25, the issue's example (a 200 Gb/s NIC);
* ``latency_s`` -- a fixed cost per transfer (default 0);
* ``writers`` -- ``all`` (default) or ``prefill``: the replicas connected to it, which write computed
  blocks to it (and read it). A fleet without prefill/decode roles prefills on every replica, so
  ``prefill`` is ``all`` there; with ``cluster.disaggregation`` it leaves the decode pool out
  (``sim.experiment.cluster_store.store_replicas``).

Bad input is one line naming the key (pydantic's ``cluster.kv_store.<key>: ...`` or a
``ConfigError``): a capacity of 0 with a ``policy`` (a store that holds nothing cannot evict), both
capacities, a bandwidth <= 0, a negative latency; the cross-key rules of the fleet (a replica fault
with a store -- it would cut that replica's store link mid-transfer, which is not modelled; a CPU tier
on a replica as well; another vLLM version; replicas that hash differently) are checked by
:func:`check_store_fleet`. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class KVStoreConfig(BaseModel):
    """``cluster.kv_store``: a KV store the whole fleet shares (sim.cluster.kv_store). Every replica
    stores the full prompt blocks it computed to it and loads from it, after its own GPU prefix
    cache, the blocks it holds next (vLLM 0.33.0's connector protocol, as the CPU tier: the request
    waits for the load, the waiting steps compute nothing). Size in ``capacity_gib`` (of the model's
    KV) or ``capacity_blocks`` (0: no store); ``policy`` lru (default) or arc; each replica's own link
    to it: ``read_gb_s`` (loads), ``write_gb_s`` (stores), ``latency_s`` per transfer; ``writers``
    all, or prefill (the replicas with a prefill role: all of them without roles; a P/D fleet's
    prefill pool)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    capacity_gib: Annotated[float, Field(ge=0)] | None = None
    capacity_blocks: Annotated[int, Field(ge=0)] | None = None
    policy: Literal["lru", "arc"] | None = None
    read_gb_s: Annotated[float, Field(gt=0)] = 25.0
    write_gb_s: Annotated[float, Field(gt=0)] = 25.0
    latency_s: Annotated[float, Field(ge=0)] = 0.0
    writers: Literal["all", "prefill"] = "all"

    @model_validator(mode="after")
    def _capacity(self) -> KVStoreConfig:
        if self.capacity_gib is not None and self.capacity_blocks is not None:
            raise ValueError("set capacity_gib or capacity_blocks, not both")
        if self.capacity_gib is None and self.capacity_blocks is None:
            raise ValueError("a store needs capacity_gib or capacity_blocks (0: no store)")
        if self.is_empty and self.policy is not None:
            key = "capacity_gib" if self.capacity_gib is not None else "capacity_blocks"
            raise ValueError(f"{key}: a store of 0 capacity holds nothing to evict, yet policy {self.policy} "
                             "is set; give it a capacity, or drop the policy (0 capacity is no store)")
        return self

    @property
    def is_empty(self) -> bool:
        """Query: a capacity of 0 -- the fleet has no store (it equals a config without one)."""
        return not (self.capacity_gib or self.capacity_blocks)

    @property
    def eviction_policy(self) -> Literal["lru", "arc"]:
        return self.policy or "lru"


def store_blocks(cfg: KVStoreConfig, kv_bytes_per_block: int, round_to: int = 4096) -> int:
    """The store's capacity in GPU blocks (one block per chunk): ``capacity_blocks``, or the GiB
    over one block's KV bytes rounded up to the page (the CPU tier's ``num_cpu_chunks`` rule)."""
    if cfg.capacity_blocks is not None:
        return cfg.capacity_blocks
    assert cfg.capacity_gib is not None
    per = -(-kv_bytes_per_block // round_to) * round_to
    return int(cfg.capacity_gib * 2**30) // per


def check_store_cluster(store: KVStoreConfig | None, faults: Sequence[object], routers: Sequence[object]) -> None:
    """The ``cluster:`` rules a store brings; raises ValueError naming the key. A replica fault with
    a store would cut that replica's store link mid-transfer (its half-written and pinned blocks in
    the shared store): not modelled, so refused. A router of ``scope: global`` needs a store."""
    live = store is not None and not store.is_empty
    if live and faults:
        raise ValueError("faults[0]: a fault with cluster.kv_store would cut the replica's link to the store "
                         "mid-transfer; faults on store links are not modelled (drop the faults or the store)")
    for k, router in enumerate(routers):
        if getattr(router, "scope", "local") == "global" and not live:
            where = "router" if k == 0 else f"compare[{k - 1}]"
            raise ValueError(f"{where}.scope: global routing prices store hits: it needs cluster.kv_store "
                             "with a capacity > 0")
