"""The CPU tier's fast structures equal their oracles call for call: the manager with batched policy
calls over the rank-group LRU (``sim.core.offload.lru``) against the per-key manager over vLLM
0.33.0's heap LRU as written (``tests/offload_manager_reference.py``,
``sim.core.offload.lru_reference``), and the same for ARC. Random stores (some keys without a
position), completions in any order, loads, unloads and finishes; every prepare_store answer (the
keys stored, the victims in order, None), every lookup and the whole eviction order must agree."""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from offload_manager_reference import CPUOffloadingManager as ReferenceManager

from sim.core.offload.lru import LRUCachePolicy
from sim.core.offload.lru_reference import HeapLRUCachePolicy
from sim.core.offload.manager import CPUOffloadingManager
from sim.core.offload.policy import ReqContext

NUM_KEYS = 16
NUM_REQS = 24


def K(i: int) -> bytes:
    return bytes([i])


def _contexts(unpositioned: set[tuple[int, int]]) -> list[ReqContext]:
    out = []
    for r in range(NUM_REQS):
        ctx = ReqContext(f"r{r}")
        for j in range(NUM_KEYS):
            if (r, j) not in unpositioned:
                ctx.key_positions[K(j)] = (j + 1) * 16
        out.append(ctx)
    return out


UNPOSITIONED = st.sets(st.tuples(st.integers(0, 3), st.integers(0, NUM_KEYS - 1)), max_size=12)  # requests 0-3
OPS = st.lists(
    st.tuples(
        st.sampled_from(["store", "store", "store", "complete", "complete", "load", "unload", "finish"]),
        st.integers(0, NUM_REQS - 1),
        st.lists(st.integers(0, NUM_KEYS - 1), min_size=1, max_size=8),
        st.integers(0, 7),
    ),
    min_size=10,
    max_size=120,
)


def _rank_order(p: LRUCachePolicy | HeapLRUCachePolicy) -> list[bytes]:
    """Every resident key, smallest rank first (the heap's ranks are vLLM's own numbering)."""
    if isinstance(p, LRUCachePolicy):
        return p.rank_order()
    return sorted(p.chunks, key=lambda k: (p.ranks[k], k))


def _state(m: Any) -> tuple:
    p = m.policy
    if isinstance(p, LRUCachePolicy | HeapLRUCachePolicy):
        order: Any = (p.eviction_order(), _rank_order(p), p._next_rank)
    else:
        order = (list(p.t1), list(p.t2), list(p.b1), list(p.b2), p.target_t1_size)
    chunks = {k: (c.chunk_id, c.ref_cnt) for k in p.keys() if (c := p.get(k)) is not None}
    free = [c if isinstance(c, int) else c.chunk_id for c in m.free_list]
    return order, chunks, m.num_evictable, m.num_write_pending, free, m.num_allocated


def _drive(policy: str, cap: int, threshold: int, unpositioned: set[tuple[int, int]], ops: list) -> None:
    new = CPUOffloadingManager(cap, policy, threshold)
    ref = ReferenceManager(cap, policy, threshold)
    ctx_new, ctx_ref = _contexts(unpositioned), _contexts(unpositioned)
    finished: set[int] = set()
    pending: list[list[bytes]] = []
    loading: list[list[bytes]] = []
    for op, ri, raw, pick in ops:
        keys = list(dict.fromkeys(K(j) for j in (sorted(raw) if pick % 2 else raw)))  # offers run head to tail
        if op == "store" and ri not in finished:
            a, b = new.prepare_store(keys, ctx_new[ri]), ref.prepare_store(keys, ctx_ref[ri])
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert (a.keys_to_store, a.evicted_keys) == (b.keys_to_store, b.evicted_keys)
                if a.keys_to_store:
                    pending.append(a.keys_to_store)
        elif op == "complete" and pending:
            job = pending.pop(pick % len(pending))
            new.complete_store(job)
            ref.complete_store(job)
        elif op == "load" and ri not in finished:
            ready = [k for k in keys if new.lookup(k).name == "HIT"]
            assert ready == [k for k in keys if ref.lookup(k).name == "HIT"]
            if ready:
                new.prepare_load(ready, ctx_new[ri])
                ref.prepare_load(ready, ctx_ref[ri])
                loading.append(ready)
        elif op == "unload" and loading:
            job = loading.pop(pick % len(loading))
            new.complete_load(job)
            ref.complete_load(job)
        elif op == "finish":
            new.on_request_finished(ctx_new[ri])
            ref.on_request_finished(ctx_ref[ri])
            finished.add(ri)
        assert [new.lookup(K(j)).name for j in range(NUM_KEYS)] == [ref.lookup(K(j)).name for j in range(NUM_KEYS)]
        assert _state(new) == _state(ref)
        new.check_integrity()
    assert astuple(new.stats) == astuple(ref.stats)


