"""Offline reference hit rates of a request stream at one block size: the infinite cache, Belady's
optimal and a sequential LRU, all under one request-order model of vLLM 0.25.1's prefix cache.

**What it mirrors.** A request's block keys are its chained full-block hashes with vLLM's equality
structure (``sim.core.hashing.FastBlockHasher``; extra keys from
:func:`sim.core.hashing.blocks_extra_keys`, the function the engine's hashers call: the LoRA name
on every block, the cache salt on block 0), over what vLLM computes and caches: every full block
of the prompt and, when the trace gives ``output_token_ids``, of ``prompt + outputs[:n_out - 1]``
(the last sampled token is never computed). Simulator-generated outputs are unique and never hit,
so they are not tracked. A lookup is vLLM's hit rule (``KVCacheManager.get_computed_blocks``): the
leading prompt blocks that are cached, stopping at the first miss, capped at
``(num_prompt_tokens - 1) // block_size`` blocks (vLLM always recomputes the last prompt token);
0 for a ``prompt_logprobs`` request, which skips reading the cache but still caches its blocks.

**The model (request order, no concurrency).** Requests are taken in the given order (arrival
order for a workload), one at a time: request ``r`` is looked up, then its blocks are available
to cache and the policy decides what the cache holds afterwards, at most ``capacity`` blocks
(``num_gpu_blocks - 1``: vLLM's null block is never cacheable). Hit rate = hit tokens / prompt
tokens: the **request-level** definition (each request counted once, at its first lookup),
comparable with the simulator's ``request_hit_rate``; vLLM's ``token_hit_rate`` also counts the
repeated lookups of a request that waits at the head of the queue, so it can differ (either way).

* ``infinite`` (:class:`HitBound` streaming, :func:`infinite_hit_rate` over a reference string):
  nothing is ever evicted. The engine reaches it with a pool that never evicts when each request
  is admitted after every earlier one was scheduled and answered (low load, closed sessions);
  under load it is an upper bound (vLLM caches blocks at schedule time, so a request admitted in
  the same step as an earlier one does hit its scheduled blocks, which never exceeds the bound).
  It is also an upper bound for sliding-window and hybrid (full + SWA) pools at the scheduler
  block size: a hit there is aligned to that size and every block of it names a prefix an earlier
  request computed. ``include_outputs=False`` gives the prompt-only bound.
* ``belady``: Belady's MIN with bypass -- a block is kept, or displaces the cached block whose
  next *lookup* lies furthest in the future, only if its own next lookup comes sooner; a block with
  no future lookup is never kept. A block's ancestors are looked up whenever it is, so the cache
  stays prefix-closed, the first-miss rule costs it nothing, and it maximises the hit tokens over
  every eviction schedule of the model (MIN's optimality with optional caching): an upper bound on
  any policy of this sequential model -- ``lru`` included -- and at most ``infinite``. A reference
  for the engine's LRU at the same capacity, not a schedule-aware optimum: the engine's requests
  overlap in time, hold their blocks while they run and may be looked up several times.
* ``lru``: the same model with vLLM's eviction order (least recently used first; a finished
  request's blocks are freed tail first, so its deepest block goes first), every computed block
  cached: the engine's policy without its concurrency. The cache is cut to ``capacity`` only
  after a request's blocks are all in, so before every lookup it holds exactly the ``capacity``
  most recently used blocks: a stack algorithm (Mattson's), whose hits at every capacity one pass
  of stack distances would give. A sweep asks for a few capacities per stream, and the compiled
  loop runs one in tens of milliseconds on 1.7 M references, so each capacity is run on its own.

``belady`` and ``lru`` model one pool of equal blocks of one full-attention group; they do not
apply to several KV-cache groups or a sliding window (blocks leave the window and groups compete).

Invariants: every reference uses :func:`request_block_keys`, so all three see the same keys and
lookup caps. The reference string is built with numpy; the policies are set / heap / ordered-dict
loops (about a million references per second), run by their compiled twins of
``workloads.bounds_scan`` where built (tens of millions per second, equal hit counts: the Python
loops stay as the oracle, ``compiled=False``). Imports sim.core only (neither simpy nor torch).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from sim.core.hashing import BlockHash, FastBlockHasher, blocks_extra_keys
from sim.core.request import token_array
from workloads.trace_format import TraceRequest

try:  # the compiled policy loops (same hit counts; built by pip install -e .)
    from workloads import bounds_scan as _scan
except ImportError:  # pragma: no cover - where the extension is not built
    _scan = None  # type: ignore[assignment]

_KEY_BYTES = 16  # FastBlockHasher keys are 128-bit


def request_block_keys(
    req: TraceRequest, hasher: FastBlockHasher, prompt: np.ndarray, include_outputs: bool = True
) -> tuple[list[BlockHash], int]:
    """``req``'s chain of cached full-block keys and how many leading ones its lookup may hit
    (``prompt``: its expanded prompt tokens). Pure."""
    bs = hasher.block_size
    n = int(prompt.size)
    cached = prompt
    if include_outputs and req.output_token_ids is not None and req.output_tokens > 1:
        outs = np.asarray(req.output_token_ids[: req.output_tokens - 1], dtype=np.int64)
        cached = np.concatenate([prompt, outs])
    n_full = int(cached.size) // bs
    if n_full == 0:
        return [], 0
    keys = hasher.hash_token_blocks(cached[: n_full * bs], blocks_extra_keys(req.lora, req.salt, (), 0, n_full, bs))
    return keys, 0 if req.prompt_logprobs else min(len(keys), max(0, (n - 1) // bs))


def _leading_hits(keys: Sequence[object], start: int, lookup: int, cache: Container[object]) -> int:
    """vLLM's first-miss rule: the number of ``keys[start:start + lookup]`` cached before a miss."""
    hits = 0
    for p in range(start, start + lookup):
        if keys[p] not in cache:
            break
        hits += 1
    return hits


