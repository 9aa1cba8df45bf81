"""Per-group request -> block bookkeeping on a shared pool (mirrors ``SingleTypeKVCacheManager`` of
vLLM 0.25.1's ``vllm/v1/core/single_type_kv_cache_manager.py``); the attention-specific lookups
live in :mod:`sim.core.full_attention_manager` and :mod:`sim.core.sliding_window_manager`.

Behaviour mirrored exactly:

* **Blocks to allocate**: a running request (one with a ``num_cached_block`` entry) needs
  ``max(required - held, 0)``; otherwise ``max(required - max(skipped, hits + held), 0)`` plus its
  non-skipped hits that are free (``ref_cnt == 0``, not null). The full-sequence admission gate caps
  ``required`` of an SWA group at ``max_admission_blocks_per_request``.
* **Skipped blocks** (``get_num_skipped_tokens`` > 0, SWA): their whole blocks are replaced by the
  null block and freed (tail first, one ``free_blocks`` call; hashed ones stay cached at the
  free-queue tail). Hits that fall in the skipped prefix are not touched: the request's list gets
  null blocks there instead.
* **Caching** skips null blocks and blocks the manager's ``reachable_block_mask`` rules out;
  ``num_cached_block`` still advances over skipped ones. **Free** is last block first.

Invariants: a request's list is ``[null] * skipped + real blocks`` (no nulls for full attention);
``num_cached_block[r] <= len(req_to_blocks[r])``. Imports neither simpy nor torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sim.core.block_pool import BlockPool
from sim.core.hashing import BlockHash
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_spec import KVGroupSpec, cdiv, hash_view

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.request import Request


def trim_to_alignment(computed: tuple[list[KVCacheBlock], ...], block_size: int, alignment: int) -> None:
    """Pop blocks off every list until the hit length is a multiple of ``alignment`` tokens."""
    if block_size == alignment:
        return
    while len(computed[0]) * block_size % alignment:
        for c in computed:
            c.pop()


class SingleTypeKVCacheManager(ABC):
    """One KV-cache group's per-request blocks. Queries say so; every other method changes state."""

    def __init__(
        self,
        spec: KVGroupSpec,
        pool: BlockPool,
        group_id: int,
        *,
        scheduler_block_size: int,
        hash_block_size: int,
        enable_caching: bool = True,
        max_admission_blocks: int | None = None,
    ) -> None:
        self.spec = spec
        self.kind = spec.kind
        self.block_size = spec.block_size
        self.pool = pool
        self.group_id = group_id
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.enable_caching = enable_caching
        self.max_admission_blocks = max_admission_blocks
        self.use_eagle = False  # set by the coordinator (EAGLE groups match one block further)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}

    # -- lookup (classmethods: no per-request state) --------------------------------------------
    @classmethod
    @abstractmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        group_ids: Sequence[int],
        pool: BlockPool,
        spec: KVGroupSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
    ) -> tuple[list[KVCacheBlock], ...]:
        """Query: the longest hit of at most ``max_length`` tokens, one list per group id (every
        group must hit a block for it to count), a multiple of ``alignment_tokens`` long."""

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int,
        spec: KVGroupSpec,
        use_eagle: bool,
        retention_interval: int | None = None,
        num_prompt_tokens: int | None = None,
    ) -> list[bool] | None:
        """Query: which of ``blocks[start:end]`` can ever serve a hit (None: all of them)."""
        return None

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Query: leading tokens outside the attention window (0: full attention)."""
        return 0

    # -- allocation -----------------------------------------------------------------------------
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """Query: free-queue blocks this group needs to hold ``num_tokens`` tokens (ref-0 hits
        count: touching them takes them off the queue)."""
        required = cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self.max_admission_blocks is not None:
            required = min(required, self.max_admission_blocks)
        n_held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:  # running: no new hits
            assert not new_computed_blocks
            return max(required - n_held, 0)
        skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        new = max(required - max(skipped_blocks, len(new_computed_blocks) + n_held), 0)
        skipped_hits = max(0, skipped_blocks - n_held)
        evictable = 0
        for b in new_computed_blocks[skipped_hits:]:
            if b.ref_cnt == 0 and not b.is_null:
                evictable += 1
        return new + evictable

    def add_local_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock], num_computed_tokens: int
    ) -> None:
        """Touch the non-skipped hits, pad the skipped prefix with null blocks, attach the hits."""
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        assert not req_blocks, f"{request_id}: hits for a request that already holds blocks"
        skipped_blocks = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        if skipped_blocks > 0:
            new_computed_blocks = new_computed_blocks[skipped_blocks:]
        if self.enable_caching:
            self.pool.touch(new_computed_blocks)
        else:
            assert not new_computed_blocks, "hits without prefix caching"
        if skipped_blocks > 0:
            req_blocks.extend([self.pool.null_block] * skipped_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Pop the blocks needed to hold ``num_tokens`` tokens (no capacity check); the new ones."""
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        n = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if n <= 0:
            return []
        new_blocks = self.pool.get_new_blocks(n)
        req_blocks.extend(new_blocks)
        return new_blocks

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Replace blocks wholly outside the attention window by the null block and free them."""
        num_skipped = self.get_num_skipped_tokens(total_computed_tokens)
        if num_skipped <= 0:
            return
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            # vLLM's defaultdict gets an empty entry here for a request without blocks; harmless
            # (every reader treats a missing and an empty entry alike), so none is created.
            return
        last = min(num_skipped // self.block_size, len(blocks))
        null = self.pool.null_block
        freed: list[KVCacheBlock] = []
        for i in range(last - 1, -1, -1):  # backwards: stop at the nulls of an earlier call
            if blocks[i] is null:
                break
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.pool.free_blocks(freed)

    # -- caching / freeing ----------------------------------------------------------------------
    def cache_blocks(self, request: Request, num_tokens: int, retention_interval: int | None = None) -> None:
        """Cache the request's blocks that are full within its first ``num_tokens`` tokens."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        mask = self.reachable_block_mask(
            num_cached,
            num_full,
            self.scheduler_block_size,
            self.spec,
            self.use_eagle,
            retention_interval,
            request.num_prompt_tokens,
        )
        self.pool.cache_full_blocks(
            request,
            self.req_to_blocks[rid],
            num_cached,
            num_full,
            self.block_size,
            self.group_id,
            block_hashes=hash_view(request.block_hashes, self.hash_block_size, self.block_size),
            mask=mask,
            spec_kind=self.spec.event_kind,
            sliding_window=self.spec.sliding_window,
        )
        self.num_cached_block[rid] = num_full

    def free(self, request_id: str) -> None:
        """Release the request's blocks in this group, last block first (vLLM
        ``SingleTypeKVCacheManager.free``: the chain tail is evicted before its head)."""
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if blocks:
            self.pool.free_blocks(blocks[::-1])
