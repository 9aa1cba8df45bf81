"""Full-attention hit search for the per-group managers (mirrors ``FullAttentionManager`` of vLLM
0.25.1's ``vllm/v1/core/single_type_kv_cache_manager.py``).

Behaviour mirrored exactly: scan left to right, stop at the first block missing in any group of
the spec group (chained hashes: nothing after a miss can be cached for this prefix), drop the last
block for EAGLE, then pop until the hit is a multiple of the alignment. Every cached block can serve
a hit (no mask), no token is ever skipped. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from sim.core.block_pool import BlockPool
from sim.core.hashing import BlockHash
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_spec import KVGroupSpec
from sim.core.single_type_kv_cache_manager import SingleTypeKVCacheManager, trim_to_alignment


class FullAttentionManager(SingleTypeKVCacheManager):
    """A full-attention group: the base bookkeeping plus the left-to-right hit search."""

    @classmethod
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
        """Query: the leading cached run of at most ``max_length`` tokens (see module docstring)."""
        bs = spec.block_size
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in group_ids)
        for h in islice(block_hashes, max_length // bs):
            cached = pool.get_cached_block(h, group_ids)
            if cached is None:
                break
            for c, b in zip(computed, cached):
                c.append(b)
        if drop_eagle_block and computed[0]:
            for c in computed:
                c.pop()
        trim_to_alignment(computed, bs, alignment_tokens)
        return computed
