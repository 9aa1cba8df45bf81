"""Routers by name (mirrors a gateway's ``--policy`` / ``--router-mode`` switch): ``make_router``
builds one from its kind and parameters.

A name registry with lazy imports (as mini-sglang's ``kvcache/__init__.py``): each kind names the
module and class that implement it, and only the configured kind's module is imported -- a fleet
replay imports its own router, not the other eight and their indexes (the import is part of the
timed replay: ``benchmarks/bench_cluster.py`` times ``replay_experiment``).

Invariants: every kind of ``sim.experiment.cluster_config.ROUTER_TAGS`` is here (tested); parameters
are the constructor's keyword arguments. Imports neither simpy nor torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from sim.cluster.router import Router

ROUTERS: dict[str, tuple[str, str]] = {  # kind -> (module, class)
    "round_robin": ("sim.cluster.basic_routers", "RoundRobinRouter"),
    "random": ("sim.cluster.basic_routers", "RandomRouter"),
    "least_loaded": ("sim.cluster.basic_routers", "LeastLoadedRouter"),
    "session_affinity": ("sim.cluster.basic_routers", "SessionAffinityRouter"),
    "llm_d": ("sim.cluster.llm_d_router", "LlmDRouter"),
    "dynamo": ("sim.cluster.dynamo_router", "DynamoRouter"),
    "sglang": ("sim.cluster.sglang_router", "SGLangRouter"),
    "mooncake": ("sim.cluster.ttft_routers", "MooncakeRouter"),
    "oracle": ("sim.cluster.ttft_routers", "OracleRouter"),
}


def router_class(kind: str) -> type[Router]:
    """The class of router ``kind`` (a key of :data:`ROUTERS`, its module imported now); raises
    ValueError for an unknown one."""
    try:
        module, name = ROUTERS[kind]
    except KeyError:
        raise ValueError(f"unknown router {kind!r}; choose one of {', '.join(ROUTERS)}") from None
    cls: type[Router] = getattr(import_module(module), name)
    return cls


def make_router(kind: str, seed: int, **params: Any) -> Router:
    """A new router of ``kind`` (a key of :data:`ROUTERS`); raises ValueError for an unknown one."""
    return router_class(kind)(seed, **params)
