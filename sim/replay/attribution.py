"""Miss attribution: every prompt token a request misses at its first admission gets exactly one
cause (mirrors nothing in vLLM: vLLM counts hits, this says why the rest missed; the rules it
explains are vLLM 0.25.1's ``KVCacheManager.get_computed_blocks`` and ``BlockPool``).

A :class:`MissAttribution` is the pool's :class:`~sim.core.cache_observer.CacheObserver`. It
classifies a request in ``on_allocate`` of its first admission -- the allocation will succeed and
nothing has changed since the lookup that granted ``h`` hit tokens -- so the cache it reads is the
one the lookup saw. With ``P`` prompt tokens, scheduler block size ``B``, ``F = P // B`` full blocks
and the lookup cap ``L = (P - 1) // B`` blocks, the ``P - h`` missed tokens split, in this
precedence order (each token takes the first cause that applies):

* ``skip`` -- all ``P`` tokens when the request skips reading the cache (``prompt_logprobs``) or
  prefix caching is off;
* ``last_token`` -- the ``(F - L) * B`` tokens of the last full block when ``P`` is a multiple of
  ``B``: vLLM always recomputes the last prompt token, so a fully cached prompt recomputes that
  whole block;
* ``partial_block`` -- the ``P - F * B`` trailing tokens that do not fill a block (never cacheable);
* ``eagle`` -- the last matched block, which vLLM drops from the hit with EAGLE so the drafter
  recomputes it (a cause the issue did not list: it is a pure configuration loss);
* then each missed block ``j`` in ``[h / B, L)``, by its own key ``K`` (the chained hash plus the
  group id) at the time of the lookup:

  - ``unreachable`` -- ``K`` is cached, but an earlier block of the chain missed (the
    contiguous-prefix rule cannot reach it);
  - ``in_flight`` -- ``K`` is not cached but a running request is computing it: the block lies in
    its chain (prompt, or a trace-given answer it is generating) beyond what it has computed
    (chunked-prefill and same-step races);
  - ``evicted`` -- ``K`` was cached earlier and lost its key before this lookup;
  - ``isolation`` -- ``K`` was never produced (not cached, not in flight, never evicted), but the
    same token prefix up to this block was cached or computed earlier under other extra keys;
    split by the key that differs (first of salt, LoRA adapter, multimodal items): this namespace
    never had the block, another one does. A block this namespace had and lost is ``evicted``,
    even if another namespace still has it: the isolation count is then exactly what sharing the
    namespace would add to an infinite cache (below);
  - ``cold`` -- neither ``K`` nor a token-equal block under any extra keys was ever produced (a
    compulsory miss).

The last five are disjoint by their definitions (``in_flight`` is checked before ``evicted``, the
one overlap), so the issue's precedence order holds among them too.

**CPU offload tier** (vLLM 0.33.0's native offloading, ``Scheduler.tier``; the rules are in
:mod:`sim.replay.attribution_tier`): the ``ext`` tokens the first admission loads from the tier
(``Request.num_external_computed_tokens``, right after the GPU hit ``h``) are a hit source, not a
miss, so the causes add up to ``P - h - ext``; ``last_token`` is what the CPU hit leaves of the last
full block (the connector's lookup is bounded by ``P``, not ``P - 1``); ``eagle`` needs no CPU hit
(the dropped block is the first past the GPU hit); the missed blocks are those in
``[(h + ext) / B, L)``, and one the GPU does not cache but the CPU tier holds is
``cpu_partial_chunk`` or ``unreachable`` before the rules above, so ``evicted`` reads "evicted from
both tiers". The classification happens at the admission's first allocation -- for an async load,
``allocate_for_load`` at the load's start (the request then waits in WAITING_FOR_REMOTE_KVS and is
admitted into ``running`` later, by an ``allocate_slots`` with computed tokens: not classified
again, it files its in-flight claims then) -- right after both lookups, so the GPU cache and the
CPU tier it reads are the ones the lookups saw.

**Groups** (sliding-window and hybrid models): a missed scheduler block ``j`` is classified by the
group blocks a hit ending at its boundary ``b = (j + 1) * B`` needs that lie inside it (every
full-attention block of the span; the sliding-window blocks of the span among the
``cdiv(w - 1, bs)`` before ``b``): ``unreachable`` (``eagle`` for the first missed block with EAGLE
on) when all of them are cached, else the first cause in the order above among the uncached ones.
With one full-attention group this is exactly the per-block rule.

**Identity with the infinite-cache bound** (``workloads.bounds.HitBound``, what ``apcsim workloads
stats`` prints). On a pool that never evicts, under FCFS without EAGLE, with no request reaching
``max_model_len``, for every request that reads the cache::

    hit_tokens + in_flight + unreachable             == infinite-cache bound hit tokens
    hit_tokens + in_flight + unreachable + isolation == the same bound with salts and LoRA dropped
    cold                                             == L * B - (the shared bound's hit tokens)

and ``evicted == 0``: the bound's hits are the blocks an earlier-arriving request (FCFS: one
admitted earlier) computes, which the lookup finds cached, reachable or not, or still in flight.

Cost: summary level keeps the keys ever evicted (a set), the chains of running requests and the
token chains of requests with extra keys; ``full`` also keeps, per block of every request, a row
for ``apcsim explain``. A request's classification is O(its prompt blocks). Imports neither simpy
nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.cache_observer import EVICT_REUSED
from sim.core.hashing import BlockHash
from sim.core.kv_cache_block import BlockKey, KVCacheBlock, make_block_key
from sim.core.kv_cache_spec import cdiv
from sim.core.request import PREEMPTED, WAITING, Request
from sim.core.scheduler import Scheduler
from sim.replay.attribution_claims import InFlightClaims
from sim.replay.attribution_namespace import (
    ISOLATION_CODE,
    PLAIN,
    Namespace,
    describe_namespace,
    differing_key,
    has_extra_keys,
    namespace_of,
)
from sim.replay.attribution_records import (
    COLD,
    CPU_PARTIAL_CHUNK,
    EAGLE,
    EVICTED,
    IN_FLIGHT,
    UNREACHABLE,
    AttributionRecords,
    BlockRow,
    check_attribution,
)
from sim.replay.attribution_tier import CpuBlock, TierLookup

if TYPE_CHECKING:  # the requests table comes in built; pandas is not imported by the replay itself
    import pandas as pd

_KEY = attrgetter("block_hash")
class MissAttribution:
    """The pool observer that attributes first-admission misses (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, *, full: bool = False) -> None:
        kvm = scheduler.kv_cache_manager
        coord = kvm.coordinator
        self.scheduler = scheduler
        self.pool = kvm.block_pool
        self.hasher = scheduler.hasher
        self.caching = kvm.enable_caching and scheduler.hasher is not None
        self.block_size = kvm.block_size  # the scheduler block size (hits are aligned to it)
        self.hash_block_size = kvm.hash_block_size
        self.groups = kvm.kv_groups
        self.unitary = kvm.is_unitary_full_attention
        managers = getattr(coord, "single_type_managers", ())
        self.eagle = bool(getattr(coord, "use_eagle", False)) or any(m.use_eagle for m in managers)
        self.max_model_len = kvm.max_model_len
        self.full = full
        self.tier = TierLookup(scheduler.tier) if scheduler.tier is not None else None
        self.records = AttributionRecords(full, kvm.hash_block_size,
                                          self.tier.blocks_per_chunk if self.tier is not None else None)
        self.evicted: set[BlockKey] | dict[BlockKey, tuple[Any, ...]] = {} if full else set()
        self.flight = InFlightClaims(scheduler, kvm.hash_block_size, self.unitary)
        self.cached_by: dict[int, tuple[int, str]] = {}  # full: block id -> (step, request) that cached it
        self.owner: str | None = None  # the request the current allocation is for

    def tables(self, requests: pd.DataFrame, *, check: bool = False) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """``requests`` with the ``miss_<cause>_tokens`` columns, and the ``full`` level's block rows
        (else None); ``check`` asserts every request's causes add up (``check_attribution``)."""
        self.flight.flush()
        out = requests.assign(**self.records.request_columns(list(requests["request_id"])))
        if check:
            check_attribution(out)
        return out, self.records.blocks_table()

    # -- CacheObserver ------------------------------------------------------------------------
    def on_allocate(self, request: Request, num_new_computed_tokens: int) -> None:
        self.owner = request.request_id
        self.flight.flush()
        status = request.status
        if status != WAITING and status != PREEMPTED:
            return  # a running request's next chunk or block
        if not self.caching:
            if request.num_preemptions == 0 and status == WAITING:
                self.records.add_request(request, 0, self.block_size, skip=True)
            return
        self.flight.sweep()
        hashes, tokens = self._chains(request)
        done = request.num_computed_tokens
        if done:  # CPU tier: admitted into running after its load (classified at the load's start)
            self.flight.claim(request, done, hashes, tokens)
            return
        if status == WAITING and request.num_preemptions == 0:
            self._attribute(request, num_new_computed_tokens, hashes, tokens)
        self.flight.claim(request, num_new_computed_tokens, hashes, tokens)  # not filed for a load (claims)

    def on_allocate_new_blocks(self, request_id: str) -> None:
        self.owner = request_id

    def on_cache(self, request: Request, blocks: Sequence[KVCacheBlock], start: int, end: int, group_id: int) -> None:
        if self.full:
            info = (self.scheduler.step_index, request.request_id)
            for b in blocks[start:end]:
                if b.block_hash is not None:
                    self.cached_by[b.block_id] = info

    def on_evict(self, blocks: Sequence[KVCacheBlock], reason: str) -> None:
        ev = self.evicted
        if isinstance(ev, set):
            ev.update(map(_KEY, blocks))  # an uncached block adds None, which no lookup asks for
            return
        step_now, owner = self.scheduler.step_index, self.owner if reason == EVICT_REUSED else None
        for b in blocks:
            if b.block_hash is not None:
                step, by = self.cached_by.pop(b.block_id, (None, None))
                ev[b.block_hash] = (step, by, step_now, owner, b.block_id, reason)

    # -- chains -------------------------------------------------------------------------------
    def _chains(self, r: Request) -> tuple[list[BlockHash], list[BlockHash] | None]:
        """The request's chain at the hash block size -- its prompt, plus the trace-given answer it
        will compute (the last sampled token never is; capped at ``max_model_len``) -- and, for a
        request with extra keys, the same chain hashed without them (None: equal to the first)."""
        hashes: list[BlockHash] = r.block_hashes
        tokens = None
        if r.output_token_plan is not None:
            n_out = min(r.num_prompt_tokens + r.max_tokens, self.max_model_len) - 1 - r.num_prompt_tokens
            if n_out > 0 and (r.num_prompt_tokens + n_out) // self.hash_block_size > len(hashes):
                tokens = np.concatenate([r.prompt_token_ids, r.output_token_plan[:n_out]])
                hashes = self._hash(r.request_id, tokens, r)
        if not has_extra_keys(r):
            return hashes, None
        if tokens is None:
            tokens = r.prompt_token_ids
        return hashes, self._hash(r.request_id, tokens, None)

    def _hash(self, request_id: str, tokens: np.ndarray, like: Request | None) -> list[BlockHash]:
        """The chain of ``tokens`` under ``like``'s extra keys (None: no extra keys)."""
        shadow = Request(
            request_id, tokens, 1, cache_salt=like.cache_salt if like else None,
            lora_name=like.lora_name if like else None, mm_features=like.mm_features if like else (),
            hasher=self.hasher,
        )
        return shadow.block_hashes

    # -- classification -----------------------------------------------------------------------
    def _attribute(self, r: Request, num_hits: int, hashes: list[BlockHash], tokens: list[BlockHash] | None) -> None:
        rec = self.records
        if r.skip_reading_prefix_cache:
            rec.add_request(r, num_hits, self.block_size, skip=True, hashes=hashes)
            return
        bs = self.block_size
        ext = r.num_external_computed_tokens if self.tier is not None else 0
        first, cap = (num_hits + ext) // bs, (r.num_prompt_tokens - 1) // bs
        held = self.tier.held_blocks(r, num_hits, ext, first, cap) if self.tier is not None else {}
        if self.unitary and not self.full:
            blocks = self._count_unitary(r, hashes, tokens, first, cap, ext == 0, held)
            rec.add_request(r, num_hits, bs, blocks=blocks, ext=ext)
            return
        causes: list[int] = []
        rows: list[BlockRow] | None = [] if self.full else None
        for j in range(first, cap):
            if self.unitary:
                cpu = held.get(j)
                if cpu is not None and self.pool.cached_block_hash_to_block.get_one_block(hashes[j]) is None:
                    cause, row = self._classify_held(j, hashes[j], cpu)
                else:
                    cause, row = self._classify_key(r, hashes, tokens, j, j, 0, hashes[j], (j + 1) * bs,
                                                    j == first and ext == 0)
            else:
                cause, row = self._classify_groups(r, hashes, tokens, j, j == first)
            causes.append(cause)
            if rows is not None:
                rows.append(row)
        rec.add_request(r, num_hits, bs, causes=causes, rows=rows, hashes=hashes, ext=ext)

    def _classify_held(self, j: int, key: BlockKey, cpu: CpuBlock) -> tuple[int, BlockRow]:
        """A missed block the GPU does not cache but the CPU tier holds (attribution_tier)."""
        cause = CPU_PARTIAL_CHUNK if cpu.in_run else UNREACHABLE
        return cause, ((j, 0, key, cause, {"cpu_chunk": cpu.chunk, "cpu_state": cpu.state}) if self.full else None)

    def _count_unitary(
        self, r: Request, hashes: list[BlockHash], tokens: list[BlockHash] | None, first: int, cap: int,
        gpu_boundary: bool = True, held: dict[int, CpuBlock] | None = None,
    ) -> dict[int, int]:
        """Missed blocks per cause over ``[first, cap)`` for one full-attention group, by set
        operations on the chain's keys (which are distinct): the same rule as :meth:`_classify_key`,
        its oracle (a test compares the two). ``gpu_boundary``: ``first`` is the GPU hit's end (no
        CPU hit; EAGLE's dropped block); ``held``: the blocks the CPU tier holds (attribution_tier)."""
        if first >= cap:
            return {}
        keys = hashes[first:cap]
        out: dict[int, int] = {}
        cached = self.pool.cached_block_hash_to_block.keys() & keys  # each a C pass over keys
        if cached:
            if self.eagle and gpu_boundary and keys[0] in cached:
                out[EAGLE] = 1
            out[UNREACHABLE] = len(cached) - out.get(EAGLE, 0)
        if held:  # held by the CPU tier, not cached: before in_flight and evicted
            for j, cpu in held.items():
                if hashes[j] not in cached:
                    code = CPU_PARTIAL_CHUNK if cpu.in_run else UNREACHABLE
                    out[code] = out.get(code, 0) + 1
            cached = cached | {hashes[j] for j in held}
        flying: set[BlockHash] = set()
        claims = self.flight.claims
        if claims:
            claimed = claims.keys() & keys
            claimed -= cached
            if claimed:
                bs, pos = self.block_size, {k: first + i for i, k in enumerate(keys)}
                flying.update(k for k in claimed if self.flight.claimer_in_flight(k, (pos[k] + 1) * bs) is not None)
                if flying:
                    out[IN_FLIGHT] = len(flying)
        ev = self.evicted
        evicted = (ev.keys() & keys) if isinstance(ev, dict) else ev.intersection(keys)
        if evicted:
            evicted -= cached
            evicted -= flying
            out[EVICTED] = len(evicted)
        if (self.flight.tokens or tokens is not None) and sum(out.values()) < cap - first:
            rest = set(keys) - cached - flying - evicted
            pos = {k: first + i for i, k in enumerate(keys)}
            for k in rest:
                j = pos[k]
                iso = self._isolation(r, k, tokens[j] if tokens is not None else k, 0)
                if iso is not None:
                    out[iso[0]] = out.get(iso[0], 0) + 1
        out[COLD] = (cap - first) - sum(out.values())
        return out

    def _classify_groups(
        self, r: Request, hashes: list[BlockHash], tokens: list[BlockHash] | None, j: int, first: bool
    ) -> tuple[int, BlockRow]:
        """A scheduler block of a grouped layout: its needed group blocks (module docstring)."""
        sbs, hbs = self.block_size, self.hash_block_size
        boundary = (j + 1) * sbs
        best: tuple[int, BlockRow] | None = None  # the first cause among the uncached needed blocks
        fallback: tuple[int, BlockRow] | None = None  # every needed block is cached
        for gid, g in enumerate(self.groups):
            bs = g.block_size
            lo, hi = j * sbs // bs, boundary // bs
            if g.sliding_window is not None:
                lo = max(lo, hi - cdiv(g.sliding_window - 1, bs))
            k = bs // hbs
            for i in range(lo, hi):
                raw = (i + 1) * k - 1
                key = make_block_key(hashes[raw], gid)
                cause, row = self._classify_key(r, hashes, tokens, j, raw, gid, key, (i + 1) * bs, first)
                if cause == UNREACHABLE or cause == EAGLE:
                    if fallback is None:
                        fallback = (cause, row)
                elif best is None or cause < best[0]:  # cause codes follow the precedence order
                    best = (cause, row)
        found = best or fallback
        if found is None:  # pragma: no cover - every layout needs a group block in each span
            raise AssertionError(f"{r.request_id}: scheduler block {j} needs no group block")
        return found

    def _classify_key(
        self, r: Request, hashes: list[BlockHash], tokens: list[BlockHash] | None, j: int, raw: int, gid: int,
        key: BlockKey, end: int, first: bool,
    ) -> tuple[int, BlockRow]:
        """One needed block ``key`` (chain position ``raw`` at the hash block size, its last token
        ``end - 1``) of a missed scheduler block ``j``."""
        full = self.full
        cached = self.pool.cached_block_hash_to_block.get_one_block(key)
        if cached is not None:
            cause = EAGLE if first and self.eagle else UNREACHABLE
            return cause, (self._row_cached(j, gid, key, cause, cached.block_id) if full else None)
        h = hashes[raw]
        claimer = self.flight.claimer_in_flight(h, end)
        if claimer is not None:
            return IN_FLIGHT, ((j, gid, key, IN_FLIGHT, {"in_flight_by": claimer.request_id}) if full else None)
        if key in self.evicted:
            return EVICTED, (self._row_evicted(j, gid, key) if full else None)
        iso = self._isolation(r, h, tokens[raw] if tokens is not None else h, gid)
        if iso is not None:
            cause, other, producer = iso
            return cause, ((j, gid, key, cause, {"other_namespace": describe_namespace(other),
                                                 "other_request": producer}) if full else None)
        return COLD, ((j, gid, key, COLD, {}) if full else None)

    def _isolation(self, r: Request, h: BlockHash, t: BlockHash, gid: int) -> tuple[int, Namespace, str | None] | None:
        """``(cause, other namespace, its producer)`` if a token-equal block under other extra keys
        was produced (the caller checked that ``h`` itself never was), else None."""
        mine = namespace_of(r)
        if t is not h:  # r has extra keys: did the shared namespace (no extra keys) produce t?
            plain = make_block_key(t, gid)
            block = self.pool.cached_block_hash_to_block.get_one_block(plain)
            claimer = self.flight.claims.get(t)
            if block is not None or claimer is not None or plain in self.evicted:
                producer = claimer.request_id if claimer is not None else None
                if block is not None:
                    producer = self.cached_by.get(block.block_id, (None, producer))[1]
                elif isinstance(self.evicted, dict) and plain in self.evicted:
                    producer = self.evicted[plain][1]
                return ISOLATION_CODE[differing_key(mine, PLAIN)], PLAIN, producer
        for other_h, ns, rid in self.flight.tokens.get(t, ()):
            if other_h != h:
                return ISOLATION_CODE[differing_key(mine, ns)], ns, rid
        return None

    def _row_cached(self, j: int, gid: int, key: BlockKey, cause: int, block_id: int) -> BlockRow:
        step, by = self.cached_by.get(block_id, (None, None))
        return (j, gid, key, cause, {"cached_step": step, "cached_by": by})

    def _row_evicted(self, j: int, gid: int, key: BlockKey) -> BlockRow:
        ev = self.evicted
        assert isinstance(ev, dict)
        step, by, ev_step, ev_for, block_id, reason = ev[key]
        return (j, gid, key, EVICTED, {"cached_step": step, "cached_by": by, "evicted_step": ev_step,
                                       "evicted_for": ev_for, "evicted_block_id": block_id,
                                       "evict_reason": reason})
