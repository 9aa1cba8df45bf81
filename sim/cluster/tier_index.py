"""A router's KV-event index with two media: the GPU pool's blocks and the CPU offload tier's.

vLLM 0.33.0 publishes the CPU tier's stores and evictions as ``BlockStored`` / ``BlockRemoved``
with ``medium="CPU"`` (``sim.core.offload.events``): by default a *placeholder* per chunk (the hash
of the chunk's last block, no tokens), or, with ``self_describing_kv_events``, the chunk's block
hashes with their tokens. What a router makes of them is the router's own rule, so the index
keeps the media apart and answers per medium:

* :meth:`TieredEventIndex.on_cpu_store` takes a CPU ``BlockStored`` the way the router's ingest
  does (:class:`LowerTierRule`): llm-d's ``kvevents.Pool`` (``llm-d/llm-d-kv-cache``
  ``pkg/kvevents/pool.go``) adds a tokenless store to the blocks its engine keys already name
  (``handleDeviceTierUpdate``: ``index.GetRequestKey`` must find the key's mapping, which exists
  while some pod holds the block on some tier -- ``in_memory.go`` drops it when an eviction leaves
  the block empty), and a store with tokens whose parent it can resolve; Dynamo's lower-tier
  indexers (``ai-dynamo/dynamo`` ``lib/kv-router/src/indexer/lower_tier_indexers.rs``) need the
  self-describing payload (Dynamo's offloading support matrix: "OffloadingConnector +
  self-describing KV events") and drop a tokenless one;
* :meth:`TieredEventIndex.match` walks a request's hashes once and gives per replica a
  :class:`TierMatch`: the leading blocks on GPU (the device prefix), the CPU run right after it
  (Dynamo's host continuation, ``query_lower_tiers``: a worker that matched N device blocks starts
  the host walk at block N, one with none from the root), and the leading blocks held on either
  medium with how many of them are on GPU (llm-d's ``LongestPrefixScorer``: a pod stays in the
  chain while it holds each block on some tier, each block weighted by its best tier).

Both media use :class:`sim.cluster.prefix_index.KVEventIndex` (set semantics, per replica); an
untiered fleet never builds this index (``EventCacheView`` keeps the compiled one then). Cost:
O(blocks matched x replicas) per match. Imports nothing but this package and ``sim.core`` leaves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sim.cluster.prefix_index import KVEventIndex, mask_of
from sim.core.kv_events import BlockRemoved, BlockStored, KVCacheEvent


@dataclass(frozen=True, slots=True)
class LowerTierRule:
    """How a router ingests CPU-tier events: ``tokenless`` -- a store without tokens names blocks by
    their engine keys (llm-d resolves them, Dynamo drops them); ``parent_check`` -- a store with
    tokens is dropped when its parent block is unknown (llm-d's ``GetRequestKey`` of the parent)."""

    tokenless: bool
    parent_check: bool


LLM_D = LowerTierRule(tokenless=True, parent_check=True)
DYNAMO = LowerTierRule(tokenless=False, parent_check=False)
ANY = LowerTierRule(tokenless=True, parent_check=False)  # every CPU store counts (Mooncake's view)


@dataclass(frozen=True, slots=True)
class TierMatch:
    """One replica's match: ``gpu`` leading blocks on GPU; ``host`` CPU blocks right after them;
    ``chain`` leading blocks on GPU or CPU, ``chain_gpu`` / ``chain_cpu`` of them on GPU / CPU
    (a block on both counts in both)."""

    gpu: int
    host: int
    chain: int
    chain_gpu: int
    chain_cpu: int


class TieredEventIndex:
    """GPU and CPU residency per replica from KV events (see the module docstring)."""

    def __init__(self, num_replicas: int, rule: LowerTierRule) -> None:
        self.gpu = KVEventIndex(num_replicas)
        self.cpu = KVEventIndex(num_replicas)
        self.rule = rule

    def known(self, h: int) -> bool:
        """Query: some replica holds ``h`` on some medium (llm-d keeps the engine key's mapping)."""
        return h in self.gpu.forward or h in self.cpu.forward

    def on_cpu_store(self, replica: int, hashes: list[int], parent: int | None, has_tokens: bool) -> None:
        """Changes state: a CPU ``BlockStored`` under the router's rule."""
        if not has_tokens:
            if self.rule.tokenless:
                self.cpu.store(replica, [h for h in hashes if self.known(h)] if self.rule.parent_check else hashes)
            return
        if self.rule.parent_check and parent is not None and not self.known(parent):
            return  # llm-d: "Failed to get request key for parent block" -> the event is skipped
        self.cpu.store(replica, hashes)

    def clear(self, replica: int) -> None:
        """Changes state: ``AllBlocksCleared`` (every medium: llm-d's ``Index.Clear``) or the replica
        left the pool."""
        self.gpu.clear(replica)
        self.cpu.clear(replica)

    def match(self, hashes: Sequence[int], candidates: Iterable[int]) -> dict[int, TierMatch]:
        """Query: per candidate holding block 0 on some medium, its :class:`TierMatch`."""
        gfwd, cfwd = self.gpu.forward, self.cpu.forward
        active = mask_of(candidates)
        on_gpu = active  # replicas whose device prefix is still running
        chain_gpu: dict[int, int] = {}
        chain_cpu: dict[int, int] = {}
        gpu_prefix: dict[int, int] = {}
        chain: dict[int, int] = {}
        n = len(hashes)
        for i, h in enumerate(hashes):
            g = gfwd.get(h, 0) & active
            c = cfwd.get(h, 0) & active
            held = g | c
            for r in _bits(active & ~held):
                chain[r] = i
            ended = on_gpu & ~g
            for r in _bits(ended):
                gpu_prefix[r] = i
            on_gpu &= g
            for r in _bits(g):
                chain_gpu[r] = chain_gpu.get(r, 0) + 1
            for r in _bits(c):
                chain_cpu[r] = chain_cpu.get(r, 0) + 1
            active = held
            if not active:
                break
        for r in _bits(active):
            chain[r] = n
        for r in _bits(on_gpu):
            gpu_prefix[r] = n
        out: dict[int, TierMatch] = {}
        for r, length in chain.items():
            if length == 0:
                continue
            d = gpu_prefix.get(r, 0)
            out[r] = TierMatch(d, self._host_run(r, hashes, d), length, chain_gpu.get(r, 0), chain_cpu.get(r, 0))
        return out

    def _host_run(self, replica: int, hashes: Sequence[int], start: int) -> int:
        """Query: CPU blocks of ``replica`` from block ``start`` on, consecutively."""
        bit = 1 << replica
        cfwd = self.cpu.forward
        k = start
        while k < len(hashes) and cfwd.get(hashes[k], 0) & bit:
            k += 1
        return k - start


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class StoreIndex:
    """A fleet's shared KV store as a router sees it from the store's KV events (medium
    ``"STORAGE"``, ``sim.cluster.kv_store``): one set of block hashes for the whole fleet, whichever
    replica published the event (the store has one residency; its events leave through whichever
    replica ends a step next). A ``BlockStored`` adds its hashes, a ``BlockRemoved`` drops them."""

    def __init__(self) -> None:
        self.held: set[int] = set()

    def on_events(self, events: Iterable[KVCacheEvent], medium: str) -> None:
        """Changes state: apply the events of ``medium`` among ``events``, in order."""
        for ev in events:
            if isinstance(ev, BlockStored) and ev.medium == medium:
                self.held.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved) and ev.medium == medium:
                self.held.difference_update(ev.block_hashes)

    def run_from(self, hashes: Sequence[int], start: int) -> int:
        """Query: how many of ``hashes`` from ``start`` on the store holds consecutively (the run a
        replica's connector would load after its GPU hit of ``start`` blocks)."""
        held = self.held
        k = start
        while k < len(hashes) and hashes[k] in held:
            k += 1
        return k - start
