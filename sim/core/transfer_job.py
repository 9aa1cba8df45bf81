"""What crosses between a KV connector's scheduler side and its worker (mirrors vLLM 0.33.0's
``TransferJob`` / ``OffloadingConnectorMetadata`` of ``distributed/kv_transfer/kv_connector/v1/
offloading/common.py`` and the ``KVConnectorOutput`` of ``vllm/v1/outputs.py``, reduced to what
scheduling and transfer timing need).

Invariants: job ids are unique per connector and increase in creation order (loads and stores share
one counter, ``OffloadingConnectorScheduler._generate_job_id``); a load job's ``num_blocks`` is the
GPU blocks it writes, a store job's the GPU blocks it reads (chunks * blocks_per_chunk); a job is
reported complete once, in ``KVConnectorOutput.completed_jobs``. A leaf of ``sim.core`` (the scheduler
output carries the metadata; ``sim.core.offload.transfer`` re-exports these names). Imports nothing
from the project.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class TransferJob:
    """One GPU<->CPU copy: ``kind`` "load" (CPU -> GPU) or "store" (GPU -> CPU) of ``num_blocks``
    GPU blocks for ``request_id``; ``flush`` marks a job the worker must finish before the forward
    pass of the step that flushes it (vLLM's ``jobs_to_flush``, ``OffloadingWorker.handle_preemptions``)."""

    job_id: int
    request_id: str
    kind: Literal["load", "store"]
    num_blocks: int
    flush: bool = False


@dataclass(slots=True)
class KVConnectorMetadata:
    """One step's connector plan (``OffloadingConnectorMetadata``): the loads and stores created in
    this ``schedule()`` (ids increasing) and the ids of earlier jobs to flush before the forward pass."""

    load_jobs: list[TransferJob] = field(default_factory=list)
    store_jobs: list[TransferJob] = field(default_factory=list)
    jobs_to_flush: set[int] = field(default_factory=set)

    def is_empty(self) -> bool:
        """Query: no job created and none flushed."""
        return not self.load_jobs and not self.store_jobs and not self.jobs_to_flush


@dataclass(slots=True)
class KVConnectorOutput:
    """What the worker reports after a step (vLLM's ``KVConnectorOutput``): requests whose load
    finished (``finished_recving``) and the ids of every job that completed
    (``kv_connector_worker_meta.completed_jobs``; loads and stores)."""

    finished_recving: set[str] = field(default_factory=set)
    completed_jobs: set[int] = field(default_factory=set)

    def is_empty(self) -> bool:
        """Query: nothing reported."""
        return not self.finished_recving and not self.completed_jobs
