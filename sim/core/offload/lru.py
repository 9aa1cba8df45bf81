"""The CPU tier's LRU policy (mirrors vLLM 0.33.0's ``LRUCachePolicy``, ``v1/kv_offload/cpu/policies/lru.py``),
on rank groups instead of vLLM's lazy min-heap.

Recency is a *rank* ``(major, minor)``, smallest evicted first (vLLM's numbering):

* a request gets a rank ``r`` (``_next_rank += 1``) at its first store or load access; a chunk it inserts or
  first touches gets ``(r, -position)``, and a touch only ever raises a rank -- so while a request runs, its
  chunks sit at its first-access rank, older requests' chunks go first, and within one request the tail
  (larger position) goes before the head;
* when the request finishes, its ``k`` resident keys get fresh ranks ``(m + 1, 0) .. (m + k, 0)``
  (``m = _next_rank``), tail first and head last, so the head becomes the most recent;
* a key inserted without a position gets ``(_next_rank += 1, 0)``.

vLLM evicts the smallest ranks among the evictable (ref_cnt 0), unprotected keys, in rank order (heap pops;
stale entries skipped, protected ones pushed back). Here the same order comes from *rank groups*
(``RankGroup``): a chunk's rank is ``(chunk.group.gid, chunk.minor)`` -- ``(r, -position)`` in its request's
group ``r``; for the ``i``-th key of a finish batch ``(m + 1, i)`` (vLLM: ``(m + 1 + i, 0)``) or, when the batch
is exactly the request's own group, that group renamed ``m + 1`` with its minors ``-position`` kept (the batch's
order *is* descending position); ``(n, 0)`` alone in group ``n`` without a position. This orders as vLLM's ranks
do: a finish batch takes the majors ``m + 1 .. m + k`` at once, so every other rank (request ranks included) has
a major outside that range and compares with the batch's keys on the major alone; inside a group the minors are
distinct and ordered as vLLM's ranks. A group keeps its evictable keys in a dict in rank order (descending for a
request's group, whose chunks arrive head to tail) while ``ordered``. Eviction walks the groups by id
(``_gids``) and each group's keys in order: the n smallest unprotected ranks, as vLLM's heap pops them, with no
stale entries (a finish renames or refills groups, no re-pushes).

Invariants (``check_integrity``): every resident chunk has a registered group whose ``population`` counts it;
the groups' ``keys`` are exactly the evictable (ref_cnt 0) keys, each in its chunk's group; ``_gids`` is sorted
and names exactly the registered groups (emptied ones are dropped when an eviction walks past them); an
``ordered`` group's keys are strictly monotone in its direction. Eviction never takes a pending (ref_cnt -1),
pinned (> 0) or protected chunk. Imports nothing from the project beyond this package.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

from sim.core.offload.policy import CachePolicy, ChunkStatus, OffloadKey, RankGroup, ReqContext, order_request_keys

Rank = tuple[int, int]


def _in_order(group: RankGroup) -> Iterator[OffloadKey]:
    """Query: a group's evictable keys, smallest rank first (when ordered)."""
    return iter(group.keys) if group.asc else reversed(group.keys)


