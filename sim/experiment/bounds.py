"""Offline reference hit rates for one request stream at one block size: infinite cache,
Belady's optimal and a sequential LRU, all under the same request-order model.

**The model (request order, no concurrency).** Requests are taken in the given order (arrival
order for a workload), one at a time. Request ``r`` has a chain of full-block keys ``K_r`` -- the
full blocks of its prompt and, when the trace gives ``output_token_ids``, of
``prompt + outputs[:n_out - 1]`` (what vLLM computes and caches), hashed as vLLM chains them
(LoRA name in every block's extra keys, cache salt in block 0's), exactly as
:mod:`workloads.bounds` does. For request ``r``:

1. *lookup* (vLLM's hit rule): its hit is the number of leading prompt blocks that are in the cache,
   stopping at the first miss and capped at ``(num_prompt_tokens - 1) // block_size`` blocks (vLLM
   always recomputes the last prompt token), times ``block_size``; 0 for a ``prompt_logprobs``
   request (it skips reading the cache but still caches its blocks);
2. *compute*: every block of ``K_r`` is now available to cache; the policy decides what the cache
   holds afterwards, at most ``capacity`` blocks (``num_gpu_blocks - 1``: vLLM's null block is
   never cacheable).

Hit rate = sum of hits / sum of prompt tokens: the **request-level** definition (each request
counted once, at its first lookup), comparable with the simulator's ``request_hit_rate``; vLLM's
``token_hit_rate`` also counts the repeated lookups of a request that waits at the head of the
queue, so it can differ (either way) from these references.

* ``infinite``: nothing is ever evicted (equals :func:`workloads.bounds.infinite_cache_hit_bound`).
* ``belady``: Belady's MIN with bypass -- a block is kept, or displaces the cached block whose
  next *lookup* lies furthest in the future, only if its own next lookup comes sooner; a block with
  no future lookup is never kept. Because a block's ancestors are looked up whenever it is (and
  earlier in the same request), this cache stays prefix-closed, so the first-miss rule costs it
  nothing, and it maximises the total hit tokens over every eviction schedule of the model (the
  classic optimality of MIN with optional caching). It is therefore an upper bound on any policy in
  this sequential model -- in particular on ``lru`` below -- and at most ``infinite``. It is an
  upper-bound-style *reference* for the engine's LRU at the same capacity, not a schedule-aware
  optimum: the engine's requests overlap in time, hold their blocks while they run, and may be
  looked up several times, none of which this model sees.
* ``lru``: the same model with vLLM's eviction order (least recently used first; a finished
  request's blocks are freed tail first, so its deepest block goes first) and every computed block
  cached -- the engine's policy without its concurrency.

The reference string is built with numpy; the policies are heap / ordered-dict loops over the
block references (about a million references per second). Imports neither simpy nor torch.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.hashing import FastBlockHasher
from sim.core.request import token_array

if TYPE_CHECKING:  # pragma: no cover
    from workloads.trace_format import TraceRequest

_KEY_BYTES = 16  # FastBlockHasher keys are 128-bit


def _extra_keys(req: TraceRequest, n_blocks: int) -> list[tuple[Any, ...] | None] | None:
    """vLLM's per-block extra keys: the LoRA name on every block, the cache salt on block 0."""
    if req.lora is None and not req.salt:
        return None
    base: tuple[Any, ...] = (req.lora,) if req.lora is not None else ()
    extras: list[tuple[Any, ...] | None] = [base or None] * n_blocks
    if req.salt and n_blocks:
        extras[0] = base + (req.salt,)
    return extras