# -- the infinite cache, streamed ---------------------------------------------------------------
class HitBound:
    """The infinite-cache bound at one block size, accumulated request by request (:meth:`add`);
    memory is the set of keys seen."""

    def __init__(self, block_size: int, *, include_outputs: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.include_outputs = include_outputs
        self.hasher = FastBlockHasher(block_size)
        self.seen: set[BlockHash] = set()
        self.hit_tokens = 0
        self.prompt_tokens = 0

    def add(self, req: TraceRequest, tokens: np.ndarray | None = None) -> int:
        """Account one request (``tokens``: its prompt, if already expanded); returns its hit tokens."""
        prompt = token_array(req.tokens) if tokens is None else tokens
        self.prompt_tokens += int(prompt.size)
        keys, lookup = request_block_keys(req, self.hasher, prompt, self.include_outputs)
        hits = _leading_hits(keys, 0, lookup, self.seen) * self.block_size
        self.hit_tokens += hits
        self.seen.update(keys)
        return hits

    @property
    def value(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def hit_bounds(
    requests: Iterable[TraceRequest], block_sizes: Sequence[int], *, include_outputs: bool = True
) -> dict[int, float]:
    """The infinite-cache bound at several block sizes in one pass (each prompt expanded once)."""
    acc = [HitBound(bs, include_outputs=include_outputs) for bs in block_sizes]
    for req in requests:
        tokens = token_array(req.tokens)
        for a in acc:
            a.add(req, tokens)
    return {a.block_size: a.value for a in acc}


def infinite_cache_hit_bound(
    requests: Iterable[TraceRequest], block_size: int, *, include_outputs: bool = True
) -> float:
    """The infinite-cache hit bound at ``block_size`` (see the module docstring)."""
    return hit_bounds(requests, [block_size], include_outputs=include_outputs)[block_size]


# -- the block reference string -----------------------------------------------------------------
@dataclass
class BlockReferences:
    """The block reference string of a request stream at one block size.

    ``ids[start[r]:start[r] + length[r]]`` are request ``r``'s block keys (dense ints, chain order);
    its first ``lookup[r]`` of them are looked up; ``prompt_tokens`` is the sum of prompt lengths;
    ``prompt_blocks[r]`` of its keys are full prompt blocks and ``reads_cache[r]`` is False for a
    ``prompt_logprobs`` request (both for ``workloads.tier_bounds``; None when built by hand).
    """

    block_size: int
    ids: np.ndarray  # int64, one per block reference
    start: np.ndarray  # int64, per request
    length: np.ndarray  # int64, per request
    lookup: np.ndarray  # int64, per request
    prompt_tokens: int
    prompt_blocks: np.ndarray | None = None  # int64, per request
    reads_cache: np.ndarray | None = None  # bool, per request

    @property
    def num_requests(self) -> int:
        return int(self.start.size)

    @property
    def num_references(self) -> int:
        return int(self.ids.size)

    @property
    def num_distinct_blocks(self) -> int:
        return int(self.ids.max()) + 1 if self.ids.size else 0

    def next_lookup(self, *, compiled: bool = True) -> np.ndarray:
        """For each reference position ``p``: the position of the next *lookup* reference of the
        same block after ``p`` (``num_references`` when there is none); ``compiled=False``: the
        numpy code (the oracle) even where the compiled scan is built."""
        if compiled and _scan is not None:
            return _scan.next_lookups(*_arrays(self))
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
    """Hash every request's blocks (:func:`request_block_keys`) into a :class:`BlockReferences`."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    hasher = FastBlockHasher(block_size)
    chunks: list[np.ndarray] = []
    lengths: list[int] = []
    lookups: list[int] = []
    prompt_blocks: list[int] = []
    reads: list[bool] = []
    prompt_tokens = 0
    for req in requests:
        prompt = token_array(req.tokens)
        prompt_tokens += int(prompt.size)
        keys, lookup = request_block_keys(req, hasher, prompt, include_outputs)
        lengths.append(len(keys))
        lookups.append(lookup)
        prompt_blocks.append(min(len(keys), int(prompt.size) // block_size))
        reads.append(not req.prompt_logprobs)
        if keys:
            chunks.append(np.frombuffer(b"".join(keys), dtype=f"S{_KEY_BYTES}"))
    raw = np.concatenate(chunks) if chunks else np.zeros(0, dtype=f"S{_KEY_BYTES}")
    ids = _dense_ids(raw)
    length = np.asarray(lengths, dtype=np.int64)
    start = np.zeros(length.size, dtype=np.int64)
    if length.size:
        start[1:] = np.cumsum(length)[:-1]
    return BlockReferences(block_size, ids, start, length, np.asarray(lookups, dtype=np.int64), prompt_tokens,
                           np.asarray(prompt_blocks, dtype=np.int64), np.asarray(reads, dtype=bool))


def _dense_ids(raw: np.ndarray) -> np.ndarray:
    """Each 16-byte key's rank among the distinct keys in byte order (``np.unique``'s inverse),
    sorting the keys read as two big-endian 64-bit halves (byte order = numeric order of the
    halves): by the first half alone when equal first halves always come with equal second ones
    (distinct 128-bit hashes practically never share 64 bits), else by both. Several times faster
    than sorting 16-byte strings."""
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    halves = np.frombuffer(raw.tobytes(), dtype=">u8").reshape(-1, 2)
    hi, lo = halves[:, 0].astype(np.uint64), halves[:, 1].astype(np.uint64)
    order = np.argsort(hi)
    same_hi = hi[order[1:]] == hi[order[:-1]]
    new_lo = lo[order[1:]] != lo[order[:-1]]
    if (same_hi & new_lo).any():  # two keys share their first half: order by both halves
        order = np.lexsort((lo, hi))
        same_hi = hi[order[1:]] == hi[order[:-1]]
        new_lo = lo[order[1:]] != lo[order[:-1]]
    new = np.empty(order.size, dtype=bool)
    new[0] = True
    new[1:] = ~same_hi | new_lo
    ids = np.empty(order.size, dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids


# -- the policies over a reference string -------------------------------------------------------
def _rate(hit_blocks: int, refs: BlockReferences) -> float:
    return hit_blocks * refs.block_size / refs.prompt_tokens if refs.prompt_tokens else 0.0


def _arrays(refs: BlockReferences) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The reference string as the compiled loops take it (contiguous int64)."""
    return (np.ascontiguousarray(refs.ids, dtype=np.int64), np.ascontiguousarray(refs.start, dtype=np.int64),
            np.ascontiguousarray(refs.length, dtype=np.int64), np.ascontiguousarray(refs.lookup, dtype=np.int64),
            refs.num_distinct_blocks)


def infinite_hit_rate(refs: BlockReferences, *, compiled: bool = True) -> float:
    """Hit rate with a cache that never evicts (equals :func:`infinite_cache_hit_bound`);
    ``compiled=False``: the Python loop (the oracle) even where the compiled one is built."""
    if compiled and _scan is not None:
        return _rate(_scan.infinite_hits(*_arrays(refs)), refs)
    ids = refs.ids.tolist()
    seen: set[int] = set()
    hits = 0
    for s, ln, lk in zip(refs.start.tolist(), refs.length.tolist(), refs.lookup.tolist()):
        hits += _leading_hits(ids, s, lk, seen)
        seen.update(ids[s : s + ln])
    return _rate(hits, refs)


def belady_hit_rate(refs: BlockReferences, capacity: int, *, compiled: bool = True) -> float:
    """Hit rate of Belady's MIN with bypass holding at most ``capacity`` blocks (``compiled``: as
    in :func:`infinite_hit_rate`)."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    if compiled and _scan is not None:
        ids, start, length, lookup, m = _arrays(refs)
        return _rate(_scan.belady_hits(ids, refs.next_lookup(), start, length, lookup, m, capacity), refs)
    ids = refs.ids.tolist()
    nxt = refs.next_lookup().tolist()
    never = refs.num_references
    cache: dict[int, int] = {}  # block -> its next lookup position (the heap key)
    heap: list[tuple[int, int]] = []  # (-next lookup, block), stale entries skipped lazily
    push, pop = heapq.heappush, heapq.heappop
    hits = 0
    for s, ln, lk in zip(refs.start.tolist(), refs.length.tolist(), refs.lookup.tolist()):
        hits += _leading_hits(ids, s, lk, cache)
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


def lru_hit_rate(refs: BlockReferences, capacity: int, *, compiled: bool = True) -> float:
    """Hit rate of the sequential LRU (vLLM's eviction order, every computed block cached;
    ``compiled``: as in :func:`infinite_hit_rate`)."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    if compiled and _scan is not None:
        return _rate(_scan.lru_hits(*_arrays(refs), capacity), refs)
    ids = refs.ids.tolist()
    lru: OrderedDict[int, None] = OrderedDict()  # front = next to evict
    hits = 0
    for s, ln, lk in zip(refs.start.tolist(), refs.length.tolist(), refs.lookup.tolist()):
        hits += _leading_hits(ids, s, lk, lru)
        if capacity == 0:
            continue
        lru_cache_request(lru, ids, s, ln, capacity)
    return _rate(hits, refs)


def lru_cache_request(lru: OrderedDict[int, None], ids: Sequence[int], start: int, length: int, capacity: int) -> None:
    """Changes ``lru``: a request's blocks ``ids[start:start + length]`` become the most recently used,
    then the least recently used beyond ``capacity`` go. vLLM's kv_cache_manager.free frees a
    request's blocks in reverse order, so the deepest block of a chain reaches the free queue first
    and is evicted before its ancestors."""
    for p in range(start + length - 1, start - 1, -1):
        b = ids[p]
        if b in lru:
            lru.move_to_end(b)
        else:
            lru[b] = None
    while len(lru) > capacity:
        lru.popitem(last=False)


def offline_bounds(refs: BlockReferences, capacity: int | None, *, infinite: float | None = None) -> dict[str, float]:
    """``infinite_cache_hit_rate`` (``infinite``: when the caller knows it already), and with a
    capacity ``belady_hit_rate`` and ``lru_sequential_hit_rate`` (NaN without one: the
    single-pool model does not apply)."""
    out = {"infinite_cache_hit_rate": infinite_hit_rate(refs) if infinite is None else infinite}
    if capacity is None:
        out.update(belady_hit_rate=float("nan"), lru_sequential_hit_rate=float("nan"))
    else:
        out["belady_hit_rate"] = belady_hit_rate(refs, capacity)
        out["lru_sequential_hit_rate"] = lru_hit_rate(refs, capacity)
    return out
