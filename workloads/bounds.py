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
lookup caps. The reference string comes from ``workloads.block_refs`` (one compiled pass from the
token runs where built); the policies are set / heap / ordered-dict loops (about a million
references per second), run by their compiled twins of ``workloads.bounds_scan`` where built (tens
of millions per second, equal hit counts: the Python loops stay as the oracle, ``compiled=False``);
:func:`offline_bounds` runs the three side by side in one compiled pass over the requests
(``all_hits``). Imports sim.core only (neither simpy nor torch).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence

import numpy as np

from sim.core.hashing import BlockHash, FastBlockHasher
from sim.core.request import token_array
from workloads.block_refs import BlockReferences as BlockReferences  # re-exported: callers import them from here
from workloads.block_refs import _arrays, request_block_keys
from workloads.block_refs import _dense_ids as _dense_ids
from workloads.block_refs import block_references as block_references
from workloads.trace_format import TraceRequest

try:  # the compiled policy loops (same hit counts; built by pip install -e .)
    from workloads import bounds_scan as _scan
except ImportError:  # pragma: no cover - where the extension is not built
    _scan = None  # type: ignore[assignment]


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


# -- the policies over a reference string -------------------------------------------------------
def _rate(hit_blocks: int, refs: BlockReferences) -> float:
    return hit_blocks * refs.block_size / refs.prompt_tokens if refs.prompt_tokens else 0.0


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
        return _rate(_scan.all_hits(ids, refs.next_lookup(), start, length, lookup, m, capacity)[1], refs)
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
        ids, start, length, lookup, m = _arrays(refs)
        return _rate(_scan.all_hits(ids, refs.next_lookup(), start, length, lookup, m, capacity)[2], refs)
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
    if capacity is not None and _scan is not None:  # the three side by side, one compiled pass
        ids, start, length, lookup, m = _arrays(refs)
        inf, bel, lru = _scan.all_hits(ids, refs.next_lookup(), start, length, lookup, m, capacity)
        return {"infinite_cache_hit_rate": _rate(inf, refs) if infinite is None else infinite,
                "belady_hit_rate": _rate(bel, refs), "lru_sequential_hit_rate": _rate(lru, refs)}
    out = {"infinite_cache_hit_rate": infinite_hit_rate(refs) if infinite is None else infinite}
    if capacity is None:
        out.update(belady_hit_rate=float("nan"), lru_sequential_hit_rate=float("nan"))
    else:
        out["belady_hit_rate"] = belady_hit_rate(refs, capacity)
        out["lru_sequential_hit_rate"] = lru_hit_rate(refs, capacity)
    return out
