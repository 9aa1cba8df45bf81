"""Building a disaggregated replay (``sim.cluster.disagg``) from a config whose
``cluster.disaggregation`` is set (``sim.experiment.disagg_config``): one router per pool, the KV
bytes per block of each replica's model, and the refusals the replay needs (hybrid KV groups, miss
attribution with llm-d's decode-only serving: one line naming the key). A shared store
(``cluster.kv_store``) comes in as the plain fleet's: the replicas that reach it
(``sim.experiment.cluster_store.store_replicas``) were built with its connector; so do replicas'
own CPU tiers (``engine.kv_offloading_size`` / ``num_cpu_blocks``: each engine built with its tier
and its link, as in a plain fleet).
Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sim.cluster.disagg import DisaggSpec, PDClusterReplay
from sim.cluster.disagg_router import PDRouter
from sim.cluster.replica import ReplicaSpec
from sim.experiment.config_error import ConfigError
from sim.experiment.engine_description import EngineDescription, model_spec
from workloads.trace_format import TraceRequest

if TYPE_CHECKING:  # pragma: no cover
    from sim.cluster.router import Router
    from sim.experiment.config import ExperimentConfig


def disagg_factory(cfg: ExperimentConfig, engines: list[EngineDescription],
                   build_router: Callable[[ExperimentConfig], tuple[Router, dict[str, Any]]]
                   ) -> Callable[..., PDClusterReplay]:
    """A drop-in for ``ClusterReplay(specs, router, requests, **kwargs)`` that builds ``cfg``'s
    disaggregated replay instead (its own routers: the ``router`` given is not used)."""
    def make(specs: list[ReplicaSpec], router: Router, requests: Iterable[TraceRequest],
             **kwargs: Any) -> PDClusterReplay:
        return disagg_replay(cfg, specs, engines, build_router, requests, **kwargs)
    return make


def disagg_replay(cfg: ExperimentConfig, specs: list[ReplicaSpec], engines: list[EngineDescription],
                  build_router: Callable[[ExperimentConfig], tuple[Router, dict[str, Any]]],
                  requests: Iterable[TraceRequest], **kwargs: Any) -> PDClusterReplay:
    """The disaggregated replay of ``cfg`` (its ``cluster.disaggregation`` set): one router per
    pool, each built from ``cluster.router`` (the decode pool's seeded with the seed + 1);
    ``kwargs`` are ``ClusterReplay``'s."""
    cluster = cfg.cluster
    assert cluster is not None and cluster.disaggregation is not None
    pd = cluster.disaggregation
    if any(e.hybrid for e in engines):
        raise ConfigError(f"{cfg.source}: cluster.disaggregation: one full-attention KV group only")
    if cfg.replay.attribution != "off" and pd.non_cached_tokens:
        raise ConfigError(f"{cfg.source}: replay.attribution: miss attribution covers the prefill pool; a "
                          "disaggregated fleet with decode-only serving (non_cached_tokens > 0) is replayed without it")
    prefill, info = build_router(cfg)
    decode, _ = build_router(cfg)
    seed = cluster.seed if cluster.seed is not None else cfg.seed
    decode.rng.seed(seed + 1)
    n = pd.prefill + pd.decode
    router = PDRouter(prefill.name, prefill, decode, range(pd.prefill), range(pd.prefill, n), pd.non_cached_tokens)
    model = model_spec(cfg)  # one model for the fleet (a replica group overrides gpu and engine keys only)
    spec = DisaggSpec(pd.prefill, pd.decode, pd.link_gb_s, pd.latency_s,
                      tuple(model.kv_bytes_per_block(e.block_size) for e in engines))
    kwargs["router_info"] = {**kwargs.get("router_info", info), "disaggregation": pd.model_dump()}
    return PDClusterReplay(specs, router, requests, disagg=spec, **kwargs)
