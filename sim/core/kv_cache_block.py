"""One physical KV block's metadata and its hash-map key (mirrors ``KVCacheBlock`` of vLLM 0.25.1's
``vllm/v1/core/kv_cache_utils.py`` and the group-tagged key of ``make_block_hash_with_group_id``).

Invariants: ``block_hash`` is the key the block is cached under, or None (uncached); ``group_id``
is the KV-cache group that cached it (0 while uncached or for one-group models); only block 0 of a
pool is ``is_null``. Pure Python: imports nothing from the project.
"""

from __future__ import annotations

BlockKey = bytes
"""A map key: the block hash, plus the 4-byte big-endian group id for groups other than 0."""


def make_block_key(block_hash: bytes, group_id: int) -> BlockKey:
    """vLLM keys are ``hash || group_id (4 bytes)``; group 0 keeps the bare hash (same equality)."""
    return block_hash if group_id == 0 else block_hash + group_id.to_bytes(4, "big")


class KVCacheBlock:
    """Metadata of one physical KV block (slotted: the pool holds one per GPU block)."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "group_id", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockKey | None = None  # the map key while cached
        self.group_id = 0
        self.is_null = False

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"
