"""The coordinator for several KV-cache groups with at least two distinct specs (mirrors
``HybridKVCacheCoordinator`` of vLLM 0.25.1's ``vllm/v1/core/kv_cache_coordinator.py``).

Behaviour mirrored exactly:

* **Spec groups.** Groups with equal specs are searched jointly (every group id must hit), full
  attention first (a stable sort); a spec group is EAGLE if any member is, and then all its
  members are.
* **Lookup**, a fixed point over the candidate length starting at ``max_cache_hit_length``: each
  spec group either keeps or shrinks it. Full attention is searched once, then only rounds down
  (it is downward-closed); an EAGLE group not yet verified at the current length searches one
  block further (capped at the max) and drops its last block; a non-EAGLE shrink clears the
  verifications. Exactly {full attention, one other spec} stops after one round. Alignment is the
  scheduler block size (the LCM); full-attention hits are truncated to the final length.
* **Caching** rounds the token count down to the scheduler block size; EAGLE groups cache one
  group block further (capped at the unrounded count).

Allocation, freeing and the integrity check are the grouped coordinator's
(:mod:`sim.core.grouped_kv_cache_coordinator`). Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sim.core.grouped_kv_cache_coordinator import GroupedKVCacheCoordinator
from sim.core.hashing import BlockHash
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_coordinator import NO_HITS, HitBlocks
from sim.core.kv_cache_spec import KVGroupSpec, hash_view
from sim.core.request import Request
from sim.core.single_type_kv_cache_manager import SingleTypeKVCacheManager


class _SpecGroup(NamedTuple):
    spec: KVGroupSpec
    group_ids: list[int]
    manager_cls: type[SingleTypeKVCacheManager]
    use_eagle: bool


class HybridKVCacheCoordinator(GroupedKVCacheCoordinator):
    """Several groups, at least two distinct specs (``check_groups``), prefix caching on."""

    def __init__(
        self, groups: Sequence[KVGroupSpec], num_gpu_blocks: int, max_model_len: int, **kwargs: Any
    ) -> None:
        super().__init__(groups, num_gpu_blocks, max_model_len, **kwargs)
        self.spec_groups: list[_SpecGroup] = []
        for gid, (g, m) in enumerate(zip(self.groups, self.single_type_managers)):
            eagle = gid in self.eagle_group_ids
            for idx, sg in enumerate(self.spec_groups):
                if sg.spec.spec_key == g.spec_key:
                    sg.group_ids.append(gid)
                    if eagle and not sg.use_eagle:
                        self.spec_groups[idx] = sg._replace(use_eagle=True)
                    break
            else:
                self.spec_groups.append(_SpecGroup(g, [gid], type(m), eagle))
        if len(self.spec_groups) < 2:
            raise ValueError("the hybrid coordinator needs KV-cache groups with at least two different specs")
        self.spec_groups.sort(key=lambda sg: sg.spec.kind != "full")  # full attention first (stable)
        for sg in self.spec_groups:
            if sg.use_eagle:
                for gid in sg.group_ids:
                    self.single_type_managers[gid].use_eagle = True
        # exactly {full attention, one other spec}: one round of the fixed point suffices
        self.simple = len(self.spec_groups) == 2 and self.spec_groups[0].spec.kind == "full"

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[HitBlocks, int]:
        hit_length = max_cache_hit_length
        by_group: list[list[KVCacheBlock] | None] = [None] * len(self.groups)
        eagle_verified: set[int] = set()  # spec groups whose EAGLE drop holds at the current length
        while True:
            curr = hit_length
            for idx, (spec, gids, mcls, eagle) in enumerate(self.spec_groups):
                if spec.kind == "full" and by_group[gids[0]] is not None:
                    curr = curr // spec.block_size * spec.block_size  # downward-closed: no new search
                    continue
                drop = eagle and idx not in eagle_verified
                length = min(curr + spec.block_size, max_cache_hit_length) if drop else curr
                hits = mcls.find_longest_cache_hit(
                    hash_view(block_hashes, self.hash_block_size, spec.block_size),
                    length,
                    gids,
                    self.block_pool,
                    spec,
                    drop,
                    self.block_size,
                )
                new_len = len(hits[0]) * spec.block_size
                if drop:
                    eagle_verified.add(idx)
                elif new_len < curr:
                    eagle_verified.clear()
                curr = new_len
                for gid, blocks in zip(gids, hits):
                    by_group[gid] = blocks
            if curr >= hit_length:
                break
            hit_length = curr
            if self.simple:
                break
        first = self.spec_groups[0]
        if first.spec.kind == "full":
            n = hit_length // first.spec.block_size
            for gid in first.group_ids:
                blks = by_group[gid]
                if blks is not None:
                    del blks[n:]
        hit_blocks = tuple(b if b is not None else [] for b in by_group)
        return (hit_blocks if any(hit_blocks) else NO_HITS), hit_length

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        aligned = num_tokens // self.block_size * self.block_size
        for m in self.single_type_managers:
            n = aligned
            if m.use_eagle and aligned > 0:
                n = min(num_tokens, aligned + m.block_size)
            m.cache_blocks(request, n, self.retention_interval)
