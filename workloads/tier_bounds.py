"""Offline reference hit rates of a request stream on two tiers -- the GPU prefix cache and vLLM
0.33.0's native CPU offload tier -- by source, under the request-order model of ``workloads.bounds``.

**What it mirrors.** The GPU side is ``workloads.bounds`` unchanged (keys, lookup cap
``(num_prompt_tokens - 1) // block_size``, the sequential LRU). The CPU side is the OffloadingConnector
over a ``CPUOffloadingManager`` (files of the 0.33.0 wheel: ``OS`` =
``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``, ``MGR`` =
``v1/kv_offload/cpu/manager.py``, ``LRU``/``ARC`` = ``v1/kv_offload/cpu/policies/{lru,arc}.py``):

* A *chunk* is ``blocks_per_chunk`` (``bpc``) GPU blocks; its key is the key of its last block
  (``OS:RequestOffloadState.update_offload_keys``; the hashes are chained, so the key names the
  whole prefix). Only full chunks of the prompt's full blocks are keyed at a first admission.
* **Lookup** (``OS:_lookup_complete_chunks``, one full-attention group): after the GPU hit of ``g``
  blocks, with ``n`` full prompt chunks: 0 when ``n * bpc - g < bpc``; else from chunk ``g // bpc``
  count consecutive resident chunks up to chunk ``c`` (first miss or ``n``); the CPU hit is
  ``c * bpc - g`` blocks, 0 when that is under ``bpc`` (so a CPU run may re-cover part of the GPU
  hit, and a repeated 32-token prompt at block 16 gets GPU 16 + CPU 16). 0 for a ``prompt_logprobs``
  request (``skip_reading_prefix_cache``). Hit rate by source = GPU or CPU hit tokens / prompt tokens
  (the total may reach the whole prompt: vLLM counts the recomputed last token as external).
* **Offer** (``OS:update_state_after_alloc``, ``OS:_build_store_jobs``): with a CPU hit the chunks
  ``[g // bpc, c)`` are loaded (``MGR.prepare_load``: a reuse) and the chunks from
  ``cdiv(local + external, tokens_per_chunk) = c`` on are offered; without one every chunk from 0 is
  offered (``next_stored_chunk_idx`` reset at the lookup), GPU-hit ones included. The offered chunks
  end at the prompt's last full chunk (``offload_prompt_only``, the default) or at the request's last
  cached full chunk (prompt-only off; only outputs the trace gives are keyed, so generated outputs,
  which never hit, do not take CPU room here).
* ``MGR.prepare_store``: resident offered chunks are reuses; absent ones are stored (with
  ``store_threshold >= 2``: only once offered that many times, an access tracker of 64,000 keys,
  ``MGR._record_accesses``). Needed = stored - free chunks; if more than the resident chunks outside
  the offer, **nothing of the offer is stored** (an allocation failure); else the policy evicts.
* **LRU** (``LRUCachePolicy``): the chunks a request loads or finds resident in its offer take the
  request's rank, tail before head, above every committed chunk; eviction takes the lowest rank
  outside the offer; at the request's finish every chunk it saw becomes most recently used, tail
  first, head last (``on_request_finished``). In this sequential model that is one ordered dict.
* **ARC** (``ARCCachePolicy``): ``on_store_miss`` moves ``target_t1`` on ghost hits (B1: up by
  ``max(1, |B2|/|B1|)``, B2: down by ``max(1, |B1|/|B2|)``) before the allocation; eviction takes
  T1's LRU while ``|T1| >= int(target_t1)`` else T2's (falling back to the other), victims to B1/B2,
  ghosts trimmed to the capacity; inserts go to T1's MRU; at the finish (tail first) inserted-only
  chunks move to their list's MRU and reused ones T1 -> T2 or to T2's MRU.

**The model.** Requests in order, one at a time: GPU lookup, CPU lookup, the load, one offer, the
finish. Left out of the real engine: concurrency (requests overlapping, blocks held while running,
lookups deferred by pending stores or loads, ``HIT_PENDING`` chunks), chunked prefill (vLLM offers a
long prompt's chunks step by step, each offer protecting only itself, and re-offers after a failure
every step, which also counts accesses again under a threshold), pinned chunks (loads end before the
offer here), transfer delays, preemption and re-admission. **The GPU pool:** a CPU load does put
its blocks into the GPU prefix cache (``SCHED:_update_waiting_for_remote_kv`` caches them), but the
sequential model caches every block a request holds at its end whether hit, loaded or computed, so
the GPU pool, and the GPU hits, equal the single-tier ``lru_hit_rate`` at the same capacity exactly.

* :func:`two_tier_infinite`: a GPU pool and a CPU tier that never evict; the CPU holds every full
  chunk of the offered range of every earlier request (its prompt's, with prompt-only): a superset of
  what any CPU tier under the offer rules holds (those rules with unbounded capacity give the same
  hits on the Mooncake stream, and provably with ``bpc = 1``). With ``bpc = 1`` it bounds the
  sequential hits request by request; with larger chunks the one-chunk minimum past the GPU
  boundary can give a smaller GPU pool more CPU hits.
* :func:`two_tier_sequential`: the sequential LRU GPU pool of ``gpu_capacity`` blocks plus a CPU tier
  of ``cpu_chunks`` chunks under ``policy`` (``"lru"`` or ``"arc"``).

Cost: Python dict / ordered-dict loops, linear in the references (each request's work is its
looked-up, loaded and offered keys plus its victims; an eviction scan skips at most the offer): on
the first 2,000 Mooncake requests (1.7 M references) 0.3 s infinite, 1.2 s LRU, 2.3 s ARC.
Checked against vLLM 0.33.0's own ``CPUOffloadingManager`` (tests/tier_bounds_vllm_driver.py).
Imports sim.core and ``workloads.bounds`` only (neither simpy nor torch).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from sim.core.config import OffloadConfig
from workloads.bounds import BlockReferences, _leading_hits, lru_cache_request

Source = Literal["gpu", "cpu", "total"]

MAX_TRACKER_SIZE = 64_000
"""``CPUOffloadingManager``'s ``max_tracker_size`` default (the ``store_threshold`` access tracker)."""


