"""The CPU tier's KV events (mirrors vLLM 0.33.0's ``OffloadingEventsTracker``,
``distributed/kv_transfer/kv_connector/v1/offloading/events.py``, over the raw event stream of
``CPUOffloadingManager`` in ``v1/kv_offload/cpu/manager.py``).

The manager knows a chunk only by its offload key (the hash of the chunk's last GPU block), so
its raw events are ``(removed, keys)`` pairs, appended in the order things happen:

* ``prepare_store`` appends ``(True, evicted keys)`` when it evicted to make room, before the new
  chunks are inserted;
* ``complete_store`` appends ``(False, keys)`` for the chunks that became ready (the order of the
  job's keys); a failed store would append a removal vLLM never publishes (not modelled: the
  simulated link never fails).

The tracker turns them into ``BlockStored`` / ``BlockRemoved`` with ``medium="CPU"``, the way vLLM
publishes them with KV events on (``--kv-events-config``):

* by default (vLLM's *legacy placeholder*): one ``BlockStored`` **per stored chunk** carrying only
  the offload key's hash (``block_hashes=[key]``, no parent, ``token_ids=[]``, ``block_size=0``,
  no LoRA, ``group_idx`` 0, no cache-spec kind); one ``BlockRemoved`` per eviction batch with the
  evicted keys' hashes;
* with ``self_describing`` (vLLM's opt-in ``kv_connector_extra_config["self_describing_kv_events"]``,
  ``OffloadConfig.self_describing_kv_events`` here): the connector snapshots each chunk's payload
  when it offers the store (``record_store``) or a lookup counts it as a hit (``record_lookup``),
  and a ``BlockStored`` carries the chunk's ``blocks_per_chunk`` GPU block hashes, the parent (the
  hash before the chunk), the chunk's tokens, the **GPU** block size, the LoRA, ``group_idx`` 0
  and ``"full_attention"``; an eviction fans out to the same hashes. A snapshot lives until a
  removal leaves its chunk not resident (vLLM's ``active_residencies``; only the CPU tier here),
  checked once the whole batch is translated -- so a key evicted and stored again within one batch
  loses its snapshot and its later ``BlockStored`` is a placeholder, as in vLLM.

Hashes are vLLM's event form (:func:`sim.core.hashing.external_block_hash`). Cost: nothing unless
the engine's KV events are on (``OffloadTier`` creates the tracker then); O(keys) per batch.
Imports nothing from the project beyond ``sim.core`` leaves and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.core.hashing import external_block_hash
from sim.core.kv_events import MEDIUM_CPU, BlockRemoved, BlockStored, KVCacheEvent
from sim.core.offload.policy import OffloadKey
from sim.core.offload.request_state import RequestOffloadState

RawOffloadEvent = tuple[bool, list[OffloadKey]]
"""``(removed, keys)``: vLLM's ``OffloadingEvent`` of the CPU medium (primary tier, no locality)."""

FULL_ATTENTION = "full_attention"


@dataclass(slots=True)
class ChunkPayload:
    """One chunk's ``BlockStored`` payload, snapshotted while its request was at hand (vLLM
    ``_OffloadEventMetadata``)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: Sequence[int]
    lora_id: int | None
    lora_name: str | None
    resident: bool = True  # vLLM: the primary tier in active_residencies


class OffloadingEventsTracker:
    """Raw manager events -> KV events (see the module docstring). Methods change state."""

    __slots__ = ("block_size", "blocks_per_chunk", "self_describing", "payloads", "medium")

    def __init__(self, block_size: int, blocks_per_chunk: int, self_describing: bool,
                 medium: str = MEDIUM_CPU) -> None:
        self.block_size = block_size
        self.blocks_per_chunk = blocks_per_chunk
        self.self_describing = self_describing
        self.payloads: dict[OffloadKey, ChunkPayload] = {}
        self.medium = medium  # the events' medium: "CPU", or a fleet's shared store's (sim.cluster.kv_store)

    def _payload(self, st: RequestOffloadState, chunk_idx: int) -> ChunkPayload:
        req = st.req
        bpc, bs = self.blocks_per_chunk, self.block_size
        first = chunk_idx * bpc
        hashes = req.block_hashes[first : first + bpc]
        return ChunkPayload(
            [external_block_hash(h) for h in hashes],
            external_block_hash(req.block_hashes[first - 1]) if first else None,
            req.token_span(first * bs, (first + bpc) * bs),
            req.lora_int_id if req.lora_name is not None else None,
            req.lora_name,
        )

    def record_store(self, st: RequestOffloadState, start: int, offered: Sequence[OffloadKey],
                     stored: Sequence[OffloadKey]) -> None:
        """``prepare_store`` allocated ``stored`` out of the chunks ``offered`` from chunk ``start``
        on: snapshot each stored chunk (vLLM ``record_store`` in ``_build_store_jobs``)."""
        if not self.self_describing:
            return
        to_store = set(stored)
        for idx, key in enumerate(offered, start):
            if key in to_store:
                self.payloads[key] = self._payload(st, idx)

    def record_lookup(self, st: RequestOffloadState, start: int, keys: Sequence[OffloadKey]) -> None:
        """A lookup counted ``keys`` (chunks ``start ..``) as resident: snapshot the ones not yet
        known and mark them resident (vLLM ``record_lookup`` in the hit-counting loop)."""
        if not self.self_describing:
            return
        payloads = self.payloads
        for idx, key in enumerate(keys, start):
            p = payloads.get(key)
            if p is None:
                payloads[key] = self._payload(st, idx)
            else:
                p.resident = True

    def take_events(self, raw: list[RawOffloadEvent]) -> list[KVCacheEvent]:
        """Translate one drained batch of manager events, in order (vLLM ``take_events``)."""
        out: list[KVCacheEvent] = []
        payloads = self.payloads
        removed_keys: list[OffloadKey] = []
        for removed, keys in raw:
            if removed:
                hashes: list[int] = []
                for key in keys:
                    p = payloads.get(key)
                    if p is None:
                        hashes.append(external_block_hash(key))
                    else:
                        hashes.extend(p.block_hashes)
                        p.resident = False
                if self.self_describing:
                    removed_keys.extend(keys)
                out.append(BlockRemoved(block_hashes=hashes, medium=self.medium, group_idx=0))
                continue
            for key in keys:
                p = payloads.get(key)
                out.append(self._placeholder(key) if p is None else BlockStored(
                    block_hashes=list(p.block_hashes),
                    parent_block_hash=p.parent_block_hash,
                    token_ids=p.token_ids,
                    block_size=self.block_size,
                    lora_id=p.lora_id,
                    medium=self.medium,
                    lora_name=p.lora_name,
                    group_idx=0,
                    kv_cache_spec_kind=FULL_ATTENTION,
                ))
        # a removal may precede a store of the same key in this batch: drop snapshots only now
        for key in removed_keys:
            p = payloads.get(key)
            if p is not None and not p.resident:
                del payloads[key]
        return out

    def _placeholder(self, key: OffloadKey) -> BlockStored:
        """vLLM ``_placeholder_stored``: the key's hash only; the cache-spec kind is part of the
        self-describing contract alone."""
        return BlockStored(
            block_hashes=[external_block_hash(key)],
            parent_block_hash=None,
            token_ids=[],
            block_size=0,
            lora_id=None,
            medium=self.medium,
            lora_name=None,
            group_idx=0,
            kv_cache_spec_kind=FULL_ATTENTION if self.self_describing else None,
        )