@settings(max_examples=1000, deadline=None)
@given(
    policy=st.sampled_from(["lru", "arc"]),
    cap=st.integers(1, 10),
    threshold=st.sampled_from([0, 0, 2]),
    unpositioned=UNPOSITIONED,
    ops=OPS,
)
def test_tier_equals_the_reference_under_random_calls(
    policy: str, cap: int, threshold: int, unpositioned: set[tuple[int, int]], ops: list
) -> None:
    _drive(policy, cap, threshold, unpositioned, ops)


POLICY_OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "insert", "ready", "pin", "unpin", "access", "finish", "remove", "evict"]),
        st.integers(0, NUM_REQS - 1),
        st.lists(st.integers(0, NUM_KEYS - 1), max_size=8),
        st.integers(0, 7),
    ),
    max_size=100,
)


@settings(max_examples=300, deadline=None)
@given(unpositioned=UNPOSITIONED, ops=POLICY_OPS)
def test_lru_policy_equals_the_heap_under_direct_calls(unpositioned: set[tuple[int, int]], ops: list) -> None:
    """The policy alone, called directly in any legal order (repeated keys in a finish, chunks
    inserted ready, pins, removals, evictions with random protected sets)."""
    from sim.core.offload.policy import ChunkStatus

    new, ref = LRUCachePolicy(NUM_KEYS), HeapLRUCachePolicy(NUM_KEYS)
    ctx_new, ctx_ref = _contexts(unpositioned), _contexts(unpositioned)
    ref_cnt: dict[bytes, int] = {}
    for op, ri, raw, pick in ops:
        keys = [K(j) for j in raw] if pick % 3 == 0 else list(dict.fromkeys(K(j) for j in raw))  # repeats too
        for k in dict.fromkeys(keys):
            if op == "insert" and k not in ref_cnt:
                ready = (pick + raw[0]) % 2
                ref_cnt[k] = 0 if ready else -1
                for p, c in ((new, ctx_new), (ref, ctx_ref)):
                    chunk = ChunkStatus(0)
                    chunk.ref_cnt = ref_cnt[k]
                    p.insert(k, chunk, c[ri])
            elif op == "ready" and ref_cnt.get(k) == -1:
                ref_cnt[k] = 0
                for p in (new, ref):
                    p.chunks[k].ref_cnt = 0
                    p.mark_evictable(k)
            elif op == "pin" and ref_cnt.get(k, -1) >= 0:
                if ref_cnt[k] == 0:
                    new.mark_non_evictable(k)
                    ref.mark_non_evictable(k)
                ref_cnt[k] += 1
                new.chunks[k].ref_cnt = ref.chunks[k].ref_cnt = ref_cnt[k]
            elif op == "unpin" and ref_cnt.get(k, 0) > 0:
                ref_cnt[k] -= 1
                new.chunks[k].ref_cnt = ref.chunks[k].ref_cnt = ref_cnt[k]
                if ref_cnt[k] == 0:
                    new.mark_evictable(k)
                    ref.mark_evictable(k)
            elif op == "remove" and k in ref_cnt:
                new.remove(k)
                ref.remove(k)
                del ref_cnt[k]
        if op == "access":
            new.on_request_access(keys, ctx_new[ri])
            ref.on_request_access(keys, ctx_ref[ri])
        elif op == "finish":
            new.on_request_finished(keys, set(), set(), ctx_new[ri])
            ref.on_request_finished(keys, set(), set(), ctx_ref[ri])
        elif op == "evict":
            a, b = new.evict(pick % 5, set(keys)), ref.evict(pick % 5, set(keys))
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert [k for k, _ in a] == [k for k, _ in b]
                for k, _ in a:
                    del ref_cnt[k]
        assert new.eviction_order() == ref.eviction_order()
        assert _rank_order(new) == _rank_order(ref) and new._next_rank == ref._next_rank
        new.check_integrity()


