"""KV-cache group specs and the per-group ("single-type") managers for full attention and sliding
window attention (mirrors vLLM 0.25.1's ``vllm/v1/core/single_type_kv_cache_manager.py``
``FullAttentionManager`` / ``SlidingWindowManager``, ``SlidingWindowSpec`` of
``vllm/v1/kv_cache_interface.py`` and ``BlockHashListWithBlockSize`` /
``resolve_kv_cache_block_sizes`` of ``vllm/v1/core/kv_cache_utils.py``).

Used by :class:`sim.core.hybrid_kv_cache_manager.HybridKVCacheManager`; the single full-attention
case keeps using the optimised :class:`sim.core.kv_cache_manager.KVCacheManager`.

Behaviour mirrored exactly:

* **Block sizes.** One group: scheduler block size = hash block size = the group's size. Several
  groups: scheduler block size = LCM of the group sizes; hash block size = the override or the
  GCD (every group size must be a multiple of it); with prefix caching off it falls back to the
  scheduler block size. A group of size ``k * hash_block_size`` reads hash ``j*k + k - 1`` for its
  block ``j`` (:class:`BlockHashView`): fine hashes are chained, so that one names the prefix.
* **Full attention** hits: left to right, stop at the first miss in any group of the spec group,
  drop the last block for EAGLE, pop until the hit is a multiple of the alignment.
* **Sliding window** hits: a hit needs only the ``cdiv(w - 1, bs)`` blocks (+1 with EAGLE) before
  the boundary; scan right to left from ``max_length // bs - 1``, counting consecutive cached
  blocks (a miss resets the count; with coarser alignment a run may only *start* on a block whose
  boundary, after the EAGLE pop, is aligned); a complete run is returned with null blocks in front
  of it; without one the leading run from block 0 is the hit (then aligned); finally the EAGLE pop
  and a re-alignment.
* **Skipped blocks** (SWA): ``max(0, computed - w + 1)`` tokens are outside the window; their
  whole blocks are replaced by the null block and freed (tail first, one ``free_blocks`` call;
  hashed ones stay cached at the free-queue tail). Hits that fall in the skipped prefix are not
  touched: the request's list gets null blocks there instead.
* **Blocks to allocate**: a running request (one with a ``num_cached_block`` entry) needs
  ``max(required - held, 0)``; otherwise ``max(required - max(skipped, hits + held), 0)`` plus its
  non-skipped hits that are free (``ref_cnt == 0``, not null). The full-sequence admission gate caps
  ``required`` of an SWA group at ``max_admission_blocks_per_request =
  cdiv(min(w - 1 + max_num_batched_tokens, max_model_len), bs) + 1``.
* **Caching** skips null blocks and, for SWA, blocks that can never serve a hit at an aligned
  boundary (``reachable_block_mask``: with alignment ``A`` and ``need`` contiguous blocks per hit
  only the last ``need`` blocks of each ``A``-token segment, shifted one block right with EAGLE;
  everything when ``need >= A / bs``; ``retention_interval`` mirrors
  ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``). ``num_cached_block`` still advances over skipped ones.

Invariants: a request's SWA list is ``[null] * skipped + real blocks``; full-attention lists never
hold the null block; ``num_cached_block[r] <= len(req_to_blocks[r])``.

This module imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Literal

from sim.core.block_pool import BlockPool, KVCacheBlock
from sim.core.hashing import BlockHash
from sim.core.kv_cache_manager import cdiv

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.request import Request

KVGroupKind = Literal["full", "sliding_window"]
KV_GROUP_KINDS: tuple[str, ...] = ("full", "sliding_window")

_EVENT_KIND = {"full": "full_attention", "sliding_window": "sliding_window"}  # vLLM KVCacheSpecKind


@dataclass(frozen=True, slots=True)
class KVGroupSpec:
    """One KV-cache group: its attention kind, block size and (SWA) window, in tokens.

    Groups with equal ``(kind, block_size, sliding_window)`` are one vLLM "spec group" (looked up
    jointly). ``is_eagle_group`` marks groups holding EAGLE/MTP draft layers (vLLM's
    ``KVCacheGroupSpec.is_eagle_group``); with ``use_eagle`` and no group marked, every group is.
    """

    kind: KVGroupKind = "full"
    block_size: int = 16
    sliding_window: int | None = None
    is_eagle_group: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KV_GROUP_KINDS:
            raise ValueError(f"unknown KV-cache group kind {self.kind!r}; choose one of {KV_GROUP_KINDS}")
        if self.block_size <= 0:
            raise ValueError(f"KV-cache group block_size must be positive, got {self.block_size}")
        if self.kind == "sliding_window":
            if self.sliding_window is None or self.sliding_window <= 0:
                raise ValueError(f"a sliding_window group needs sliding_window > 0, got {self.sliding_window}")
        elif self.sliding_window is not None:
            raise ValueError("a full-attention group takes no sliding_window")

    @property
    def spec_key(self) -> tuple[str, int, int | None]:
        """What makes two groups' specs equal (the EAGLE flag is a group property, not a spec one)."""
        return (self.kind, self.block_size, self.sliding_window)

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int | None:
        """vLLM's recycling-aware admission cap (SWA only; None = no cap)."""
        if self.kind != "sliding_window":
            return None
        assert self.sliding_window is not None
        return cdiv(min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len), self.block_size) + 1


def blocks_for_one_sequence(groups: Sequence[KVGroupSpec], max_num_batched_tokens: int, max_model_len: int) -> int:
    """Pool blocks the full-sequence gate asks of one ``max_model_len`` request, over all groups
    (SWA groups at their admission cap): what a pool must hold for such a request to be admitted."""
    n = 0
    for g in groups:
        blocks = cdiv(max_model_len, g.block_size)
        cap = g.max_admission_blocks_per_request(max_num_batched_tokens, max_model_len)
        n += blocks if cap is None else min(blocks, cap)
    return n


