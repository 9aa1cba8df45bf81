"""Infinite-cache upper bounds on prefix-cache hits."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sim.hashing import FastBlockHasher
from sim.request import token_array
from workloads.trace_format import TraceRequest


def _extra_keys(req: TraceRequest, n_blocks: int) -> list[tuple[Any, ...] | None] | None:
    """vLLM's per-block extra keys for LoRA (every block) and cache salt (block 0 only)."""
    if req.lora is None and not req.salt:
        return None
    base: tuple[Any, ...] = (req.lora,) if req.lora is not None else ()
    extras: list[tuple[Any, ...] | None] = [base or None] * n_blocks
    if req.salt and n_blocks:
        extras[0] = base + (req.salt,)
    return extras


def infinite_cache_hit_bound(requests: Iterable[TraceRequest], block_size: int) -> float:
    """Token-weighted prefix-hit bound of an infinite cache, requests taken in the given order.

    For each request: the number of leading full prompt blocks whose chained hash appeared in an
    *earlier* request (not earlier in itself), capped at ``(len - 1) // block_size`` blocks as vLLM
    always recomputes the last prompt token, times ``block_size``; summed and divided by the total
    prompt tokens. LoRA name and cache salt enter the hash as in vLLM. Outputs are not counted.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    hasher = FastBlockHasher(block_size)
    seen: set[bytes] = set()
    hit_tokens = 0
    total = 0
    for req in requests:
        n = len(req.tokens)
        total += n
        n_full = n // block_size
        if n_full == 0:
            continue
        keys = hasher.hash_token_blocks(token_array(req.tokens), _extra_keys(req, n_full))
        hits = 0
        for key in keys[: max(0, (n - 1) // block_size)]:
            if key not in seen:
                break
            hits += 1
        hit_tokens += hits * block_size
        seen.update(keys)
    return hit_tokens / total if total else 0.0
