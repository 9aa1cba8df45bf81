"""From a config with a ``cluster:`` section to a cluster replay and its results folder.

Mirrors the start-up of a fleet: every replica's engine is resolved like a single engine
(:func:`sim.experiment.engine_description.resolve`, one description per replica group of a mixed
fleet: the experiment's ``gpu`` and ``engine`` with the group's overrides), the router is built
from ``cluster.router`` (``sim.cluster.routers``), and ``sim.cluster.cluster.ClusterReplay`` runs
them on the config's workload.

The results folder is the single engine's (``sim.experiment.results``) with the fleet's tables
(``requests`` with ``replica``, ``reroutes``, ``believed_hit_tokens``; ``steps`` with
``replica``), the summary with its ``cluster`` block, and ``replicas.csv`` (one row per replica).
With ``replay.attribution`` (``sim.cluster.fleet_attribution``) the tables carry the miss causes,
``routed_away`` among them, the comparison rows the prompt tokens each router lost to routing, and
the compared routers' own tables go to ``compared_requests.parquet`` / ``compared_blocks.parquet``
(``apcsim explain --router NAME``).

Before anything is built, the fleet's memory is estimated from the resolved engines
(``sim.experiment.fleet_memory``): a fleet that cannot fit the machine is refused, naming
``cluster.replicas``; the estimate goes into the summary (``cluster.memory_estimate_bytes``).

Invariants: a replica group's problem is reported as ``<file>: cluster.replicas[k]: <key>: ...``;
the router is seeded with ``cluster.seed`` (default: the experiment seed) and the KV-event
delays with ``cluster.kv_events.seed`` (default: the experiment seed + 1). Imports neither torch
nor gpu_backend (an executor factory comes in from ``sim.experiment.run``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.cluster.cluster import ClusterReplay, ClusterResult, Fault
from sim.cluster.global_router import GlobalMooncakeRouter
from sim.cluster.kv_event_pipeline import delay_sampler
from sim.cluster.kv_store import KVStore
from sim.cluster.replica import ReplicaSpec
from sim.cluster.router import ReplicaFacts, Router
from sim.cluster.routers import make_router
from sim.cluster.ttft_routers import MooncakeRouter, OracleRouter
from sim.core.executor import Executor
from sim.core.scheduler import Scheduler
from sim.experiment.cluster_store import build_store, store_engine, store_replicas
from sim.experiment.config import ConfigError, ExperimentConfig, config_from_dict, config_to_dict
from sim.experiment.engine_description import EngineDescription, resolve
from sim.experiment.fleet_memory import FleetMemory, check_fleet_memory, estimate_fleet, request_bound
from sim.experiment.kv_worker import build_kv_worker
from sim.experiment.workload import build_workload
from sim.replay.kv_transfer import LinkKVWorker
from sim.timing.latency import LatencyModel
from workloads.registry import Workload

if TYPE_CHECKING:  # pandas: imported where a file is written (a replay that only summarises never does)
    import pandas as pd

_CAPACITY_KEYS = ("num_gpu_blocks", "kv_cache_gib")


def replica_configs(cfg: ExperimentConfig) -> list[ExperimentConfig]:
    """One config per replica: ``cfg`` itself, or per group ``cfg`` with the group's overrides."""
    cluster = cfg.cluster
    assert cluster is not None
    if isinstance(cluster.replicas, int):
        return [cfg] * cluster.replicas
    out: list[ExperimentConfig] = []
    for k, group in enumerate(cluster.replicas):
        data = config_to_dict(cfg)
        data.pop("cluster", None)
        engine = dict(data["engine"])
        if any(key in group.engine for key in _CAPACITY_KEYS):
            for key in _CAPACITY_KEYS:
                engine[key] = None  # the group's capacity replaces the experiment's
        engine.update(group.engine)
        data["engine"] = engine
        if group.gpu is not None:
            data["gpu"] = group.gpu
        sub = config_from_dict(data, f"{cfg.source}: cluster.replicas[{k}]", cfg.base_dir)
        out.extend([sub] * group.count)
    return out



def config_memory(cfg: ExperimentConfig) -> FleetMemory:
    """``cfg``'s memory estimate (``sim.experiment.fleet_memory``): its fleet's, each replica
    group's engine resolved once, or its one engine's."""
    subs = replica_configs(cfg) if cfg.cluster is not None else [cfg]
    resolved = {id(sub): resolve(sub) for sub in subs}
    return estimate_fleet([resolved[id(sub)] for sub in subs], request_bound(cfg))

