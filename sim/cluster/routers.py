"""Routers by name (mirrors a gateway's ``--policy`` / ``--router-mode`` switch): ``make_router``
builds one from its kind and parameters.

Invariants: every kind of ``sim.experiment.cluster_config.ROUTER_TAGS`` is here; parameters are
the constructor's keyword arguments. Imports neither simpy nor torch.
"""

from __future__ import annotations

from typing import Any

from sim.cluster.basic_routers import LeastLoadedRouter, RandomRouter, RoundRobinRouter, SessionAffinityRouter
from sim.cluster.dynamo_router import DynamoRouter
from sim.cluster.llm_d_router import LlmDRouter
from sim.cluster.router import Router
from sim.cluster.sglang_router import SGLangRouter
from sim.cluster.ttft_routers import MooncakeRouter, OracleRouter

ROUTERS: dict[str, type[Router]] = {
    "round_robin": RoundRobinRouter,
    "random": RandomRouter,
    "least_loaded": LeastLoadedRouter,
    "session_affinity": SessionAffinityRouter,
    "llm_d": LlmDRouter,
    "dynamo": DynamoRouter,
    "sglang": SGLangRouter,
    "mooncake": MooncakeRouter,
    "oracle": OracleRouter,
}


def make_router(kind: str, seed: int, **params: Any) -> Router:
    """A new router of ``kind`` (a key of :data:`ROUTERS`); raises ValueError for an unknown one."""
    try:
        cls = ROUTERS[kind]
    except KeyError:
        raise ValueError(f"unknown router {kind!r}; choose one of {', '.join(ROUTERS)}") from None
    return cls(seed, **params)
