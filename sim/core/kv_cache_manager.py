"""KVCacheManager for one full-attention KV-cache group (mirrors vLLM 0.25.1's
``vllm/v1/core/kv_cache_manager.py`` with its ``UnitaryKVCacheCoordinator`` and
``FullAttentionManager``).

Behaviour mirrored exactly:

* ``get_computed_blocks``: longest contiguous run of cached block hashes, capped at
  ``num_tokens - 1`` tokens (so a fully cached prompt of k full blocks hits k-1 of them), minus
  the last block when EAGLE is on; skipped (no stats) when caching is off or the request skips
  reading the prefix cache (``prompt_logprobs``); every lookup is recorded in
  ``PrefixCacheStats`` in *tokens*, with ``queries = num_tokens``, resumed requests counted apart.
  Hits are returned untouched: no reference is taken until ``allocate_slots``.
* ``allocate_slots``: the watermark applies only to WAITING/PREEMPTED requests while something is
  running; the full-sequence admission gate (``scheduler_reserve_full_isl``) checks the whole
  current sequence; a hit block with ``ref_cnt == 0`` costs one free block (touching removes it
  from the free queue); on None nothing was touched, allocated or cached. Otherwise hits are
  touched first, then new blocks are popped, then newly full blocks are cached up to
  ``min(computed + new, request.num_tokens)`` tokens -- at schedule time, before compute.
* ``free``: a request's blocks are freed in reverse order.

This module imports neither simpy nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from sim.core.block_pool import BlockPool, KVCacheBlock
from sim.core.kv_events import EventSink
from sim.core.request import Request, RequestStatus


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class PrefixCacheStats:
    """vLLM's ``PrefixCacheStats``: per-lookup token counts, drained by the scheduler each step."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    def add(self, other: PrefixCacheStats) -> None:
        self.requests += other.requests
        self.queries += other.queries
        self.hits += other.hits
        self.preempted_requests += other.preempted_requests
        self.preempted_queries += other.preempted_queries
        self.preempted_hits += other.preempted_hits
        self.reset |= other.reset


_NO_BLOCKS: tuple[KVCacheBlock, ...] = ()


class PrefixCacheAccounting:
    """What every KV cache manager shares: its pool's reset and the per-step stats it records.

    Subclasses set ``block_pool`` and ``prefix_cache_stats`` (None when stats are off).
    """

    block_pool: BlockPool
    prefix_cache_stats: PrefixCacheStats | None

    def reset_prefix_cache(self) -> bool:
        """vLLM's reset: only with no block in use; flags the stats as reset."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Take the stats gathered since the last call (vLLM drains them every step)."""
        if self.prefix_cache_stats is None:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()