def build_router(cfg: ExperimentConfig) -> tuple[Router, dict[str, Any]]:
    """The router of ``cluster.router`` and its description (kind and parameters)."""
    assert cfg.cluster is not None
    rc = cfg.cluster.router
    params = rc.model_dump(exclude={"kind"})
    info = {"kind": rc.kind, **params}
    if rc.kind == "llm_d":
        w = params.pop("weights")
        params.update(queue_weight=w["queue"], kv_cache_weight=w["kv_cache"], prefix_weight=w["prefix"])
        t = params.pop("tier_weights")
        params.update(gpu_weight=t["gpu"], cpu_weight=t["cpu"])
    seed = cfg.cluster.seed if cfg.cluster.seed is not None else cfg.seed
    if rc.kind == "mooncake":  # scope: local (the registry's) or global (sim.cluster.global_router)
        if params.pop("scope") == "global":
            return GlobalMooncakeRouter(seed, **params), info
        del info["scope"]  # (the local policy's description is what it was before scopes)
    return make_router(rc.kind, seed, **params), info


def replica_specs(
    cfg: ExperimentConfig,
    executor_factory: Callable[[ExperimentConfig, Scheduler], Executor],
    build_latency: Callable[[ExperimentConfig], LatencyModel],
    store: KVStore | None = None,
) -> tuple[list[ReplicaSpec], list[EngineDescription]]:
    """The replicas' build recipes and resolved engines (resolved once per distinct config); with a
    ``store`` (``sim.experiment.cluster_store``), the connector of every engine that reaches it
    (``store_replicas``: all, or a P/D fleet's prefill pool) uses it."""
    specs: list[ReplicaSpec] = []
    engines: list[EngineDescription] = []
    cache: dict[tuple[int, bool], tuple[EngineDescription, LatencyModel]] = {}
    attached = store_replicas(cfg) if store is not None else range(0)
    for i, sub in enumerate(replica_configs(cfg)):
        mine = store if i in attached else None
        key = (id(sub), mine is None)
        if key not in cache:
            cache[key] = (store_engine(resolve(sub), mine), build_latency(sub))
        engine, latency = cache[key]
        facts = ReplicaFacts(engine.block_size, engine.num_gpu_blocks,
                             engine.scheduler_config.max_num_batched_tokens, engine.hash_algo, engine.hash_seed,
                             latency, engine.num_hash_lookahead_tokens, engine.profile.tagged_extra_keys,
                             engine.offload is not None and mine is None)  # (a store is no replica's CPU tier)

        def scheduler(engine: EngineDescription = engine, mine: KVStore | None = mine) -> Scheduler:
            if mine is not None:  # (its connector takes the store's manager, building none of its own)
                return mine.scheduler(engine.scheduler_config, engine.cache_config, engine.block_hasher())
            return Scheduler(engine.scheduler_config, engine.cache_config, engine.block_hasher())

        def executor(sched: Scheduler, sub: ExperimentConfig = sub) -> Executor:
            return executor_factory(sub, sched)

        def kv_worker(engine: EngineDescription = engine, mine: KVStore | None = mine) -> LinkKVWorker | None:
            # each incarnation's own link and worker (to the store, with one)
            return build_kv_worker(engine) if mine is None else mine.build_worker()

        specs.append(ReplicaSpec(f"replica-{i}", facts, scheduler, executor, sub.replay.fast_forward,
                                 sub.replay.on_invalid_request == "reject", kv_worker))
        engines.append(engine)
    return specs, engines


