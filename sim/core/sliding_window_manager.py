"""Sliding-window attention for the per-group managers (mirrors ``SlidingWindowManager`` of vLLM
0.25.1's ``vllm/v1/core/single_type_kv_cache_manager.py``).

Behaviour mirrored exactly:

* **Hits**: a hit needs only the ``cdiv(w - 1, bs)`` blocks (+1 with EAGLE) before the boundary;
  scan right to left from ``max_length // bs - 1``, counting consecutive cached blocks (a miss
  resets the count; with coarser alignment a run may only *start* on a block whose boundary, after
  the EAGLE pop, is aligned); a complete run is returned with null blocks in front of it; without
  one the leading run from block 0 is the hit (then aligned); finally the EAGLE pop and a
  re-alignment.
* **Skipped tokens**: ``max(0, computed - w + 1)`` tokens are outside the window.
* **Reachable blocks** (what caching keeps): with alignment ``A`` and ``need`` contiguous blocks
  per hit only the last ``need`` blocks of each ``A``-token segment, shifted one block right with
  EAGLE; everything when ``need >= A / bs``; ``retention_interval`` mirrors
  ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` (segments of that length, plus the exact-replay
  boundary's tail).

Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.core.block_pool import BlockPool
from sim.core.hashing import BlockHash
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_spec import KVGroupSpec, cdiv
from sim.core.single_type_kv_cache_manager import SingleTypeKVCacheManager, trim_to_alignment


def _contiguous_blocks_for_hit(sliding_window: int, block_size: int, use_eagle: bool) -> int:
    return cdiv(sliding_window - 1, block_size) + (1 if use_eagle else 0)


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A sliding-window group: window-sized hits, skipped prefixes, masked caching."""

    def __init__(self, spec: KVGroupSpec, pool: BlockPool, group_id: int, **kwargs: Any) -> None:
        super().__init__(spec, pool, group_id, **kwargs)
        assert spec.sliding_window is not None
        self.sliding_window = spec.sliding_window

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
        """Query: the window run ending nearest ``max_length`` tokens (see module docstring)."""
        assert spec.sliding_window is not None
        bs = spec.block_size
        need = _contiguous_blocks_for_hit(spec.sliding_window, bs, drop_eagle_block)
        max_num_blocks = max_length // bs
        null = pool.null_block
        computed: tuple[list[KVCacheBlock], ...] = tuple([null] * max_num_blocks for _ in group_ids)
        run = 0
        found = False
        for i in range(max_num_blocks - 1, -1, -1):  # right to left
            cached = pool.get_cached_block(block_hashes[i], group_ids)
            if cached is None:
                run = 0
                continue
            if run == 0 and bs != alignment_tokens:
                # a run may only start on a block whose boundary (after the EAGLE pop) is aligned
                if ((i if drop_eagle_block else i + 1) * bs) % alignment_tokens:
                    continue
            for c, b in zip(computed, cached):
                c[i] = b
            run += 1
            if run >= need:
                for c in computed:
                    del c[i + run :]
                found = True
                break
        if not found:
            # the leading run from block 0 (possibly shorter than the window) is the hit
            for c in computed:
                del c[run:]
            trim_to_alignment(computed, bs, alignment_tokens)
        if drop_eagle_block and computed[0]:
            for c in computed:
                c.pop()
            trim_to_alignment(computed, bs, alignment_tokens)
        return computed

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
        """Query: which of ``blocks[start:end]`` can be the tail of an aligned hit (None: all)."""
        assert spec.sliding_window is not None
        bs = spec.block_size
        assert alignment_tokens % bs == 0
        need = _contiguous_blocks_for_hit(spec.sliding_window, bs, use_eagle)
        shift = 1 if use_eagle else 0  # with EAGLE the run ends on the block after the boundary
        mask = [False] * (end_block - start_block)
        segment = alignment_tokens if retention_interval is None else (retention_interval or None)
        if segment is not None:
            per_segment = segment // bs
            if need >= per_segment:
                return None  # every block can be the tail of some aligned hit
            for i in range(start_block, end_block):
                if i >= shift and (i - shift) % per_segment >= per_segment - need:
                    mask[i - start_block] = True
        if retention_interval is not None and num_prompt_tokens is not None:
            # the exact-replay boundary (hits stop at num_prompt - 1) keeps its tail
            latest = (num_prompt_tokens - 1) // alignment_tokens * alignment_tokens
            end = latest // bs + shift
            for i in range(max(start_block, end - need), min(end_block, end)):
                mask[i - start_block] = True
        return mask

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Query: ``max(0, computed - w + 1)`` tokens lie outside the window."""
        return max(0, num_computed_tokens - self.sliding_window + 1)