@dataclass
class BlockReferences:
    """The block reference string of a request stream at one block size.

    ``ids[start[r]:start[r] + length[r]]`` are request ``r``'s block keys (dense ints, chain order);
    its first ``lookup[r]`` of them are looked up; ``prompt_tokens`` is the sum of prompt lengths.
    """

    block_size: int
    ids: np.ndarray  # int64, one per block reference
    start: np.ndarray  # int64, per request
    length: np.ndarray  # int64, per request
    lookup: np.ndarray  # int64, per request
    prompt_tokens: int

    @property
    def num_requests(self) -> int:
        return int(self.start.size)

    @property
    def num_references(self) -> int:
        return int(self.ids.size)

    @property
    def num_distinct_blocks(self) -> int:
        return int(self.ids.max()) + 1 if self.ids.size else 0

    def next_lookup(self) -> np.ndarray:
        """For each reference position ``p``: the position of the next *lookup* reference of the
        same block after ``p`` (``num_references`` when there is none)."""
        n = self.ids.size
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        is_lookup = np.zeros(n, dtype=bool)
        owner = np.repeat(np.arange(self.start.size), self.length)
        offset = np.arange(n, dtype=np.int64) - self.start[owner]
        is_lookup[offset < self.lookup[owner]] = True
        pos = np.arange(n, dtype=np.int64)
        order = np.lexsort((pos, self.ids))  # by block, then position
        grp = self.ids[order]
        big = np.int64(n + 1)
        val = grp * big + np.where(is_lookup[order], order, n)  # position or "none" (n), per group
        # suffix minimum, then shift by one: the smallest lookup position strictly after each one
        suffix = np.minimum.accumulate(val[::-1])[::-1]
        after = np.empty(n, dtype=np.int64)
        after[:-1] = suffix[1:]
        after[-1] = (grp[-1] + 1) * big  # nothing after the last element
        same = (after // big) == grp
        nxt_sorted = np.where(same, after - grp * big, n)
        out = np.empty(n, dtype=np.int64)
        out[order] = nxt_sorted
        return out


def block_references(
    requests: Iterable[TraceRequest], block_size: int, *, include_outputs: bool = True
) -> BlockReferences:
    """Hash every request's blocks (see the module docstring) into a :class:`BlockReferences`."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    hasher = FastBlockHasher(block_size)
    chunks: list[np.ndarray] = []
    lengths: list[int] = []
    lookups: list[int] = []
    prompt_tokens = 0
    bs = block_size
    for req in requests:
        prompt = token_array(req.tokens)
        n = int(prompt.size)
        prompt_tokens += n
        cached = prompt
        if include_outputs and req.output_token_ids is not None and req.output_tokens > 1:
            outs = np.asarray(req.output_token_ids[: req.output_tokens - 1], dtype=np.int64)
            cached = np.concatenate([prompt, outs])
        n_full = int(cached.size) // bs
        keys = hasher.hash_token_blocks(cached[: n_full * bs], _extra_keys(req, n_full)) if n_full else []
        lengths.append(len(keys))
        lookups.append(0 if req.prompt_logprobs else min(len(keys), max(0, (n - 1) // bs)))
        if keys:
            chunks.append(np.frombuffer(b"".join(keys), dtype=f"S{_KEY_BYTES}"))
    raw = np.concatenate(chunks) if chunks else np.zeros(0, dtype=f"S{_KEY_BYTES}")
    if raw.size:
        _, ids = np.unique(raw, return_inverse=True)
        ids = ids.astype(np.int64).ravel()
    else:
        ids = np.zeros(0, dtype=np.int64)
    length = np.asarray(lengths, dtype=np.int64)
    start = np.zeros(length.size, dtype=np.int64)
    if length.size:
        start[1:] = np.cumsum(length)[:-1]
    return BlockReferences(block_size, ids, start, length, np.asarray(lookups, dtype=np.int64), prompt_tokens)


def _rate(hit_blocks: int, refs: BlockReferences) -> float:
    return hit_blocks * refs.block_size / refs.prompt_tokens if refs.prompt_tokens else 0.0


def infinite_hit_rate(refs: BlockReferences) -> float:
    """Hit rate with a cache that never evicts."""
    ids = refs.ids.tolist()
    seen: set[int] = set()
    hits = 0
    for s, ln, lk in zip(refs.start.tolist(), refs.length.tolist(), refs.lookup.tolist()):
        for p in range(s, s + lk):
            if ids[p] not in seen:
                break
            hits += 1
        seen.update(ids[s : s + ln])
    return _rate(hits, refs)


def belady_hit_rate(refs: BlockReferences, capacity: int) -> float:
    """Hit rate of Belady's MIN with bypass holding at most ``capacity`` blocks."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    ids = refs.ids.tolist()
    nxt = refs.next_lookup().tolist()
    never = refs.num_references
    cache: dict[int, int] = {}  # block -> its next lookup position (the heap key)
    heap: list[tuple[int, int]] = []  # (-next lookup, block), stale entries skipped lazily
    push, pop = heapq.heappush, heapq.heappop
    hits = 0
    for s, ln, lk in zip(refs.start.tolist(), refs.length.tolist(), refs.lookup.tolist()):
        for p in range(s, s + lk):
            if ids[p] not in cache:
                break
            hits += 1
        for p in range(s, s + ln):
            b, nu = ids[p], nxt[p]
            old = cache.get(b)
            if old is not None:
                if old != nu:
                    cache[b] = nu
                    push(heap, (-nu, b))
                continue
            if nu == never or capacity == 0:
                continue  # bypass: no future lookup
            if len(cache) < capacity:
                cache[b] = nu
                push(heap, (-nu, b))
                continue
            while True:  # the cached block looked up furthest in the future
                top_nu, top_b = heap[0]
                if cache.get(top_b) == -top_nu:
                    break
                pop(heap)
            if -top_nu > nu:
                pop(heap)
                del cache[top_b]
                cache[b] = nu
                push(heap, (-nu, b))
    return _rate(hits, refs)


def lru_hit_rate(refs: BlockReferences, capacity: int) -> float:
    """Hit rate of the sequential LRU (vLLM's eviction order, every computed block cached)."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    ids = refs.ids.tolist()
    lru: OrderedDict[int, None] = OrderedDict()  # front = next to evict
    hits = 0
    for s, ln, lk in zip(refs.start.tolist(), refs.length.tolist(), refs.lookup.tolist()):
        for p in range(s, s + lk):
            if ids[p] not in lru:
                break
            hits += 1
        if capacity == 0:
            continue
        for p in range(s + ln - 1, s - 1, -1):  # tail first: the deepest block is evicted first
            b = ids[p]
            if b in lru:
                lru.move_to_end(b)
            else:
                lru[b] = None
        while len(lru) > capacity:
            lru.popitem(last=False)
    return _rate(hits, refs)


def offline_bounds(refs: BlockReferences, capacity: int | None) -> dict[str, float]:
    """``infinite_cache_hit_rate``, and with a capacity ``belady_hit_rate`` and
    ``lru_sequential_hit_rate`` (NaN without one)."""
    out = {"infinite_cache_hit_rate": infinite_hit_rate(refs)}
    if capacity is None:
        out.update(belady_hit_rate=float("nan"), lru_sequential_hit_rate=float("nan"))
    else:
        out["belady_hit_rate"] = belady_hit_rate(refs, capacity)
        out["lru_sequential_hit_rate"] = lru_hit_rate(refs, capacity)
    return out