def replay_cluster(
    cfg: ExperimentConfig,
    executor_factory: Callable[[ExperimentConfig, Scheduler], Executor],
    build_latency: Callable[[ExperimentConfig], LatencyModel],
    **replay_kwargs: Any,
) -> tuple[ClusterResult, Workload]:
    """Build the fleet, the router and the workload, and replay (no files written)."""
    cluster = cfg.cluster
    assert cluster is not None
    subs = replica_configs(cfg)
    resolved = {id(sub): resolve(sub) for sub in {id(sub): sub for sub in subs}.values()}  # once per group
    memory = check_fleet_memory(cfg.source, [resolved[id(sub)] for sub in subs],  # before anything is built
                                max_built=request_bound(cfg))
    store = build_store(cfg, [resolved[id(sub)] for sub in subs])  # None: no store (or of 0 capacity)
    specs, engines = replica_specs(cfg, executor_factory, build_latency, store)
    router, info = build_router(cfg)
    if store is not None and isinstance(router, MooncakeRouter | OracleRouter):
        router.store = store.spec  # the global scope and the oracle price the store's hits
    workload = build_workload(cfg, engines[0])
    ev = cluster.kv_events
    seed = ev.seed if ev.seed is not None else cfg.seed + 1
    delay = ev.delay_s if isinstance(ev.delay_s, float | int) else ev.delay_s.model_dump(exclude_none=True)
    try:
        sampler = delay_sampler(delay, seed)
    except ValueError as exc:
        raise ConfigError(f"{cfg.source}: cluster.kv_events.delay_s: {exc}") from None
    # cluster.disaggregation: a prefill and a decode pool (sim.experiment.disagg_run), same arguments
    if cluster.disaggregation is None:
        make: Any = ClusterReplay
    else:  # (imported here: its summary module imports pandas)
        from sim.experiment.disagg_run import disagg_factory
        make = disagg_factory(cfg, engines, build_router)
    replay = make(
        specs, router, workload.requests,
        kv_delay=sampler,
        metrics_interval_s=cluster.metrics_interval_s,
        faults=[Fault(f.replica, f.down_at, f.up_at) for f in cluster.faults],
        ttft_slo_s=cluster.ttft_slo_s,
        router_info=info,
        record_events=cfg.replay.record_events,
        attribution=cfg.replay.attribution,
        kv_store=store,
        release_engines=True,  # nothing reads this replay's engines after its run
        **replay_kwargs,
    )
    result = replay.run()
    result.summary["cluster"]["memory_estimate_bytes"] = memory.total_bytes  # sim.experiment.fleet_memory
    if cluster.compare:
        rows = [_headline(info, result.summary)]
        for rc in cluster.compare:
            other, other_result = _replay_with(cfg, rc.model_dump(), executor_factory, build_latency, **replay_kwargs)
            rows.append(_headline(other, other_result.summary))
            if cfg.replay.attribution != "off":  # kept for apcsim explain --router (write_cluster_extras)
                result.compared.append((router_label(other), other_result))
        result.summary["cluster"]["comparison"] = rows
    return result, workload


_HEADLINE = ("token_hit_rate", "request_hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_p50_s")


def _headline(router: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    row = {"router": router_label(router), **{k: summary[k] for k in _HEADLINE}}
    row["goodput_fraction"] = summary["cluster"]["goodput_fraction"]
    row["load_imbalance_busy"] = summary["cluster"]["load_imbalance_busy"]
    lost = (summary.get("miss_attribution") or {}).get("routed_away")
    if lost is not None:  # replay.attribution on: the prompt tokens lost to routing (sim.cluster.fleet_attribution)
        row["routed_away_tokens"] = lost
        row["routed_away_fraction"] = lost / summary["prompt_tokens"] if summary["prompt_tokens"] else 0.0
    return row


def router_label(router: dict[str, Any]) -> str:
    """``llm_d (precise)``, ``dynamo``, ...: the kind, with llm-d's prefix mode."""
    return f"{router['kind']} ({router['prefix']})" if router.get("prefix") else str(router["kind"])


def _replay_with(cfg: ExperimentConfig, router: dict[str, Any], executor_factory: Any, build_latency: Any,
                 **replay_kwargs: Any) -> tuple[dict[str, Any], ClusterResult]:
    data = config_to_dict(cfg)
    data["cluster"] = {**data["cluster"], "router": router, "compare": []}
    other = config_from_dict(data, cfg.source, cfg.base_dir)
    result, _ = replay_cluster(other, executor_factory, build_latency, **replay_kwargs)
    return {"kind": router["kind"], "prefix": router.get("prefix")}, result


COMPARED_REQUESTS, COMPARED_BLOCKS = "compared_requests.parquet", "compared_blocks.parquet"
"""With ``replay.attribution`` and ``cluster.compare``: the compared routers' requests (and, ``full``,
block rows), one table each with a ``router`` column (``apcsim explain --router NAME``)."""


def write_cluster_extras(folder: Path, result: ClusterResult) -> None:
    """``replicas.csv`` (one row per replica), when recorded ``kv_events.jsonl`` with the replica
    of each event, and the compared routers' tables of an attributed run (:data:`COMPARED_REQUESTS`)."""
    import pandas as pd

    write_table_csv(folder / "replicas.csv", pd.DataFrame(result.summary["cluster"]["replicas"]))
    if result.compared:
        reqs = pd.concat([r.requests.assign(router=label) for label, r in result.compared], ignore_index=True)
        reqs.to_parquet(folder / COMPARED_REQUESTS, index=False)
        blocks = [r.blocks.assign(router=label) for label, r in result.compared if r.blocks is not None]
        if blocks:
            pd.concat(blocks, ignore_index=True).to_parquet(folder / COMPARED_BLOCKS, index=False)
    if result.events:
        import json

        from sim.core.kv_events import event_to_dict

        lines = "".join(json.dumps({"replica": r, "step": s, **event_to_dict(e)}) + "\n"
                        for r, (s, e) in zip(result.event_replicas, result.events))
        (folder / "kv_events.jsonl").write_text(lines)


def write_table_csv(path: Path, df: pd.DataFrame) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(path)

