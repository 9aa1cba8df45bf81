"""One engine step's plan, as the scheduler hands it to an executor (mirrors ``SchedulerOutput`` of
vLLM 0.25.1's ``vllm/v1/core/sched/output.py``, reduced to what prefix caching and timing need).

Invariants: ``scheduled`` is in vLLM's ``num_scheduled_tokens`` order (running requests, then
admissions); ``total_num_scheduled_tokens`` is the sum of their ``num_new_tokens``; an admitted
request's ``new_blocks`` are all its blocks (hits included), a running one's only the new ones;
``kv_connector_metadata`` is None exactly when the scheduler has no offload connector.
Imports neither simpy nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.core.kv_cache_block import KVCacheBlock
from sim.core.request import Request
from sim.core.transfer_job import KVConnectorMetadata


@dataclass(slots=True)
class ScheduledRequest:
    """What one request does in a step: ``num_new_tokens`` tokens after ``num_computed_before``."""

    request: Request
    num_new_tokens: int
    num_computed_before: int
    new_blocks: list[KVCacheBlock]  # admitted: all its blocks (hits included); running: new ones
    admitted: bool = False  # moved from waiting to running in this step
    hit_tokens: int = 0  # prefix-cache hit granted at this admission (the GPU hit)
    external_hit_tokens: int = 0  # CPU-tier hit (offload connector) loaded for this admission
    samples: bool = False  # this step completes the prefill, so the model samples a token

    @property
    def new_block_ids(self) -> list[int]:
        """vLLM's ``req_to_new_blocks`` ids: what a model runner appends to its block table."""
        return [b.block_id for b in self.new_blocks]


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan, in vLLM's ``num_scheduled_tokens`` order (running, then admissions)."""

    step: int
    scheduled: list[ScheduledRequest]
    preempted: list[Request]
    finished_req_ids: set[str]
    total_num_scheduled_tokens: int
    shape: Any = None  # the step's StepShape, memoised by sim.core.executor.step_shape
    # the offload connector's loads, stores and flushes of this step (None: no connector)
    kv_connector_metadata: KVConnectorMetadata | None = None

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {s.request.request_id: s.num_new_tokens for s in self.scheduled}

    def is_empty(self) -> bool:
        return not self.scheduled