@dataclass(frozen=True)
class TierHits:
    """Hit tokens by source per request (``gpu``, ``cpu``: int64 arrays) and the CPU tier's counts:
    chunks stored and evicted, offers that failed to allocate, chunks reused (loaded or resident)."""

    prompt_tokens: int
    gpu: np.ndarray
    cpu: np.ndarray
    stored: int = 0
    evicted: int = 0
    allocation_failures: int = 0
    reused: int = 0

    def rate(self, source: Source = "total") -> float:
        if not self.prompt_tokens:
            return 0.0
        hits = {"gpu": int(self.gpu.sum()), "cpu": int(self.cpu.sum())}
        return (hits["gpu"] + hits["cpu"] if source == "total" else hits[source]) / self.prompt_tokens


def _requests(refs: BlockReferences, bpc: int, prompt_only: bool) -> Iterator[tuple[int, int, int, int, int, bool]]:
    """Per request: start, length, GPU lookup, keyed chunks at the lookup, offered chunks, reads."""
    if refs.prompt_blocks is None or refs.reads_cache is None:
        raise ValueError("two-tier references need BlockReferences from workloads.bounds.block_references")
    for s, ln, lk, pb, rd in zip(refs.start.tolist(), refs.length.tolist(), refs.lookup.tolist(),
                                 refs.prompt_blocks.tolist(), refs.reads_cache.tolist()):
        yield s, ln, lk, pb // bpc, (pb if prompt_only else ln) // bpc, rd


def _cpu_lookup(ids: list[int], s: int, g: int, n: int, bpc: int, resident: Container[int]) -> int:
    """``OS:_lookup_complete_chunks`` in blocks: the CPU run from GPU hit ``g`` over ``n`` chunks."""
    if n * bpc - g < bpc:
        return 0
    c = g // bpc
    while c < n and ids[s + c * bpc + bpc - 1] in resident:
        c += 1
    hit = c * bpc - g
    return hit if hit >= bpc else 0


def _check(bpc: int) -> None:
    if bpc < 1:
        raise ValueError(f"blocks_per_chunk must be >= 1, got {bpc}")


def two_tier_infinite(refs: BlockReferences, blocks_per_chunk: int = 1, *, prompt_only: bool = True) -> TierHits:
    """Hits by source with a GPU pool and a CPU tier that never evict (see the module docstring)."""
    _check(blocks_per_chunk)
    bpc, bs = blocks_per_chunk, refs.block_size
    ids = refs.ids.tolist()
    gpu_seen: set[int] = set()
    cpu_seen: set[int] = set()
    gpu = np.zeros(refs.num_requests, dtype=np.int64)
    cpu = np.zeros(refs.num_requests, dtype=np.int64)
    for r, (s, ln, lk, n, n_store, rd) in enumerate(_requests(refs, bpc, prompt_only)):
        g = _leading_hits(ids, s, lk, gpu_seen)
        e = _cpu_lookup(ids, s, g, n, bpc, cpu_seen) if rd else 0
        gpu[r], cpu[r] = g * bs, e * bs
        gpu_seen.update(ids[s : s + ln])
        cpu_seen.update(ids[s + bpc - 1 : s + n_store * bpc : bpc])
    return TierHits(refs.prompt_tokens, gpu, cpu)


