"""The memory a simulated fleet will take, estimated before anything is built (mirrors nothing in
vLLM, whose replicas each own a GPU; here every replica's block pool lives in this process).

A replica's memory is almost all its block pool's bookkeeping: one entry per KV block, made when
the replica builds its engine -- on first use (``sim.cluster.replica``): a replica that never gets a
request costs :data:`IDLE_REPLICA_BYTES` only. With ``max_built`` (at most that many replicas can
ever get a request: the stream's request count when the config bounds it, see
:func:`request_bound`; every replica with the oracle router, which reads every engine) the estimate
counts the pools of the ``max_built`` largest replicas and the rest as idle.
:func:`estimate_fleet` adds, per replica, :data:`REPLICA_BYTES` plus
``num_gpu_blocks`` times the pool's bytes per block (:data:`BLOCK_BYTES`, by ``engine.pool_impl``),
from each replica's resolved :class:`~sim.experiment.engine_description.EngineDescription`, and
:data:`PROCESS_BYTES` once. The constants were measured (peak RSS of ``apcsim``'s replay, 60
requests, 1 against 200 replicas of 10,000 and 40,000 blocks, 2026-12-07): 1.40 and 5.34 MiB per
replica with the compiled pool (137.7 bytes per block), 7.66 MiB at 40,000 blocks with the Python
pool; the constants round up. A CPU offload tier costs nothing up front (its chunks are made as
they fill: 10,240 and 40,960 chunks measured the same), so it is not counted; nor are requests.

:func:`check_fleet_memory` refuses, as a ``ConfigError`` naming ``cluster.replicas``, a fleet whose
estimate exceeds :data:`USABLE_FRACTION` of the memory the machine has available now
(``MemAvailable`` of ``/proc/meminfo``; no check where it cannot be read): 100,000 replicas were
OOM-killed after 101 s; now they are refused in a second, with the estimate and what is available
(100,000 replicas serving 60 requests are not: they fit).

``sim.experiment.cluster_run.config_memory`` is one config's estimate, a single engine or a fleet:
what a sweep point asks of a Ray node (``sim.experiment.sweep``: the task's ``memory`` resource, so
the scheduler packs points by the memory they will take).

Invariants: the estimate depends on the config only (it goes into the summary); the available
memory is read once per check. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.experiment.config import ExperimentConfig
from sim.experiment.config_error import ConfigError
from sim.experiment.engine_description import EngineDescription

BLOCK_BYTES = {"compiled": 144, "python": 208}
"""Bytes of pool bookkeeping per KV block, by ``engine.pool_impl`` (measured; see the docstring)."""
REPLICA_BYTES = 96 << 10
"""Bytes per replica besides its pool (scheduler, queues, recorder)."""
IDLE_REPLICA_BYTES = 24 << 10
"""Bytes of a replica that never built its engine (measured: 5,000 such replicas beside one busy one,
peak RSS, 2026-12-07: about 14 KiB each; rounded up)."""
PROCESS_BYTES = 128 << 20
"""The process itself with its imports (measured 130 MiB peak for one small replica)."""
USABLE_FRACTION = 0.9
"""The share of the available memory a fleet may be estimated to take."""


@dataclass(frozen=True)
class FleetMemory:
    """The estimate of one fleet (bytes)."""

    num_replicas: int
    total_bytes: int
    largest_replica_bytes: int


def replica_bytes(engine: EngineDescription) -> int:
    """One replica's estimated bytes (see the module docstring)."""
    per_block = BLOCK_BYTES.get(engine.cache_config.pool_impl, max(BLOCK_BYTES.values()))
    return REPLICA_BYTES + engine.num_gpu_blocks * per_block


def estimate_fleet(engines: Sequence[EngineDescription], max_built: int | None = None) -> FleetMemory:
    """The fleet's estimated bytes, one engine per replica (the same object may repeat); with
    ``max_built``, the pools of at most that many replicas (the largest: an upper bound whichever
    the router picks), the others idle."""
    sizes: dict[int, int] = {}
    per: list[int] = []
    for engine in engines:
        size = sizes.get(id(engine))
        if size is None:
            size = sizes[id(engine)] = replica_bytes(engine)
        per.append(size)
    if max_built is not None and max_built < len(per):
        per.sort(reverse=True)
        per[max_built:] = [IDLE_REPLICA_BYTES] * (len(per) - max_built)
    return FleetMemory(len(engines), PROCESS_BYTES + sum(per), max(sizes.values(), default=0))


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where it cannot be read)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gib(n: int) -> str:
    """Bytes as GiB for a message (``1.4 GiB``, ``384.2 GiB``)."""
    return f"{n / (1 << 30):,.1f} GiB"


def check_fleet_memory(source: str, engines: Sequence[EngineDescription], available: int | None = None,
                       max_built: int | None = None) -> FleetMemory:
    """The estimate, or a ``ConfigError`` when it does not fit (see the module docstring);
    ``available`` overrides the machine's (tests); ``max_built`` as in :func:`estimate_fleet`."""
    est = estimate_fleet(engines, max_built)
    avail = available if available is not None else available_bytes()
    if avail is not None and est.total_bytes > USABLE_FRACTION * avail:
        raise ConfigError(
            f"{source}: cluster.replicas: a fleet of {est.num_replicas:,} replicas needs about {gib(est.total_bytes)} "
            f"of memory (up to {est.largest_replica_bytes / (1 << 20):,.1f} MiB per replica, mostly its KV-block "
            f"bookkeeping), but this machine has {gib(avail)} available; use fewer replicas or fewer "
            f"engine.num_gpu_blocks"
        )
    return est


def request_bound(cfg: ExperimentConfig) -> int | None:
    """At most how many requests ``cfg``'s stream holds, when its config says (a generator's
    ``num_requests``, a trace's ``limit``), else None; None too with the oracle router, which builds
    every replica's engine (it reads them all), so every replica counts."""
    if cfg.cluster is not None and cfg.cluster.router.kind == "oracle":
        return None
    bounds = [v for v in (getattr(cfg.workload, "num_requests", None), getattr(cfg.workload, "limit", None))
              if isinstance(v, int)]
    return min(bounds) if bounds else None