def resolve_block_sizes(
    groups: Sequence[KVGroupSpec], enable_caching: bool = True, hash_block_size: int | None = None
) -> tuple[int, int]:
    """``(scheduler_block_size, hash_block_size)`` as vLLM's ``resolve_kv_cache_block_sizes``."""
    if not groups:
        raise ValueError("at least one KV-cache group is required")
    sizes = [g.block_size for g in groups]
    if len(groups) == 1:
        return sizes[0], sizes[0]
    sched_bs = math.lcm(*sizes)
    if not enable_caching:
        return sched_bs, sched_bs
    hbs = hash_block_size if hash_block_size is not None else math.gcd(*sizes)
    if hbs <= 0 or any(s % hbs for s in sizes):
        raise ValueError(
            f"invalid hash_block_size={hbs}: every KV-cache group block size {sizes} must be divisible by it"
        )
    return sched_bs, hbs


def check_groups(
    groups: Sequence[KVGroupSpec], enable_caching: bool = True, hash_block_size: int | None = None
) -> tuple[int, int]:
    """Validate a group list as vLLM would accept it; returns ``resolve_block_sizes``. With prefix
    caching on, several groups need at least two distinct specs (a uniform model is one group)."""
    sizes = resolve_block_sizes(groups, enable_caching, hash_block_size)
    if enable_caching and len(groups) > 1 and len({g.spec_key for g in groups}) < 2:
        raise ValueError(
            "several KV-cache groups with one identical spec: vLLM builds a single group for a "
            "uniform model (and its hybrid coordinator needs two different specs)"
        )
    return sizes


class BlockHashView:
    """A request's fine hash list (``hash_block_size``) seen at a k-times coarser block size:
    coarse block ``j`` is fine hash ``j*k + k - 1`` (vLLM's ``BlockHashListWithBlockSize``)."""

    __slots__ = ("_hashes", "_k")

    def __init__(self, hashes: Sequence[BlockHash], hash_block_size: int, block_size: int) -> None:
        if block_size % hash_block_size:
            raise ValueError(f"block size {block_size} is not a multiple of hash block size {hash_block_size}")
        self._hashes = hashes
        self._k = block_size // hash_block_size

    def __len__(self) -> int:
        return len(self._hashes) // self._k

    def __getitem__(self, j: int) -> BlockHash:
        if j < 0:
            j += len(self)
        if not 0 <= j < len(self):
            raise IndexError(j)
        return self._hashes[j * self._k + self._k - 1]

    def __iter__(self) -> Iterator[BlockHash]:
        k = self._k
        return islice(self._hashes, k - 1, len(self) * k, k)


def hash_view(hashes: Sequence[BlockHash], hash_block_size: int, block_size: int) -> Sequence[BlockHash]:
    """The hash list at ``block_size`` (the list itself when the sizes agree)."""
    return hashes if block_size == hash_block_size else BlockHashView(hashes, hash_block_size, block_size)


def _contiguous_blocks_for_hit(sliding_window: int, block_size: int, use_eagle: bool) -> int:
    return cdiv(sliding_window - 1, block_size) + (1 if use_eagle else 0)


def _trim_to_alignment(computed: tuple[list[KVCacheBlock], ...], block_size: int, alignment: int) -> None:
    if block_size == alignment:
        return
    while len(computed[0]) * block_size % alignment:
        for c in computed:
            c.pop()


class SingleTypeManager:
    """Per-group request -> block bookkeeping on a shared :class:`BlockPool` (full attention)."""

    kind: str = "full"

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
        self.block_size = spec.block_size
        self.pool = pool
        self.group_id = group_id
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.enable_caching = enable_caching
        self.max_admission_blocks = max_admission_blocks
        self.use_eagle = False  # set by the coordinator logic (EAGLE groups match one block further)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}

    # -- lookup (classmethods: no per-request state) --------------------------------------------
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
        bs = spec.block_size
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in group_ids)
        for h in islice(block_hashes, max_length // bs):
            cached = pool.get_cached_block(h, group_ids)
            if cached is None:
                break  # chained hashes: nothing after a miss can be cached for this prefix
            for c, b in zip(computed, cached):
                c.append(b)
        if drop_eagle_block and computed[0]:
            for c in computed:
                c.pop()
        _trim_to_alignment(computed, bs, alignment_tokens)
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
        """Which of ``blocks[start:end]`` can ever serve a hit (None: all of them)."""
        return None

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
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
            spec_kind=_EVENT_KIND[self.spec.kind],
            sliding_window=self.spec.sliding_window,
        )
        self.num_cached_block[rid] = num_full

    def free(self, request_id: str) -> None:
        """Release the request's blocks in this group, last block first."""
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if blocks:
            self.pool.free_blocks(reversed(blocks))


class FullAttentionManager(SingleTypeManager):
    kind = "full"


class SlidingWindowManager(SingleTypeManager):
    kind = "sliding_window"

    def __init__(self, spec: KVGroupSpec, pool: BlockPool, group_id: int, **kwargs) -> None:  # type: ignore[no-untyped-def]
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
            _trim_to_alignment(computed, bs, alignment_tokens)
        if drop_eagle_block and computed[0]:
            for c in computed:
                c.pop()
            _trim_to_alignment(computed, bs, alignment_tokens)
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
        return max(0, num_computed_tokens - self.sliding_window + 1)


MANAGER_CLASSES: dict[str, type[SingleTypeManager]] = {
    "full": FullAttentionManager,
    "sliding_window": SlidingWindowManager,
}


