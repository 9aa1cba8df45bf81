"""A router's precise cache view: a KV-event index (``sim.cluster.prefix_index``, compiled where
built) fed by KV events, matched with the engines' own hashing (mirrors what llm-d-kv-cache-manager's
``kvcache.Indexer`` and Dynamo's ``KvIndexer`` do: recompute vLLM's block hashes of the prompt --
same algorithm, block size and seed -- and look them up among the hashes the events announced).

Replicas with different hashing (a mixed fleet) are matched group by group, each with its own
hashes. Invariants: the view changes only through ``on_events`` and ``clear``; ``match`` returns
tokens (blocks x the replica's block size), capped at the prompt length minus one, as vLLM never
serves the last prompt token from cache. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sim.cluster.prefix_index import make_kv_event_index
from sim.cluster.router import ReplicaFacts, RouterRequest
from sim.core.hashing import BlockHasher, make_block_hasher
from sim.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent


class EventCacheView:
    """Per-replica resident blocks as the KV events announced them."""

    def __init__(self, facts: Sequence[ReplicaFacts]) -> None:
        self.facts = facts
        self.index = make_kv_event_index(len(facts))
        self._hashers: dict[tuple[str, int, int | str, int, bool, bool], BlockHasher] = {}
        self.group_of = [self._hasher(f) for f in facts]

    def _hasher(self, f: ReplicaFacts) -> BlockHasher:
        # a probe is hashed from token 0, so the resumed-scan rule does not matter (True)
        key = (f.hash_algo, f.block_size, f.hash_seed, f.num_hash_lookahead_tokens, True, f.tagged_extra_keys)
        h = self._hashers.get(key)
        if h is None:
            h = self._hashers[key] = make_block_hasher(*key)
        return h

    def on_events(self, replica: int, events: Sequence[KVCacheEvent]) -> None:
        """Changes state: apply one batch of a replica's events in order."""
        idx = self.index
        for ev in events:
            kind = type(ev)
            if kind is BlockRemoved:
                idx.remove(replica, ev.block_hashes)  # type: ignore[union-attr]
            elif kind is BlockStored:
                idx.store(replica, ev.block_hashes)  # type: ignore[union-attr]
            elif kind is AllBlocksCleared:
                idx.clear(replica)

    def clear(self, replica: int) -> None:
        """Changes state: forget the replica (it went down)."""
        self.index.clear(replica)

    def match_blocks(self, request: RouterRequest, candidates: Iterable[int]) -> dict[int, int]:
        """Query: leading blocks each candidate holds (absent: none), per its own hashing."""
        by_group: dict[int, list[int]] = {}
        for i in candidates:
            by_group.setdefault(id(self.group_of[i]), []).append(i)
        out: dict[int, int] = {}
        for members in by_group.values():
            hasher = self.group_of[members[0]]
            out.update(self.index.match(request.hashes(hasher), members))
        return out

    def hit_tokens(self, request: RouterRequest, replica: int, blocks: int) -> int:
        """``blocks`` leading blocks of ``replica`` as tokens vLLM could serve from cache."""
        bs = self.facts[replica].block_size
        return min(blocks * bs, (request.prompt_len - 1) // bs * bs)
