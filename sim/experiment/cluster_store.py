"""``cluster.kv_store`` resolved against the fleet's engines (mirrors the start-up of a vLLM fleet
whose engines all point their KV connector at one store: each engine's connector is configured the
same way, and the store's size is counted in the model's KV bytes).

:func:`build_store` gives the fleet's :class:`~sim.cluster.kv_store.KVStore` (None without one, or
for a store of 0 capacity: exactly the fleet without a store) and :func:`store_engine` each replica's
engine description with the store's offload tier (``CacheConfig.offload`` of one block per chunk,
prompt-only offloading, no store threshold: the CPU tier's defaults) and the model's KV bytes per
block, which the store link's transfers move.

The rules, each one ``ConfigError`` line naming ``cluster.kv_store`` (or the replica group's key):

* the engines are vLLM 0.33.0's (the connector protocol modelled is 0.33.0's), with prefix caching
  and one full-attention group, without EAGLE (its lookahead hashes are off with a connector);
* no replica has its own CPU tier (``engine.kv_offloading_size`` / ``num_cpu_blocks``): a CPU tier
  in front of a store is vLLM's ``TieringOffloadingManager``, which is not modelled (store-as-the-tier);
* every replica hashes alike (block size, hash algorithm and seed, extra-key format): the store's
  keys are block hashes, shared only among equal hashings;
* ``capacity_gib`` holds at least one block.

Which replicas reach the store (:func:`store_replicas`): every replica, except in a disaggregated
fleet (``cluster.disaggregation``) with ``writers: prefill``, where only the prefill pool does. A
store replica runs the store's connector, which reads and writes, so ``writers`` picks the replicas
connected to the store at all -- in vLLM the connector is per instance (``--kv-transfer-config``),
and the P/D deployments this mirrors connect their decode instances to the prefill peer only: the
Mooncake paper (FAST '25, section 3 and figure 3) has the prefill nodes reuse KV from the store and
the decode nodes receive the prompt's KV from the prefill node over the transfer engine, and
llm-d's / Dynamo's P/D decode workers pull the prompt's KV from their prefill peer over NIXL
(vLLM's ``NixlConnector``). ``writers: all`` connects the decode pool too (a ``MultiConnector``
of NIXL and the store on every instance, ``v1/multi_connector.py``: a request goes to the first
connector reporting matched tokens, and every connector is told its allocated blocks): a decode
replica offers the prompt blocks it received (the store keeps one copy: resident keys are not
stored again) and the prompts it served alone, and looks the store up for those (a landed P/D read
is not looked up: it arrives computed).

Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sim.cluster.kv_store import KVStore, StoreSpec
from sim.experiment.config import ConfigError, ExperimentConfig
from sim.experiment.engine_description import EngineDescription, model_spec
from sim.experiment.store_config import store_blocks


def _hashing(e: EngineDescription) -> tuple[object, ...]:
    return (e.block_size, e.hash_block_size, e.hash_algo, e.hash_seed, e.profile.tagged_extra_keys)


def build_store(cfg: ExperimentConfig, engines: Sequence[EngineDescription]) -> KVStore | None:
    """The fleet's store for the resolved ``engines`` (one per replica), or None (see the module
    docstring); problems raise ``ConfigError``."""
    assert cfg.cluster is not None
    sc = cfg.cluster.kv_store
    if sc is None or sc.is_empty:
        return None
    key = f"{cfg.source}: cluster.kv_store"
    for e in engines:
        if e.profile.version != "0.33.0":
            raise ConfigError(f"{key}: the store is reached through vLLM 0.33.0's connector protocol; "
                              f"engine.vllm_version {e.profile.version} has none (use 0.33.0)")
        if not e.cache_config.enable_prefix_caching:
            raise ConfigError(f"{key}: a store needs prefix caching (enable_prefix_caching: true): "
                              "its keys are block hashes")
        if e.hybrid:
            raise ConfigError(f"{key}: the store is modelled for one full-attention group, not with kv_cache_groups")
        if e.offload is not None:
            raise ConfigError(f"{key}: a replica has its own CPU tier (engine.kv_offloading_size / num_cpu_blocks); "
                              "a CPU tier in front of a store (vLLM's TieringOffloadingManager) is not modelled")
        if e.cache_config.use_eagle or e.num_hash_lookahead_tokens:
            raise ConfigError(f"{key}: engine.use_eagle with a store is not modelled")
        if _hashing(e) != _hashing(engines[0]):
            raise ConfigError(f"{key}: the replicas hash blocks differently (block size, hash algorithm or seed); "
                              "a store's keys are shared only among equal hashings")
    per_block = model_spec(cfg).kv_bytes_per_block(engines[0].block_size)
    blocks = store_blocks(sc, per_block)
    if blocks < 1:
        raise ConfigError(f"{key}.capacity_gib: {sc.capacity_gib} GiB holds no block of {per_block / 2**20:.2f} MiB "
                          f"({cfg.model}); the store must hold at least one block")
    return KVStore(StoreSpec(blocks, sc.eviction_policy, sc.read_gb_s, sc.write_gb_s, sc.latency_s, sc.writers,
                             per_block, engines[0].block_size))


def store_replicas(cfg: ExperimentConfig) -> range:
    """Query: the replicas that run the store's connector (see the module docstring): all of
    ``cfg``'s fleet, or its prefill pool with ``writers: prefill`` in a disaggregated fleet."""
    cluster = cfg.cluster
    assert cluster is not None
    pd = cluster.disaggregation
    if pd is not None and cluster.kv_store is not None and cluster.kv_store.writers == "prefill":
        return range(pd.prefill)
    return range(cluster.num_replicas)


def store_engine(engine: EngineDescription, store: KVStore | None) -> EngineDescription:
    """``engine`` with the store's offload tier (itself without a store)."""
    if store is None:
        return engine
    cache_config = replace(engine.cache_config, offload=store.offload_config())
    return replace(engine, cache_config=cache_config, kv_bytes_per_block=store.spec.kv_bytes_per_block,
                   offload_bandwidth_gb_s=store.spec.read_gb_s, offload_link_latency_s=store.spec.latency_s,
                   offload_link_source="cluster.kv_store")
