"""``cluster.disaggregation``: a prefill pool and a decode pool, and the link the KV crosses
(``sim.cluster.disagg``).

Keys: ``prefill`` and ``decode`` replica counts (the fleet's first ``prefill`` replicas prefill;
their sum must be ``cluster.replicas``, which it is when ``cluster.replicas`` is not given),
``link_gb_s`` (each decode replica's read bandwidth, GB/s, > 0), ``latency_s`` (per transfer,
>= 0) and ``non_cached_tokens`` (llm-d's prefix-based P/D decider: with ``llm_d``, a prompt whose
part not cached on its decode replica is shorter is served by the decode replica alone; 0,
llm-d's default, always disaggregates).

Refused, each in one line naming the key: 0 prefill or 0 decode replicas, a bandwidth <= 0, counts
that are not the fleet's, a router without a P/D rule (``cluster.router``; the ones with one:
:data:`PD_ROUTERS`), faults, and ``cluster.compare`` with such a router; the replay
(``sim.experiment.disagg_run``) refuses hybrid KV groups and miss attribution with decode-only
serving. Imports only pydantic.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

PD_ROUTERS = ("dynamo", "llm_d", "round_robin")
"""The router kinds with a P/D rule (``sim.cluster.disagg_router.PD_ORDER``'s keys, tested)."""


class DisaggregationConfig(BaseModel):
    """``cluster.disaggregation`` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    prefill: Annotated[int, Field(ge=1)]
    decode: Annotated[int, Field(ge=1)]
    link_gb_s: Annotated[float, Field(gt=0)]
    latency_s: Annotated[float, Field(ge=0)] = 0.0
    non_cached_tokens: Annotated[int, Field(ge=0)] = 0


def replicas_from_pools(data: Any) -> Any:
    """A ``cluster:`` mapping with ``disaggregation`` and no ``replicas``: the fleet is its two pools
    (``replicas`` = ``prefill + decode``); anything else unchanged (the model checks it)."""
    if not isinstance(data, dict) or "replicas" in data or not isinstance(data.get("disaggregation"), dict):
        return data
    pools = [data["disaggregation"].get(k) for k in ("prefill", "decode")]
    if all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in pools):
        return {**data, "replicas": pools[0] + pools[1]}
    return data


def check_disaggregation(cluster: Any) -> None:
    """Raises ValueError naming the key when ``cluster`` (a ``ClusterConfig``) cannot be disaggregated."""
    pd = cluster.disaggregation
    if pd is None:
        return
    if pd.prefill + pd.decode != cluster.num_replicas:
        raise ValueError(f"disaggregation: prefill + decode ({pd.prefill} + {pd.decode}) must be the "
                         f"fleet's {cluster.num_replicas} replicas (cluster.replicas)")
    for key, rc in [("router", cluster.router)] + [(f"compare[{k}]", c) for k, c in enumerate(cluster.compare)]:
        if rc.kind not in PD_ROUTERS:
            raise ValueError(f"{key}: router {rc.kind} cannot route prefill and decode separately "
                             f"(cluster.disaggregation takes {', '.join(PD_ROUTERS)})")
    if pd.non_cached_tokens and cluster.router.kind != "llm_d":
        raise ValueError("disaggregation.non_cached_tokens: llm-d's decider only (cluster.router.kind: llm_d)")
    if cluster.faults:
        raise ValueError("faults: a disaggregated fleet is replayed without faults")
