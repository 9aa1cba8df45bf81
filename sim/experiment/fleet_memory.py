"""The memory a simulated fleet will take, estimated before anything is built (mirrors nothing in
vLLM, whose replicas each own a GPU; here every replica's block pool lives in this process).

A replica's memory is almost all its block pool's bookkeeping: one entry per KV block, made when
the replica starts. :func:`estimate_fleet` adds, per replica, :data:`REPLICA_BYTES` plus
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
OOM-killed after 101 s; now they are refused in a second, with the estimate and what is available.

Invariants: the estimate depends on the config only (it goes into the summary); the available
memory is read once per check. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.experiment.config_error import ConfigError
from sim.experiment.engine_description import EngineDescription

BLOCK_BYTES = {"compiled": 144, "python": 208}
"""Bytes of pool bookkeeping per KV block, by ``engine.pool_impl`` (measured; see the docstring)."""
REPLICA_BYTES = 96 << 10
"""Bytes per replica besides its pool (scheduler, queues, recorder)."""
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


def estimate_fleet(engines: Sequence[EngineDescription]) -> FleetMemory:
    """The fleet's estimated bytes, one engine per replica (the same object may repeat)."""
    sizes: dict[int, int] = {}
    total = PROCESS_BYTES
    for engine in engines:
        size = sizes.get(id(engine))
        if size is None:
            size = sizes[id(engine)] = replica_bytes(engine)
        total += size
    return FleetMemory(len(engines), total, max(sizes.values(), default=0))


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


def check_fleet_memory(source: str, engines: Sequence[EngineDescription], available: int | None = None) -> FleetMemory:
    """The estimate, or a ``ConfigError`` when it does not fit (see the module docstring);
    ``available`` overrides the machine's (tests)."""
    est = estimate_fleet(engines)
    avail = available if available is not None else available_bytes()
    if avail is not None and est.total_bytes > USABLE_FRACTION * avail:
        raise ConfigError(
            f"{source}: cluster.replicas: a fleet of {est.num_replicas:,} replicas needs about {gib(est.total_bytes)} "
            f"of memory (up to {est.largest_replica_bytes / (1 << 20):,.1f} MiB per replica, mostly its KV-block "
            f"bookkeeping), but this machine has {gib(avail)} available; use fewer replicas or fewer "
            f"engine.num_gpu_blocks"
        )
    return est
