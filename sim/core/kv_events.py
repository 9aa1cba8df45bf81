"""KV-cache events, with the fields of vLLM 0.25.1's ``vllm/distributed/kv_events.py``.

``medium`` names where the block lives, with vLLM's strings: ``"GPU"`` for the block pool's
events, ``"CPU"`` for the CPU offload tier's (``sim.core.offload.events``; vLLM 0.33.0's
``MEDIUM_CPU``). 0.33.0's ``locality`` / ``ownership`` / ``session_id`` fields stay unset for both
(the CPU manager is the primary, local tier) and are left out.

Invariants: hashes are ints, the low 64 bits of the hash bytes read big-endian, which is vLLM's
default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``); events are emitted by the block pool in the
order its operations happen. A sink is any callable taking one event. Imports nothing from the
project.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


@dataclass(slots=True)
class BlockStored:
    """One ``cache_full_blocks`` call that cached at least one block."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: Sequence[int]  # a list, or the pool's TokenSpan: equal to the list, ints made on read
    block_size: int
    lora_id: int | None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass(slots=True)
class BlockRemoved:
    """One hash key removed from the map (a duplicate of it may still be cached)."""

    block_hashes: list[int]
    medium: str | None = MEDIUM_GPU
    group_idx: int | None = None


@dataclass(slots=True)
class AllBlocksCleared:
    """A successful ``reset_prefix_cache``."""

    kind: str = field(default="AllBlocksCleared", init=False)


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
EventSink = Callable[[KVCacheEvent], None]


def event_to_dict(event: KVCacheEvent) -> dict[str, Any]:
    """A JSON-friendly record of an event, with its type under ``type``."""
    d = asdict(event)
    d.pop("kind", None)
    d["type"] = type(event).__name__
    return d
