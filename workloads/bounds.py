"""Infinite-cache upper bounds on prefix-cache hits.

Definition (token-weighted, requests in the given order -- arrival order for a workload):

* request ``r``'s hit is the number of leading *full* prompt blocks whose chained hash (LoRA name
  and cache salt included, with vLLM's equality structure) was cached by an **earlier** request, capped at
  ``(len - 1) // block_size`` blocks because vLLM always recomputes the last prompt token, times
  ``block_size``; a request with ``prompt_logprobs`` gets 0 (vLLM skips reading the cache for it)
  but still caches its blocks;
* what a request caches: every full block of its prompt and, with ``include_outputs`` (default)
  and trace-given ``output_token_ids``, every full block of ``prompt + outputs[:n_out - 1]`` --
  vLLM caches generated blocks too, but never computes (so never caches) the last sampled token.
  Simulator-generated outputs are unique and never hit, so they are not tracked;
* bound = sum of hits / sum of prompt tokens.

This is what the engine reaches with a pool that never evicts when each request is admitted
after every earlier request's prompt was scheduled and its answer generated (low load, closed
sessions). Under load it is an upper bound: a request admitted while an earlier one is still
mid-prefill, or before an earlier turn's answer exists, hits less. (vLLM caches blocks at schedule
time, so a request admitted in the same step as an earlier one *does* hit its scheduled blocks;
that never exceeds this bound.) ``include_outputs=False`` gives the prompt-only bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from sim.core.hashing import FastBlockHasher
from sim.core.request import token_array
from workloads.trace_format import TraceRequest


def _extra_keys(req: TraceRequest, n_blocks: int) -> list[tuple[Any, ...] | None] | None:
    """Extra keys with the equality structure of vLLM's (LoRA name on every block, salt on block 0).

    Block 0 gets vLLM's exact keys; the LoRA name is repeated on block 1 only, not on every block:
    hashes are chained, so two blocks ``i >= 1`` whose chains agree up to block 1 already agree on
    the LoRA, and the equality structure is exactly vLLM's -- with two per-block extra digests per
    request instead of one per block (the fast hasher digests extras block by block).
    """
    if req.lora is None and not req.salt:
        return None
    base: tuple[Any, ...] = (req.lora,) if req.lora is not None else ()
    extras: list[tuple[Any, ...] | None] = [None] * n_blocks
    if n_blocks:
        extras[0] = (base + (req.salt,) if req.salt else base) or None
    if n_blocks > 1 and base:
        extras[1] = base
    return extras


class HitBound:
    """Accumulates the bound at one block size; feed requests in order with :meth:`add`."""

    def __init__(self, block_size: int, *, include_outputs: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.include_outputs = include_outputs
        self.hasher = FastBlockHasher(block_size)
        self.seen: set[bytes] = set()
        self.hit_tokens = 0
        self.prompt_tokens = 0

    def add(self, req: TraceRequest, tokens: np.ndarray | None = None) -> int:
        """Account one request (``tokens``: its prompt, if already expanded); returns its hit."""
        bs = self.block_size
        prompt = token_array(req.tokens) if tokens is None else tokens
        n = int(prompt.size)
        self.prompt_tokens += n
        cached = prompt
        if self.include_outputs and req.output_token_ids is not None and req.output_tokens > 1:
            outs = np.asarray(req.output_token_ids[: req.output_tokens - 1], dtype=np.int64)
            cached = np.concatenate([prompt, outs])
        n_full = cached.size // bs
        if n_full == 0:
            return 0
        keys = self.hasher.hash_token_blocks(cached[: n_full * bs], _extra_keys(req, n_full))
        hits = 0
        if not req.prompt_logprobs:
            for key in keys[: max(0, (n - 1) // bs)]:
                if key not in self.seen:
                    break
                hits += 1
        self.hit_tokens += hits * bs
        self.seen.update(keys)
        return hits * bs

    @property
    def value(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def hit_bounds(
    requests: Iterable[TraceRequest], block_sizes: Sequence[int], *, include_outputs: bool = True
) -> dict[int, float]:
    """The bound at several block sizes in one pass (each prompt expanded once)."""
    acc = [HitBound(bs, include_outputs=include_outputs) for bs in block_sizes]
    for req in requests:
        tokens = token_array(req.tokens)
        for a in acc:
            a.add(req, tokens)
    return {a.block_size: a.value for a in acc}


def infinite_cache_hit_bound(
    requests: Iterable[TraceRequest], block_size: int, *, include_outputs: bool = True
) -> float:
    """Token-weighted infinite-cache hit bound at ``block_size`` (see the module docstring)."""
    return hit_bounds(requests, [block_size], include_outputs=include_outputs)[block_size]
