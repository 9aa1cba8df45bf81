"""The optional observer of the prefix cache: what a miss attribution needs to see of the pool and
the allocations, and nothing else (mirrors nothing in vLLM; its closest relative is the KV-event
stream of ``vllm/distributed/kv_events.py``, which carries neither the request an eviction was
made for nor the allocation it happened in).

A :class:`CacheObserver` is set on a pool (``BlockPool.observer``, default None) and told, in the
order the operations happen:

* ``on_allocate(request, num_new_computed_tokens)`` -- by a coordinator's ``allocate_slots`` once
  its capacity checks have passed, before any block is touched, popped or cached (so the
  allocation will succeed and the cache is still as the request's lookup saw it); for a WAITING or
  PREEMPTED request this is its admission;
* ``on_allocate_new_blocks(request_id)`` -- by ``allocate_new_blocks`` (the unchecked allocation of
  the decode fast-forward and of the grouped coordinators), before it pops;
* ``on_cache(request, blocks, start, end, group_id)`` -- by ``BlockPool.cache_full_blocks`` after
  ``blocks[start:end]`` got their keys (masked and null blocks among them stay uncached);
* ``on_evict(blocks, reason)`` -- by the pool whenever cached blocks are about to lose their keys
  (each block still holds its ``block_hash``; blocks without one in the sequence are to be
  ignored): :data:`EVICT_REUSED` (handed out again by ``get_new_blocks``, one call per call),
  :data:`EVICT_EXPLICIT` (``evict_blocks``) or :data:`EVICT_RESET` (``reset_prefix_cache``).

**The pool interface a miss attribution needs** (any pool implementation -- the Python
:class:`~sim.core.block_pool.BlockPool` or a compiled one -- must provide it): a writable
``observer`` attribute read on every call below (None = no call, no cost beyond that check); the
``on_cache`` call at the end of every ``cache_full_blocks`` that cached something; ``on_evict``
with the blocks whose keys are dropped, *before* they are dropped, from ``get_new_blocks`` (the
popped blocks), ``evict_blocks`` and ``reset_prefix_cache``; and the queries
``cached_block_hash_to_block.get_one_block(key)`` (the first block cached under a key, or None) and
``cached_block_hash_to_block.keys()`` (a live set-like view of the cached keys).

Invariants: an observer only reads; it never changes a block, a queue or a request, so a run with
an observer makes exactly the decisions of one without (a test compares every table). Imports
nothing at run time (``Request`` and ``KVCacheBlock`` for types only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.kv_cache_block import KVCacheBlock
    from sim.core.request import Request

EVICT_REUSED = "reused"
"""The block was handed out again by ``get_new_blocks`` (LRU reuse of a free cached block)."""
EVICT_EXPLICIT = "evict_blocks"
"""The block's key was dropped by ``BlockPool.evict_blocks``."""
EVICT_RESET = "reset"
"""Every key was dropped by ``reset_prefix_cache``."""


class CacheObserver(Protocol):
    """Told about allocations, caching and evictions (see the module docstring); changes nothing."""

    def on_allocate(self, request: Request, num_new_computed_tokens: int) -> None:
        """An ``allocate_slots`` that will succeed, before it changes anything."""

    def on_allocate_new_blocks(self, request_id: str) -> None:
        """An ``allocate_new_blocks`` for ``request_id``, before it pops."""

    def on_cache(self, request: Request, blocks: Sequence[KVCacheBlock], start: int, end: int, group_id: int) -> None:
        """``blocks[start:end]`` of ``request`` were cached in group ``group_id`` (null and masked
        blocks among them excepted)."""

    def on_evict(self, blocks: Sequence[KVCacheBlock], reason: str) -> None:
        """The cached ``blocks`` (those with a ``block_hash``) are about to lose their keys."""
