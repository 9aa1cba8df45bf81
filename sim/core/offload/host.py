"""What the connector path reads and changes of its scheduler: the state of vLLM 0.33.0's
``Scheduler`` that ``OffloadTier`` and ``admission.schedule_waiting`` touch, as a Protocol, so this
package never imports ``sim.core.scheduler`` (which imports it). ``sim.core.scheduler.Scheduler``
satisfies it structurally. Imports nothing above ``sim.core``.
"""

from __future__ import annotations

from typing import Protocol

from sim.core.config import CacheConfig, SchedulerConfig
from sim.core.kv_cache_manager import KVCacheManager
from sim.core.prefill_cadence import PrefillCadence
from sim.core.request import Request
from sim.core.request_queue import RequestQueue
from sim.core.version_profile import VersionProfile


class SchedulerHost(Protocol):
    """The scheduler state the connector path uses (attributes of ``Scheduler``)."""

    config: SchedulerConfig
    cache_config: CacheConfig
    kv_cache_manager: KVCacheManager
    requests: dict[str, Request]
    waiting: RequestQueue
    running: list[Request]
    deferred_waiting: set[str]
    cadence: PrefillCadence
    profile: VersionProfile
    step_index: int  # the next schedule() call's index (KV-event sinks tag events with it)
