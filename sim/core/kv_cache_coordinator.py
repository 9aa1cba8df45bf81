"""The coordinator interface: what :class:`sim.core.kv_cache_manager.KVCacheManager` delegates to
(mirrors the role of ``KVCacheCoordinator`` in vLLM 0.25.1's ``vllm/v1/core/kv_cache_coordinator.py``).

A coordinator owns the block pool and every request's blocks in every KV-cache group. The manager
keeps the policy that is the same for all of them (whether a lookup happens, its stats, reset);
the coordinator does the block work, the watermark check included (only its general path needs
the request's status). Implementations, chosen by
``KVCacheManager``'s factory from the model's group layout:

* :class:`~sim.core.full_attention_coordinator.UnitaryFullAttentionCoordinator`: one
  full-attention group given as a plain block size -- the optimised single-group path;
* :class:`~sim.core.grouped_kv_cache_coordinator.UnitaryKVCacheCoordinator`,
  :class:`~sim.core.hybrid_kv_cache_coordinator.HybridKVCacheCoordinator` and
  :class:`~sim.core.grouped_kv_cache_coordinator.KVCacheCoordinatorNoPrefixCache`: explicit
  groups, over one per-attention-type manager per group (the first is the fast path's oracle).

Invariants every implementation keeps: hits are returned untouched (no reference taken until
``allocate_slots``); a None from ``allocate_slots`` touched, allocated and cached nothing (the
sliding-window skip removal aside); flat block lists are every group's blocks, group 0 first.
Imports neither simpy nor torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import KeysView, Sequence

from sim.core.block_pool import BlockPool
from sim.core.hashing import BlockHash
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_spec import KVGroupSpec
from sim.core.request import Request, RequestStatus

HitBlocks = tuple[list[KVCacheBlock], ...]
"""A lookup's hit blocks, one list per group (vLLM's ``KVCacheBlocks.blocks``); ``()`` when no group
hit anything."""

NO_HITS: HitBlocks = ()

_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class KVCacheCoordinator(ABC):
    """Block bookkeeping for every KV-cache group on one :class:`BlockPool`.

    Attributes every implementation sets: ``block_pool``; ``groups`` (the group specs);
    ``block_size`` (the scheduler block size: hits and caching are aligned to it);
    ``hash_block_size`` (the block size of ``Request.block_hashes``); ``watermark_blocks``.
    """

    block_pool: BlockPool
    groups: tuple[KVGroupSpec, ...]
    block_size: int
    hash_block_size: int
    watermark_blocks: int

    def watermark_for(self, request: Request, has_scheduled_reqs: bool) -> int:
        """Query: free blocks an allocation for ``request`` must leave over -- ``watermark_blocks``
        for a WAITING or PREEMPTED request while something is running, else 0 (spec §5.1 step 3)."""
        return self.watermark_blocks if has_scheduled_reqs and request.status in _ADMITTING else 0

    # -- lookup -------------------------------------------------------------------------------
    @abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[HitBlocks, int]:
        """Lookup; changes no state: the cached prefix of at most ``max_cache_hit_length`` tokens
        and its length in tokens (a multiple of ``block_size``)."""

    # -- allocation ---------------------------------------------------------------------------
    @abstractmethod
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: HitBlocks,
        total_computed_tokens: int,
        apply_admission_cap: bool,
    ) -> int:
        """Query: free-queue blocks needed for the request to hold ``num_tokens`` tokens with these
        hits, summed over groups (free hits count; watermark not included)."""

    @abstractmethod
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: HitBlocks,
        num_lookahead_tokens: int,
        full_sequence_must_fit: bool,
        has_scheduled_reqs: bool,
    ) -> list[KVCacheBlock] | None:
        """Changes state: ``KVCacheManager.allocate_slots`` (its arguments checked)."""

    @abstractmethod
    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Changes state: pop what every group needs to hold ``num_tokens`` tokens, with no
        capacity, watermark or window check; the new blocks."""

    @abstractmethod
    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Changes state: cache the blocks that are full within the first ``num_tokens`` tokens."""

    @abstractmethod
    def free(self, request_id: str) -> None:
        """Changes state: release the request's blocks (each group last block first)."""

    # -- queries ------------------------------------------------------------------------------
    @abstractmethod
    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """Query: the request's blocks, every group, group 0 first (null blocks included)."""

    @abstractmethod
    def get_blocks_by_group(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        """Query: the request's blocks, one list per group."""

    def num_blocks_held(self, request_ids: Sequence[str]) -> list[int]:
        """Query: how many blocks of group 0 each request holds, in order (0 for none)."""
        return [len(self.get_blocks_by_group(rid)[0]) for rid in request_ids]

    def num_cached_blocks_held(self, request_ids: Sequence[str]) -> list[int]:
        """Query: how many blocks of group 0 each request has counted cached, in order (0 for none)."""
        return [self.get_num_cached_blocks(rid, 0) for rid in request_ids]

    def num_ready_decodes(self, running: Sequence[Request], start: int, limit: int, max_model_len: int) -> int:
        """Query: how many of ``running[start:start + limit]``, in order, are ready decodes (see
        ``KVCacheManager.num_ready_decodes``); 0 here: a coordinator without that fast path leaves
        every request to the scheduler's per-request path, which has the same outcome."""
        return 0

    @abstractmethod
    def get_num_cached_blocks(self, request_id: str, group_id: int) -> int:
        """Query: how many of the request's blocks in the group are counted cached."""

    @abstractmethod
    def request_ids(self) -> KeysView[str]:
        """Query: the requests holding blocks (a live view)."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Query: assert the pool's and the per-request invariants (raises AssertionError)."""