class LRUCachePolicy(CachePolicy):
    """LRU over request-scoped ranks (see the module docstring)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        self._groups: dict[int, RankGroup] = {}
        self._gids: list[int] = []
        self._next_rank = 0

    # -- ranks and groups ---------------------------------------------------------------------
    def _request_rank(self, ctx: ReqContext) -> int:
        """The request's rank, assigned at its first access (vLLM ``_get_request_rank``)."""
        if ctx.lru_rank == 0:
            self._next_rank += 1
            ctx.lru_rank = self._next_rank
        return ctx.lru_rank

    def _new_group(self, gid: int, asc: bool, finished: bool = False) -> RankGroup:
        group = RankGroup(gid, asc, finished)
        self._groups[gid] = group
        insort(self._gids, gid)  # (usually at the end: the largest id)
        return group

    def _request_group(self, ctx: ReqContext) -> RankGroup:
        rank = self._request_rank(ctx)
        group = self._groups.get(rank)
        return group if group is not None else self._new_group(rank, False)

    def _add(self, key: OffloadKey, chunk: ChunkStatus) -> None:
        """``key`` became evictable, or moved, in ``chunk.group``."""
        group = chunk.group
        assert group is not None
        members = group.keys
        minor = chunk.minor
        if not members:
            group.bound = minor
            group.ordered = True
        elif group.ordered:
            if minor > group.bound if group.asc else minor < group.bound:
                group.bound = minor
            else:
                group.ordered = False
        members[key] = None

    def _move(self, key: OffloadKey, chunk: ChunkStatus, group: RankGroup, minor: int) -> None:
        """Give ``key`` the rank ``(group.gid, minor)``."""
        old = chunk.group
        assert old is not None
        old.population -= 1
        member = key in old.keys
        if member:
            del old.keys[key]
        chunk.group = group
        chunk.minor = minor
        group.population += 1
        if minor > group.top:
            group.top = minor
        if member:
            self._add(key, chunk)

    def _sort(self, group: RankGroup) -> None:
        chunks = self.chunks
        order = sorted(group.keys, key=lambda k: (chunks[k].minor, k), reverse=not group.asc)
        group.keys = dict.fromkeys(order)
        group.ordered = True
        if order:
            group.bound = chunks[order[-1]].minor

    # -- CachePolicy --------------------------------------------------------------------------
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def get_many(self, keys: Sequence[OffloadKey]) -> list[ChunkStatus | None]:
        chunks = self.chunks
        return [chunks.get(k) for k in keys]

    def keys(self) -> Iterable[OffloadKey]:
        return self.chunks.keys()

    def none_resident(self, keys: Sequence[OffloadKey]) -> bool:
        return self.chunks.keys().isdisjoint(keys)

    def observes_finish_sets(self) -> bool:
        return False  # a finish re-ranks the request's resident keys, however they were accessed

    def insert(self, key: OffloadKey, chunk: ChunkStatus, ctx: ReqContext) -> None:
        self.chunks[key] = chunk
        position = ctx.key_positions.get(key)
        if position is None:
            self._next_rank += 1
            group = self._new_group(self._next_rank, True)
            chunk.minor = 0
        else:
            group = self._request_group(ctx)
            chunk.minor = -position
        chunk.group = group
        group.population += 1
        if chunk.minor > group.top:
            group.top = chunk.minor
        if chunk.ref_cnt == 0:
            self._add(key, chunk)

    def insert_many(self, keys: Sequence[OffloadKey], chunks: Sequence[ChunkStatus], ctx: ReqContext) -> None:
        positions = ctx.key_positions
        if not keys:
            return
        try:
            minors = [-positions[k] for k in keys]
        except KeyError:  # a key without a position: one by one
            for key, chunk in zip(keys, chunks, strict=True):
                self.insert(key, chunk, ctx)
            return
        table, group = self.chunks, self._request_group(ctx)  # every key at (request rank, -position)
        ready: list[OffloadKey] = []
        top = group.top
        for key, chunk, minor in zip(keys, chunks, minors):
            table[key] = chunk
            chunk.group, chunk.minor = group, minor
            top = minor if minor > top else top
            if chunk.ref_cnt == 0:
                ready.append(key)
        group.top = top
        group.population += len(keys)
        for key in ready:
            self._add(key, self.chunks[key])

    def remove(self, key: OffloadKey) -> None:
        chunk = self.chunks.pop(key)
        assert chunk.group is not None
        chunk.group.population -= 1
        chunk.group.keys.pop(key, None)

    def on_request_access(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        # vLLM LRUCachePolicy.on_request_access: the request's rank is taken even when no key is
        # resident yet (its inserts then share it); a touch only raises a rank
        rank = self._request_rank(ctx)
        positions, chunks = ctx.key_positions, self.chunks
        group: RankGroup | None = None
        for key in keys:
            position = positions.get(key)
            if position is None:
                continue
            chunk = chunks.get(key)
            if chunk is None:
                continue
            old = chunk.group
            assert old is not None
            if old.gid > rank or (old.gid == rank and chunk.minor >= -position):
                continue
            if group is None:
                group = self._request_group(ctx)
            self._move(key, chunk, group, -position)

    def on_request_finished(
        self, keys: Sequence[OffloadKey], insertion_only: set[OffloadKey], reused: set[OffloadKey], ctx: ReqContext
    ) -> None:
        # fresh ranks tail first, head last (vLLM: touch(reversed(order_request_keys(...)))), so the
        # request's head chunk is the most recently used
        chunks = self.chunks
        found = [chunks.get(k) for k in keys]
        resident = [k for k, c in zip(keys, found) if c is not None]
        if not resident:
            return
        gid = self._next_rank + 1
        self._next_rank += len(resident)
        own = self._groups.get(ctx.lru_rank) if ctx.lru_rank else None
        if own is not None and self._finish_by_rename(
            keys, resident, [c for c in found if c is not None], own, gid, ctx
        ):
            return
        group = self._new_group(gid, True, True)
        for i, key in enumerate(k for k in reversed(order_request_keys(keys, ctx)) if k in chunks):
            self._move(key, chunks[key], group, i)

    def _finish_by_rename(
        self,
        keys: Sequence[OffloadKey],
        resident: list[OffloadKey],
        cs: list[ChunkStatus],
        own: RankGroup,
        gid: int,
        ctx: ReqContext,
    ) -> bool:
        """The finish batch of ``on_request_finished`` without moving the request's own group key by key,
        when that is exact; False (nothing changed) otherwise.

        With every key positioned (and none repeated) the batch runs in descending position. When it holds the
        whole own group (``own.population`` of its keys) and every other key of the batch sits before the
        group's first position, the batch is: the own group in its order (descending position = ascending
        minor), then the others -- so the group is renamed ``gid`` (its keys take ``gid .. gid + P - 1``) and
        only the others move, into group ``gid + P``."""
        chunks, of = self.chunks, [c.group for c in cs]
        num_own = of.count(own)
        if num_own != own.population:
            return False
        positions = ctx.key_positions
        key_set = set(keys)
        if len(key_set) != len(keys) or not positions.keys() >= key_set:
            return False
        others = [k for k, g in zip(resident, of, strict=True) if g is not own] if num_own < len(resident) else []
        if others and num_own:
            last_other = max([positions[k] for k in others])
            # own.top bounds the group's minors from above (-top: at most its first position)
            if last_other >= -own.top and last_other >= -max(
                [c.minor for c, g in zip(cs, of, strict=True) if g is own]
            ):
                return False
        if num_own:
            del self._groups[own.gid]
            self._gids.remove(own.gid)
            own.gid = gid
            own.finished = True
            self._groups[gid] = own
            self._gids.append(gid)  # gid exceeds every group id
        if others:
            rest = self._new_group(gid + num_own, True, True)
            others.sort(key=positions.__getitem__, reverse=True)
            for j, key in enumerate(others):
                self._move(key, chunks[key], rest, j)
        return True

    def evict_split(self, n: int, protected: set[OffloadKey]) -> tuple[list[OffloadKey], list[ChunkStatus]] | None:
        if n == 0:
            return [], []
        selected: list[OffloadKey] = []
        taken: list[tuple[RankGroup, int]] = []  # (group, keys taken from it)
        groups, gids = self._groups, self._gids
        walked = 0
        for gid in gids:
            walked += 1
            group = groups[gid]
            if not group.keys:
                continue
            if not group.ordered:
                self._sort(group)
            before = len(selected)
            if group.keys.keys().isdisjoint(protected):
                selected.extend(islice(_in_order(group), n - before))
            else:
                for key in _in_order(group):
                    if key not in protected:
                        selected.append(key)
                        if len(selected) == n:
                            break
            taken.append((group, len(selected) - before))
            if len(selected) == n:
                break
        if len(selected) < n:  # atomic: nothing changed (a sort keeps the order)
            return None
        chunks = self.chunks
        victims = [chunks.pop(key) for key in selected]
        start = 0
        for group, count in taken:
            members = group.keys
            if count == len(members):
                group.keys = {}
            elif count * 2 <= len(members) or not members.keys().isdisjoint(protected):
                for key in selected[start : start + count]:
                    del members[key]
            else:  # the victims are the group's first count keys in rank order: keep the rest
                group.keys = dict.fromkeys(islice(members, count, None) if group.asc else
                                           islice(members, len(members) - count))
            group.population -= count
            start += count
        # drop the groups the walk found without any chunk
        kept = [g for g in gids[:walked] if groups[g].population]
        if len(kept) < walked:
            for g in gids[:walked]:
                if not groups[g].population:
                    del groups[g]
            gids[:walked] = kept
        return selected, victims

    def mark_evictable(self, key: OffloadKey) -> None:
        self._add(key, self.chunks[key])

    def mark_evictable_many(self, keys: Sequence[OffloadKey], chunks: Sequence[ChunkStatus]) -> None:
        cs: list[ChunkStatus] = chunks if isinstance(chunks, list) else list(chunks)
        if not cs:
            return
        group, prev = cs[0].group, cs[0].minor
        assert group is not None
        members, asc = group.keys, group.asc
        if len(cs) > 1 and (not members or (group.ordered and (prev > group.bound if asc else prev < group.bound))):
            for c in cs[1:]:  # a run strictly in the group's order past its end is appended whole
                if c.group is not group or (c.minor <= prev if asc else c.minor >= prev):
                    break
                prev = c.minor
            else:
                for key in keys:
                    members[key] = None
                group.bound, group.ordered = prev, True
                return
        for key, chunk in zip(keys, cs):
            self._add(key, chunk)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        group = self.chunks[key].group
        assert group is not None
        del group.keys[key]

    # -- queries ------------------------------------------------------------------------------
    def _order_key(self, key: OffloadKey) -> tuple[int, int, OffloadKey]:
        chunk = self.chunks[key]
        assert chunk.group is not None
        return (chunk.group.gid, chunk.minor, key)

    def eviction_order(self) -> list[OffloadKey]:
        """Query: the evictable keys, next victim first."""
        return sorted((k for g in self._groups.values() for k in g.keys), key=self._order_key)

    def rank_order(self) -> list[OffloadKey]:
        """Query: every resident key, smallest rank first."""
        return sorted(self.chunks, key=self._order_key)

    @property
    def ranks(self) -> dict[OffloadKey, Rank]:
        """Query: every resident key's rank in vLLM's numbering (a finish batch's keys numbered in order from
        ``m + 1``: exact until one of them is evicted; the order always is)."""
        members: dict[int, list[OffloadKey]] = {}
        for key, chunk in self.chunks.items():
            assert chunk.group is not None
            members.setdefault(chunk.group.gid, []).append(key)
        out: dict[OffloadKey, Rank] = {}
        for gid, keys in members.items():
            keys.sort(key=self._order_key)
            finished = self._groups[gid].finished
            for i, key in enumerate(keys):
                out[key] = (gid + i, 0) if finished else (gid, self.chunks[key].minor)
        return out

    def check_integrity(self) -> None:
        """Query: assert the module docstring's invariants."""
        assert self._gids == sorted(self._groups), "group ids out of order"
        population: dict[int, int] = {}
        for key, chunk in self.chunks.items():
            group = chunk.group
            assert group is not None and self._groups.get(group.gid) is group, "a chunk's group is not registered"
            population[group.gid] = population.get(group.gid, 0) + 1
            assert (key in group.keys) == (chunk.ref_cnt == 0), "evictable keys and group members differ"
        num_ready = sum(1 for c in self.chunks.values() if c.ref_cnt == 0)
        assert sum(len(g.keys) for g in self._groups.values()) == num_ready, "a key sits in two groups"
        for gid, group in self._groups.items():
            assert group.gid == gid and group.population == population.get(gid, 0), "a group's population is off"
            assert all(c.minor <= group.top for c in self.chunks.values() if c.group is group), "top is too low"
            if group.ordered:
                minors = [self.chunks[k].minor for k in _in_order(group)]
                assert all(a < b for a, b in zip(minors, minors[1:], strict=False)), "an ordered group is out of order"