def _ready(p: LRUCachePolicy | HeapLRUCachePolicy, ctx: ReqContext, keys: list[bytes]) -> None:
    from sim.core.offload.policy import ChunkStatus

    for k in keys:
        chunk = ChunkStatus(0)
        chunk.ref_cnt = 0
        p.insert(k, chunk, ctx)


def test_finish_renames_only_a_group_that_is_exactly_the_batch() -> None:
    """A finish whose resident keys are the request's whole group renames it; a finish that leaves
    one of the group's keys out (or takes another group's key) re-ranks key by key -- both as vLLM."""
    for finish_keys in ([K(1), K(2)], [K(1), K(3)], [K(2)]):
        orders = []
        for p in (LRUCachePolicy(8), HeapLRUCachePolicy(8)):
            a, b = _contexts(set())[:2]
            _ready(p, a, [K(1), K(2)])
            _ready(p, b, [K(3)])
            p.on_request_finished(finish_keys, set(), set(), a)
            orders.append((p.eviction_order(), p._next_rank))
        assert orders[0] == orders[1], finish_keys


def test_finish_without_every_position_keeps_the_observation_order() -> None:
    """vLLM sorts a finished request's keys by position only when every key has one; otherwise
    the batch keeps the given order (reversed), which the group rename must not replace."""
    orders = []
    for p in (LRUCachePolicy(8), HeapLRUCachePolicy(8)):
        a = _contexts({(0, 9)})[0]  # K(9) has no position in request 0
        _ready(p, a, [K(2), K(1)])  # observed tail first
        p.on_request_finished([K(2), K(1), K(9)], set(), set(), a)
        orders.append(p.eviction_order())
    assert orders[0] == orders[1]


def test_finish_with_a_shared_head_in_a_later_group() -> None:
    """A request whose head chunks were re-ranked by another request's later finish (a shared
    prefix) finishes with them: renamed own group first, then the head -- or, with a foreign chunk
    between its own ones, key by key; both as vLLM's heap."""
    for foreign in ([K(1), K(2)], [K(2)], [K(1), K(3)]):
        orders = []
        for p in (LRUCachePolicy(8), HeapLRUCachePolicy(8)):
            a, b, c = _contexts(set())[:3]
            _ready(p, a, foreign)  # a stores the shared chunks ...
            _ready(p, b, [K(j) for j in range(1, 6) if K(j) not in foreign])  # ... b the rest
            p.on_request_access([K(j) for j in range(1, 6)], b)
            p.on_request_finished(foreign, set(), set(), a)  # the shared chunks now rank after b
            p.on_request_finished([K(j) for j in range(1, 6)], set(), set(), b)
            _ready(p, c, [K(9)])
            orders.append((p.eviction_order(), p._next_rank, p.evict(3, set())))
        assert [o[:2] for o in orders[0:1]] == [o[:2] for o in orders[1:2]], foreign
        assert [k for k, _ in orders[0][2] or []] == [k for k, _ in orders[1][2] or []]