class KVCacheManager(PrefixCacheAccounting):
    """Block bookkeeping per request on top of a :class:`BlockPool`."""

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        max_model_len: int,
        *,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = True,
        watermark: float = 0.0,
        event_sink: EventSink | None = None,
    ) -> None:
        if watermark < 0:
            raise ValueError("watermark must be non-negative")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, event_sink)
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}

    # -- lookup -------------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The cached prefix usable by ``request`` and its length in tokens (a multiple of bs)."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        get = self.block_pool.cached_block_hash_to_block._cache.get
        blocks: list[KVCacheBlock] = []
        for h in islice(request.block_hashes, max_blocks):
            b = get(h)  # BlockHashToBlockMap.get_one_block, inlined
            if b is None:
                break
            blocks.append(b if type(b) is KVCacheBlock else next(iter(b.values())))  # type: ignore[union-attr]
        if self.use_eagle and blocks:
            blocks.pop()
        num_hits = len(blocks) * self.block_size
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)
        return blocks, num_hits

    def repeat_lookup(self, request: Request, num_hits: int) -> None:
        """Record a lookup known to return ``num_hits`` again (same effect as get_computed_blocks)."""
        if self.enable_caching and not request.skip_reading_prefix_cache and self.prefix_cache_stats is not None:
            self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    # -- allocation ---------------------------------------------------------------------------
    def _num_blocks_to_allocate(self, request_id: str, num_tokens: int, hits: list[KVCacheBlock]) -> int:
        required = cdiv(num_tokens, self.block_size)
        req_blocks = self.req_to_blocks.get(request_id, _NO_BLOCKS)
        if request_id in self.num_cached_block:  # running: no new hits
            return max(required - len(req_blocks), 0)
        new = max(required - len(hits) - len(req_blocks), 0)
        evictable = 0
        for b in hits:
            if b.ref_cnt == 0 and not b.is_null:
                evictable += 1
        return new + evictable

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        has_scheduled_reqs: bool = True,
    ) -> list[KVCacheBlock] | None:
        """Reserve slots for ``num_new_tokens`` more tokens; None (and no side effect) if short."""
        if num_new_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        rid = request.request_id
        if num_new_tokens == 1 and not new_computed_blocks and not num_lookahead_tokens:
            # Hot path, same outcome as the general path below: a running request's next token
            # whose slot is already allocated and whose block does not become full needs no new
            # block (so no capacity check can fail: a running request has no watermark) and
            # caches nothing.
            req_blocks = self.req_to_blocks.get(rid)
            if req_blocks is not None and request.status == RequestStatus.RUNNING:
                n = request.num_computed_tokens + num_new_computed_tokens + 1
                if (
                    n <= len(req_blocks) * self.block_size
                    and n // self.block_size <= self.num_cached_block.get(rid, 0)
                    and n <= self.max_model_len
                ):
                    return []
        hits = new_computed_blocks or []
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local_computed, self.max_model_len)
        watermark = 0
        if has_scheduled_reqs and (
            request.status == RequestStatus.WAITING or request.status == RequestStatus.PREEMPTED
        ):
            watermark = self.watermark_blocks
        num_free = self.block_pool.free_block_queue.num_free_blocks
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self._num_blocks_to_allocate(rid, full, hits) + watermark > num_free:
                return None
        num_tokens_main = total_computed + num_new_tokens
        num_need_slot = min(num_tokens_main + num_lookahead_tokens, self.max_model_len)
        if self._num_blocks_to_allocate(rid, num_need_slot, hits) + watermark > num_free:
            return None

        req_blocks = self.req_to_blocks.get(rid)
        if req_blocks is None:
            req_blocks = self.req_to_blocks[rid] = []
        if hits:
            if rid in self.num_cached_block:
                raise AssertionError(f"{rid}: a running request cannot get new prefix hits")
            if self.enable_caching:
                self.block_pool.touch(hits)
            req_blocks.extend(hits)
            self.num_cached_block[rid] = len(req_blocks)

        num_new_blocks = cdiv(num_need_slot, self.block_size) - len(req_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        if new_blocks:
            req_blocks.extend(new_blocks)
        if self.enable_caching:
            self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's blocks that are full within its first ``num_tokens`` tokens."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[rid], num_cached, num_full, self.block_size)
        self.num_cached_block[rid] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first (its chain tail is evicted first)."""
        blocks = self.req_to_blocks.pop(request.request_id, None)
        self.num_cached_block.pop(request.request_id, None)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    # -- misc ---------------------------------------------------------------------------------
    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, _NO_BLOCKS)]

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        return self.req_to_blocks.get(request_id, [])

    def check_integrity(self) -> None:
        """Pool invariants plus: ref counts equal the number of requests holding each block."""
        self.block_pool.check_integrity()
        refs: dict[int, int] = {}
        for rid, blocks in self.req_to_blocks.items():
            assert len({b.block_id for b in blocks}) == len(blocks), f"{rid} holds a block twice"
            for b in blocks:
                refs[b.block_id] = refs.get(b.block_id, 0) + 1
            n_cached = self.num_cached_block.get(rid, 0)
            assert n_cached <= len(blocks), f"{rid}: num_cached_block {n_cached} > {len(blocks)} blocks"
            for b in blocks[:n_cached]:
                assert b.block_hash is not None, f"{rid}: block {b.block_id} counted cached but has no hash"
        for b in self.block_pool.blocks[1:]:
            assert b.ref_cnt == refs.get(b.block_id, 0), (
                f"block {b.block_id}: ref_cnt {b.ref_cnt} != holders {refs.get(b.block_id, 0)}"
            )