class _Tracker:
    """``MGR._record_accesses``: offer counts of up to ``MAX_TRACKER_SIZE`` keys, oldest dropped
    first, never a key of the offer being counted."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.counts: OrderedDict[int, int] = OrderedDict()

    def admit(self, offer: list[int], absent: list[int]) -> list[int]:
        counts = self.counts
        protected = 0
        for k in offer:
            if k in counts:
                counts.move_to_end(k)
                counts[k] += 1
                protected += 1
        unprotected = len(counts) - protected
        for k in offer:
            if k in counts:
                continue
            if len(counts) >= MAX_TRACKER_SIZE:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[k] = 1
        return [k for k in absent if counts.get(k, 0) >= self.threshold]


class _Tier:
    """A CPU tier of ``capacity`` chunks in the sequential model; :meth:`serve` is one request's
    load, offer and finish. Subclasses hold the policy's order."""

    def __init__(self, capacity: int, threshold: int) -> None:
        if capacity < 1:
            raise ValueError(f"a CPU tier holds at least one chunk, got {capacity}")
        self.capacity = capacity
        self.tracker = _Tracker(threshold) if threshold >= 2 else None
        self.stored = self.evicted = self.failures = self.reused = 0

    def __contains__(self, key: object) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def __len__(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def serve(self, loaded: list[int], offer: list[int]) -> None:
        """``loaded``: the chunks loaded (prefix order); ``offer``: the chunks offered (prefix order,
        all after ``loaded``)."""
        resident = [k for k in offer if k in self]
        absent = [k for k in offer if k not in self]
        if self.tracker is not None:
            absent = self.tracker.admit(offer, absent)
        self.reused += len(loaded) + len(resident)
        kept = set(absent).union(resident)
        seen = loaded + [k for k in offer if k in kept]  # MGR._record_request_cache_access, prefix order
        self.on_access(loaded, resident, absent)
        inserted: list[int] = []
        if absent:
            needed = len(absent) - (self.capacity - len(self))
            if needed > len(self) - len(resident):
                self.failures += 1  # MGR.prepare_store returns None: nothing of the offer is stored
            else:
                if needed > 0:
                    self.evict(needed, set(offer))
                    self.evicted += needed
                inserted = absent
                self.insert(absent)
                self.stored += len(absent)
        self.finish(seen, inserted, set(loaded).union(resident))

    def on_access(self, loaded: list[int], resident: list[int], absent: list[int]) -> None:
        """The accesses before the allocation (LRU: request ranks; ARC: ghost hits)."""

    def evict(self, n: int, protected: set[int]) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def insert(self, keys: list[int]) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def finish(self, seen: list[int], inserted: list[int], reused: set[int]) -> None:  # pragma: no cover
        raise NotImplementedError


class _LruTier(_Tier):
    """``LRUCachePolicy`` in rank order: front = lowest rank (next victim)."""

    def __init__(self, capacity: int, threshold: int) -> None:
        super().__init__(capacity, threshold)
        self.order: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self.order

    def __len__(self) -> int:
        return len(self.order)

    def on_access(self, loaded: list[int], resident: list[int], absent: list[int]) -> None:
        # on_request_access: rank (request_rank, -position) above every committed rank (a request's
        # rank is drawn after every earlier request's finish); loaded chunks precede the offered ones
        for k in reversed(loaded + resident):
            self.order.move_to_end(k)

    def evict(self, n: int, protected: set[int]) -> None:
        victims: list[int] = []
        for k in self.order:  # the offer's resident chunks sit behind every unprotected one
            if k not in protected:
                victims.append(k)
                if len(victims) == n:
                    break
        for k in victims:
            del self.order[k]

    def insert(self, keys: list[int]) -> None:
        for k in keys:
            self.order[k] = None  # rank (request_rank, -position): reordered at the finish below

    def finish(self, seen: list[int], inserted: list[int], reused: set[int]) -> None:
        for k in reversed(seen):  # on_request_finished: tail first, head last (most recent)
            if k in self.order:
                self.order.move_to_end(k)


class _ArcTier(_Tier):
    """``ARCCachePolicy``: T1, T2 (front = LRU), ghosts B1, B2 and ``target_t1``."""

    def __init__(self, capacity: int, threshold: int) -> None:
        super().__init__(capacity, threshold)
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.target_t1: float = 0.0

    def __contains__(self, key: object) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def on_access(self, loaded: list[int], resident: list[int], absent: list[int]) -> None:
        for k in reversed(absent):  # on_store_miss, before the allocation (even a failing one)
            if k in self.b1:
                self.target_t1 = min(self.target_t1 + max(1, len(self.b2) / len(self.b1)), self.capacity)
                self.b1.move_to_end(k)
            elif k in self.b2:
                self.target_t1 = max(self.target_t1 - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(k)

    def evict(self, n: int, protected: set[int]) -> None:
        t1_iter = (k for k in self.t1 if k not in protected)
        t2_iter = (k for k in self.t2 if k not in protected)
        virtual_t1 = len(self.t1)
        picked: list[tuple[int, bool]] = []
        for _ in range(n):
            k = next(t1_iter, None) if virtual_t1 >= int(self.target_t1) else None
            from_t1 = k is not None
            if k is None:
                k = next(t2_iter, None)
            if k is None:
                k = next(t1_iter, None)
                from_t1 = True
            assert k is not None  # serve checked that enough unprotected chunks exist
            if from_t1:
                virtual_t1 -= 1
            picked.append((k, from_t1))
        for k, from_t1 in picked:
            if from_t1:
                del self.t1[k]
                self.b1[k] = None
            else:
                del self.t2[k]
                self.b2[k] = None
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)

    def insert(self, keys: list[int]) -> None:
        for k in keys:
            self.t1[k] = None
            self.b1.pop(k, None)
            self.b2.pop(k, None)

    def finish(self, seen: list[int], inserted: list[int], reused: set[int]) -> None:
        insertion_only = set(inserted) - reused
        for k in reversed(seen):
            if k in insertion_only:
                if k in self.t1:
                    self.t1.move_to_end(k)
                elif k in self.t2:
                    self.t2.move_to_end(k)
            elif k in reused and k in self.t1:
                del self.t1[k]
                self.t2[k] = None
            elif k in reused and k in self.t2:
                self.t2.move_to_end(k)


def two_tier_sequential(refs: BlockReferences, gpu_capacity: int, cpu_chunks: int, blocks_per_chunk: int = 1, *,
                        policy: Literal["lru", "arc"] = "lru", prompt_only: bool = True,
                        store_threshold: int = 0) -> TierHits:
    """Hits by source of the sequential model: vLLM's LRU GPU pool of ``gpu_capacity`` blocks (as
    ``workloads.bounds.lru_hit_rate``) and a CPU tier of ``cpu_chunks`` chunks under ``policy``."""
    _check(blocks_per_chunk)
    if gpu_capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {gpu_capacity}")
    if policy not in ("lru", "arc"):
        raise ValueError(f"unknown CPU policy {policy!r}")
    tier: _Tier = (_LruTier if policy == "lru" else _ArcTier)(cpu_chunks, store_threshold)
    bpc, bs = blocks_per_chunk, refs.block_size
    ids = refs.ids.tolist()
    lru: OrderedDict[int, None] = OrderedDict()  # the GPU pool, front = next to evict
    gpu = np.zeros(refs.num_requests, dtype=np.int64)
    cpu = np.zeros(refs.num_requests, dtype=np.int64)
    for r, (s, ln, lk, n, n_store, rd) in enumerate(_requests(refs, bpc, prompt_only)):
        g = _leading_hits(ids, s, lk, lru)
        e = _cpu_lookup(ids, s, g, n, bpc, tier) if rd else 0
        gpu[r], cpu[r] = g * bs, e * bs
        chunk = ids[s + bpc - 1 : s + n_store * bpc : bpc]
        c = (g + e) // bpc if e else 0  # loaded [g // bpc, c), offered from c (cdiv(local + external))
        tier.serve(chunk[g // bpc : c] if e else [], chunk[c:])
        if gpu_capacity:  # every block the request holds is cached, loaded ones included
            lru_cache_request(lru, ids, s, ln, gpu_capacity)
    return TierHits(refs.prompt_tokens, gpu, cpu, tier.stored, tier.evicted, tier.failures, tier.reused)


def tier_references(refs: BlockReferences, gpu_capacity: int | None, offload: OffloadConfig) -> dict[str, float]:
    """The summary's two-tier references (``offload``: the engine's CPU tier): the infinite two-tier
    rate and, with a GPU capacity (one full-attention group), the sequential one under the tier's
    policy, each with its GPU and CPU parts; NaN where the model does not apply (no capacity)."""
    out: dict[str, float] = {}
    inf = two_tier_infinite(refs, offload.blocks_per_chunk, prompt_only=offload.offload_prompt_only)
    seq = None if gpu_capacity is None else two_tier_sequential(
        refs, gpu_capacity, offload.num_cpu_chunks, offload.blocks_per_chunk, policy=offload.policy,
        prompt_only=offload.offload_prompt_only, store_threshold=offload.store_threshold)
    parts: tuple[tuple[str, Source], ...] = (("", "total"), ("_gpu", "gpu"), ("_cpu", "cpu"))
    for name, hits in (("two_tier_infinite", inf), (f"two_tier_{offload.policy}_sequential", seq)):
        for part, source in parts:
            out[f"{name}{part}_hit_rate"] = float("nan") if hits is None else hits.rate(source)
    return out
