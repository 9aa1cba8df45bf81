"""A router's precise cache view: a KV-event index (``sim.cluster.prefix_index``, compiled where
built) fed by KV events, matched with the engines' own hashing (mirrors what llm-d-kv-cache-manager's
``kvcache.Indexer`` and Dynamo's ``KvIndexer`` do: recompute vLLM's block hashes of the prompt --
same algorithm, block size and seed -- and look them up among the hashes the events announced).

Replicas with different hashing (a mixed fleet) are matched group by group, each with its own
hashes. The CPU offload tier's events (``medium="CPU"``, ``sim.core.offload.events``) go to a
second medium under the router's :class:`~sim.cluster.tier_index.LowerTierRule` when some replica
has a CPU tier and the router reads them (``rule``); else they are dropped, and a fleet without
tiers keeps the compiled GPU index. Invariants: the view changes only through ``on_events`` and
``clear``; ``match`` returns tokens (blocks x the replica's block size), capped at the prompt
length minus one, as vLLM never serves the last prompt token from cache. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

from sim.cluster.prefix_index import EventIndex, make_kv_event_index
from sim.cluster.router import ReplicaFacts, RouterRequest
from sim.cluster.tier_index import LowerTierRule, TieredEventIndex, TierMatch
from sim.core.hashing import BlockHasher, make_block_hasher
from sim.core.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

if TYPE_CHECKING:
    from sim.core.compiled_pool import RawEventBatch

_Raw: type[RawEventBatch] | None
try:  # a replica's events as raw words (sim.core.compiled_pool, sim.cluster.kv_event_pipeline)
    from sim.core.compiled_pool import EVENT_REMOVED, EVENT_STORED
    from sim.core.compiled_pool import RawEventBatch as _Raw
except ImportError:  # pragma: no cover - not built: batches are event objects only
    _Raw = None


class EventCacheView:
    """Per-replica resident blocks as the KV events announced them."""

    def __init__(self, facts: Sequence[ReplicaFacts], rule: LowerTierRule | None = None) -> None:
        self.facts = facts
        # both media when a replica has a CPU tier and the router reads its events
        self.tiers = TieredEventIndex(len(facts), rule) if rule is not None and any(f.cpu_tier for f in facts) else None
        self.index: EventIndex = self.tiers.gpu if self.tiers is not None else make_kv_event_index(len(facts))
        self._hashers: dict[tuple[str, int, int | str, int, bool, bool], BlockHasher] = {}
        self.group_of = [self._hasher(f) for f in facts]
        self.one_hasher = len({id(h) for h in self.group_of}) == 1  # (the common fleet: no grouping)
        self._apply = getattr(self.index, "apply", None)  # the compiled index's batch dispatch
        # a raw batch in C (one medium only: a cleared event then clears the one index)
        self._apply_raw = getattr(self.index, "apply_raw", None) if self.tiers is None else None

    def _hasher(self, f: ReplicaFacts) -> BlockHasher:
        # a probe is hashed from token 0, so the resumed-scan rule does not matter (True)
        key = (f.hash_algo, f.block_size, f.hash_seed, f.num_hash_lookahead_tokens, True, f.tagged_extra_keys)
        h = self._hashers.get(key)
        if h is None:
            h = self._hashers[key] = make_block_hasher(*key)
        return h

    def on_events(self, replica: int, events: Sequence[KVCacheEvent] | RawEventBatch) -> None:
        """Changes state: apply one batch of a replica's events in order. The compiled index
        applies runs of GPU stores and removals itself (``CompiledKVEventIndex.apply``: the same
        calls, dispatched in C); every other event goes through :meth:`_apply_one`. A raw batch
        (``sim.core.compiled_pool.RawEventBatch``: GPU events' kinds and hashes) makes the same
        calls: in C (``apply_raw``), or one per event here."""
        if _Raw is not None and isinstance(events, _Raw):
            if self._apply_raw is not None:
                self._apply_raw(replica, events.words)
                return
            for kind, hashes in events.runs():
                if kind == EVENT_STORED:
                    self.index.store(replica, hashes)
                elif kind == EVENT_REMOVED:
                    self.index.remove(replica, hashes)
                else:
                    self.clear(replica)
            return
        objects = cast("Sequence[KVCacheEvent]", events)
        apply = self._apply
        if apply is None or type(objects) is not list:
            for ev in objects:
                self._apply_one(replica, ev)
            return
        n = len(objects)
        i = apply(replica, objects, 0, BlockStored, BlockRemoved, MEDIUM_GPU)
        while i < n:
            self._apply_one(replica, objects[i])
            i = apply(replica, objects, i + 1, BlockStored, BlockRemoved, MEDIUM_GPU)

    def _apply_one(self, replica: int, ev: KVCacheEvent) -> None:
        """Changes state: apply one event (the Python dispatch; the oracle of ``apply``)."""
        idx = self.index
        kind = type(ev)
        if kind is BlockRemoved:
            if ev.medium == MEDIUM_GPU or ev.medium is None:  # type: ignore[union-attr]
                idx.remove(replica, ev.block_hashes)  # type: ignore[union-attr]
            elif self.tiers is not None:
                self.tiers.cpu.remove(replica, ev.block_hashes)  # type: ignore[union-attr]
        elif kind is BlockStored:
            if ev.medium == MEDIUM_GPU or ev.medium is None:  # type: ignore[union-attr]
                idx.store(replica, ev.block_hashes)  # type: ignore[union-attr]
            elif self.tiers is not None:
                self.tiers.on_cpu_store(replica, ev.block_hashes, ev.parent_block_hash,  # type: ignore[union-attr]
                                        len(ev.token_ids) > 0)  # type: ignore[union-attr]
        elif kind is AllBlocksCleared:
            self.clear(replica)

    def clear(self, replica: int) -> None:
        """Changes state: forget the replica (it went down, or reset its cache: every medium)."""
        if self.tiers is not None:
            self.tiers.clear(replica)
        else:
            self.index.clear(replica)

    def match_tiers(self, request: RouterRequest, candidates: Iterable[int]) -> dict[int, TierMatch]:
        """Query: each candidate's :class:`TierMatch` (absent: holds no block 0 on any medium); the
        GPU prefix alone, for every field, when the view has one medium."""
        if self.tiers is None:
            return {i: TierMatch(b, 0, b, b, 0) for i, b in self.match_blocks(request, candidates).items()}
        out: dict[int, TierMatch] = {}
        for hasher, members in self.groups(candidates):
            out.update(self.tiers.match(request.hashes(hasher), members))
        return out

    def match_blocks(self, request: RouterRequest, candidates: Iterable[int]) -> dict[int, int]:
        """Query: leading blocks each candidate holds (absent: none), per its own hashing; the
        prompt's hashes as ``RouterRequest.words`` made them (the compiled index reads an
        ``array('Q')`` in place)."""
        if self.one_hasher:
            return self.index.match(request.words(self.group_of[0]), candidates)
        out: dict[int, int] = {}
        for hasher, members in self.groups(candidates):
            out.update(self.index.match(request.words(hasher), members))
        return out

    def groups(self, candidates: Iterable[int]) -> list[tuple[BlockHasher, list[int]]]:
        """Query: ``candidates`` by hashing (a mixed fleet hashes each group its own way): each
        group's hasher with its members in ``candidates``' order, the groups in the order of
        their first members (one group when every replica hashes alike)."""
        if self.one_hasher:
            members = list(candidates)
            return [(self.group_of[0], members)] if members else []
        by_group: dict[int, list[int]] = {}
        for i in candidates:
            by_group.setdefault(id(self.group_of[i]), []).append(i)
        return [(self.group_of[members[0]], members) for members in by_group.values()]

    def hit_tokens(self, request: RouterRequest, replica: int, blocks: int) -> int:
        """``blocks`` leading blocks of ``replica`` as tokens vLLM could serve from cache."""
        bs = self.facts[replica].block_size
        return min(blocks * bs, (request.prompt_len - 1) // bs * bs)
