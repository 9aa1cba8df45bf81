"""KV-cache group specs, block-size resolution and the coarse hash view (mirrors ``KVCacheSpec`` /
``SlidingWindowSpec`` of vLLM 0.25.1's ``vllm/v1/kv_cache_interface.py`` and
``resolve_kv_cache_block_sizes`` / ``BlockHashListWithBlockSize`` of ``vllm/v1/core/kv_cache_utils.py``).

Invariants:

* **Block sizes.** One group: scheduler block size = hash block size = the group's size. Several
  groups: scheduler block size = LCM of the group sizes; hash block size = the override or the
  GCD (every group size must be a multiple of it); with prefix caching off it falls back to the
  scheduler block size.
* **Coarse view.** A group of size ``k * hash_block_size`` reads hash ``j*k + k - 1`` for its block
  ``j`` (:class:`BlockHashView`): fine hashes are chained, so that one names the whole prefix.
* **Spec groups.** Groups with equal ``spec_key`` are looked up jointly; with prefix caching on,
  several groups need at least two distinct specs (``check_groups``).

Pure functions and frozen values: no state. Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Literal, overload

from sim.core.hashing import BlockHash

KVGroupKind = Literal["full", "sliding_window"]
KV_GROUP_KINDS: tuple[str, ...] = ("full", "sliding_window")

_EVENT_KIND = {"full": "full_attention", "sliding_window": "sliding_window"}  # vLLM KVCacheSpecKind


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints (vLLM's ``cdiv``)."""
    return -(-a // b)


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

    @property
    def event_kind(self) -> str:
        """The ``kv_cache_spec_kind`` of this group's ``BlockStored`` events (vLLM ``KVCacheSpecKind``)."""
        return _EVENT_KIND[self.kind]

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int | None:
        """vLLM's recycling-aware admission cap (SWA only; None = no cap)."""
        if self.sliding_window is None:
            return None
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


class BlockHashView(Sequence[BlockHash]):
    """A request's fine hash list (``hash_block_size``) seen at a k-times coarser block size:
    coarse block ``j`` is fine hash ``j*k + k - 1`` (vLLM's ``BlockHashListWithBlockSize``).
    A live view: it grows with the underlying list."""

    __slots__ = ("_hashes", "_k")

    def __init__(self, hashes: Sequence[BlockHash], hash_block_size: int, block_size: int) -> None:
        if block_size % hash_block_size:
            raise ValueError(f"block size {block_size} is not a multiple of hash block size {hash_block_size}")
        self._hashes = hashes
        self._k = block_size // hash_block_size

    def __len__(self) -> int:
        return len(self._hashes) // self._k

    @overload
    def __getitem__(self, j: int) -> BlockHash: ...

    @overload
    def __getitem__(self, j: slice) -> list[BlockHash]: ...

    def __getitem__(self, j: int | slice) -> BlockHash | list[BlockHash]:
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        n = len(self)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(j)
        return self._hashes[j * self._k + self._k - 1]

    def __iter__(self) -> Iterator[BlockHash]:
        k = self._k
        return islice(self._hashes, k - 1, len(self) * k, k)


def hash_view(hashes: Sequence[BlockHash], hash_block_size: int, block_size: int) -> Sequence[BlockHash]:
    """The hash list at ``block_size`` (the list itself when the sizes agree)."""
    return hashes if block_size == hash_block_size else BlockHashView(hashes, hash_block_size, block_size)
