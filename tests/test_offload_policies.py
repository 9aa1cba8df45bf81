"""Golden tests of the CPU tier's policies and manager (vLLM 0.33.0 ``v1/kv_offload/cpu/``):
exact keys and eviction order, one rule per test, plus a hypothesis property that drives the manager
with random calls and checks its integrity after every step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.offload.arc import ARCCachePolicy
from sim.core.offload.lru import LRUCachePolicy
from sim.core.offload.manager import CPUOffloadingManager, LookupResult
from sim.core.offload.policy import ReqContext


def K(i: int) -> bytes:
    return bytes([i])


def ctx_for(rid: str, keys: list[bytes], tokens_per_chunk: int = 16) -> ReqContext:
    ctx = ReqContext(rid)
    for pos, k in enumerate(keys, 1):
        ctx.key_positions[k] = pos * tokens_per_chunk
    return ctx


def store(m: CPUOffloadingManager, ctx: ReqContext, keys: list[bytes]) -> list[bytes] | None:
    out = m.prepare_store(keys, ctx)
    if out is None:
        return None
    m.complete_store(out.keys_to_store)
    return out.evicted_keys


# -- LRU ---------------------------------------------------------------------------------------
def test_lru_request_rank_orders_tail_before_head() -> None:
    """While a request runs its chunks share its first-access rank, tail evicted first."""
    m = CPUOffloadingManager(3, "lru")
    a = ctx_for("a", [K(1), K(2), K(3)])
    store(m, a, [K(1), K(2), K(3)])
    assert isinstance(m.policy, LRUCachePolicy)
    assert m.policy.eviction_order() == [K(3), K(2), K(1)]
    assert m.policy.ranks == {K(1): (1, -16), K(2): (1, -32), K(3): (1, -48)}


def test_lru_older_request_evicted_first() -> None:
    """A later request's rank is larger: the older request's chunks go first."""
    m = CPUOffloadingManager(4, "lru")
    a, b = ctx_for("a", [K(1), K(2)]), ctx_for("b", [K(5), K(6)])
    store(m, a, [K(1), K(2)])
    store(m, b, [K(5), K(6)])
    assert m.policy.eviction_order() == [K(2), K(1), K(6), K(5)]  # type: ignore[attr-defined]
    c = ctx_for("c", [K(7), K(8)])
    assert store(m, c, [K(7), K(8)]) == [K(2), K(1)]


def test_lru_finish_reranks_tail_first_head_last() -> None:
    """on_request_finished gives fresh ranks tail first, so the head is the most recent."""
    m = CPUOffloadingManager(4, "lru")
    a, b = ctx_for("a", [K(1), K(2)]), ctx_for("b", [K(5), K(6)])
    store(m, a, [K(1), K(2)])
    store(m, b, [K(5), K(6)])
    m.on_request_finished(a)
    assert m.policy.ranks[K(2)] == (3, 0) and m.policy.ranks[K(1)] == (4, 0)  # type: ignore[attr-defined]
    assert m.policy.eviction_order() == [K(6), K(5), K(2), K(1)]  # type: ignore[attr-defined]


def test_lru_access_raises_rank_to_request_rank() -> None:
    """A ready resident offered again by a later request moves to that request's rank."""
    m = CPUOffloadingManager(4, "lru")
    store(m, ctx_for("a", [K(1), K(2)]), [K(1), K(2)])
    store(m, ctx_for("b", [K(5)]), [K(5)])
    c = ctx_for("c", [K(1)])
    out = m.prepare_store([K(1)], c)
    assert out is not None and out.keys_to_store == []
    assert m.policy.ranks[K(1)] == (3, -16)  # type: ignore[attr-defined]
    assert m.policy.eviction_order() == [K(2), K(5), K(1)]  # type: ignore[attr-defined]


def test_lru_pinned_and_pending_chunks_are_not_evicted() -> None:
    """A chunk being loaded (pinned) or stored (pending) is skipped; not enough -> None."""
    m = CPUOffloadingManager(2, "lru")
    a = ctx_for("a", [K(1), K(2)])
    store(m, a, [K(1)])
    m.prepare_load([K(1)], ctx_for("x", [K(1)]))
    out = m.prepare_store([K(2)], a)
    assert out is not None and out.keys_to_store == [K(2)]  # a free slot, K(2) pending
    assert m.lookup(K(2)) is LookupResult.HIT_PENDING
    assert m.prepare_store([K(3)], ctx_for("b", [K(3)])) is None  # nothing evictable
    m.complete_load([K(1)])
    assert m.prepare_store([K(3)], ctx_for("b", [K(3)])) is not None
    assert m.lookup(K(1)) is LookupResult.MISS


def test_offer_keys_are_protected_from_eviction() -> None:
    """Keys of the offer itself are never victims (prepare_store's protected set)."""
    m = CPUOffloadingManager(2, "lru")
    a = ctx_for("a", [K(1), K(2), K(3)])
    store(m, a, [K(1), K(2)])
    # K(2) is the next LRU victim but it is in the offer: K(1) goes instead
    assert store(m, a, [K(2), K(3)]) == [K(1)]


def test_allocation_failure_changes_nothing() -> None:
    """More chunks to store than free + evictable: None, no chunk allocated or evicted."""
    m = CPUOffloadingManager(2, "lru")
    a = ctx_for("a", [K(1), K(2), K(3)])
    assert m.prepare_store([K(1), K(2), K(3)], a) is None
    assert m.num_resident() == 0 and m.num_free_chunks() == 2


def test_freed_slots_reused_last_freed_first() -> None:
    """Fresh slots first, then freed ones in reverse free order (_free_list.pop())."""
    m = CPUOffloadingManager(2, "lru")
    store(m, ctx_for("a", [K(1), K(2)]), [K(1), K(2)])
    store(m, ctx_for("b", [K(3), K(4)]), [K(3), K(4)])  # evicts K(2) (slot 1) then K(1) (slot 0)
    ids = {k: m.policy.get(k).chunk_id for k in (K(3), K(4))}  # type: ignore[union-attr]
    assert ids == {K(3): 0, K(4): 1}


def test_store_threshold_filters_new_keys() -> None:
    """With store_threshold 2 a chunk is stored at its second offer."""
    m = CPUOffloadingManager(4, "lru", store_threshold=2)
    a = ctx_for("a", [K(1)])
    out = m.prepare_store([K(1)], a)
    assert out is not None and out.keys_to_store == [] and m.stats.stores_skipped == 1
    out = m.prepare_store([K(1)], ctx_for("b", [K(1)]))
    assert out is not None and out.keys_to_store == [K(1)]


# -- ARC ---------------------------------------------------------------------------------------
def test_arc_insert_goes_to_t1_and_reuse_promotes_to_t2() -> None:
    """Inserted chunks live in T1; a request that reuses one moves it to T2 at finish."""
    m = CPUOffloadingManager(4, "arc")
    p = m.policy
    assert isinstance(p, ARCCachePolicy)
    a = ctx_for("a", [K(1), K(2)])
    store(m, a, [K(1), K(2)])
    m.on_request_finished(a)
    assert list(p.t1) == [K(2), K(1)] and not p.t2  # tail first: the head is the MRU
    b = ctx_for("b", [K(1)])
    m.prepare_load([K(1)], b)
    m.complete_load([K(1)])
    m.on_request_finished(b)
    assert list(p.t1) == [K(2)] and list(p.t2) == [K(1)]


def test_arc_falls_back_to_t2_when_t1_is_protected() -> None:
    """T1 is chosen (|T1| >= target 0) but its chunks are the offer's own: T2's LRU goes."""
    m = CPUOffloadingManager(3, "arc")
    p = m.policy
    assert isinstance(p, ARCCachePolicy)
    a = ctx_for("a", [K(1)])
    store(m, a, [K(1)])
    m.on_request_finished(a)
    b = ctx_for("b", [K(1)])
    m.prepare_load([K(1)], b)
    m.complete_load([K(1)])
    m.on_request_finished(b)  # K(1) in T2
    s = ctx_for("s", [K(5), K(6), K(7)])
    assert store(m, s, [K(5), K(6)]) == []
    assert store(m, s, [K(5), K(6), K(7)]) == [K(1)]
    assert list(p.b2) == [K(1)] and not p.b1


def test_arc_scan_victims_leave_t2_alone() -> None:
    """A second scan evicts the first scan's T1 chunks (into B1), not T2's."""
    m = CPUOffloadingManager(3, "arc")
    p = m.policy
    assert isinstance(p, ARCCachePolicy)
    a = ctx_for("a", [K(1)])
    store(m, a, [K(1)])
    m.on_request_finished(a)
    b = ctx_for("b", [K(1)])
    m.prepare_load([K(1)], b)
    m.complete_load([K(1)])
    m.on_request_finished(b)
    s1 = ctx_for("s1", [K(5), K(6)])
    store(m, s1, [K(5), K(6)])
    m.on_request_finished(s1)
    s2 = ctx_for("s2", [K(8), K(9)])
    assert store(m, s2, [K(8), K(9)]) == [K(6), K(5)]
    assert list(p.b1) == [K(6), K(5)] and list(p.t2) == [K(1)]


def test_arc_b1_ghost_hit_raises_target() -> None:
    """A store miss on a B1 ghost raises target_t1 by max(1, |B2|/|B1|)."""
    m = CPUOffloadingManager(1, "arc")
    p = m.policy
    assert isinstance(p, ARCCachePolicy)
    store(m, ctx_for("a", [K(1)]), [K(1)])
    store(m, ctx_for("b", [K(2)]), [K(2)])  # K(1) -> B1
    assert list(p.b1) == [K(1)] and p.target_t1_size == 0
    store(m, ctx_for("c", [K(1)]), [K(1)])
    assert p.target_t1_size == 1 and K(1) not in p.b1 and list(p.b1) == [K(2)]


def test_arc_b2_ghost_hit_lowers_target() -> None:
    """A store miss on a B2 ghost lowers target_t1 (never below 0)."""
    p = ARCCachePolicy(4)
    p.target_t1_size = 3.0
    p.b2[K(9)] = None
    p.on_store_miss([K(9)], ReqContext("x"))
    assert p.target_t1_size == 2.0


# -- the manager's integrity under random calls ------------------------------------------------
OPS = st.lists(
    st.tuples(st.sampled_from(["store", "complete", "load", "unload", "finish"]), st.integers(0, 5),
              st.lists(st.integers(0, 11), min_size=1, max_size=5)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(policy=st.sampled_from(["lru", "arc"]), cap=st.integers(1, 6), ops=OPS)
def test_manager_integrity_under_random_calls(policy: str, cap: int, ops: list) -> None:
    m = CPUOffloadingManager(cap, policy)
    ctxs = [ctx_for(f"r{i}", [K(j) for j in range(12)]) for i in range(6)]
    pending: list[list[bytes]] = []
    loading: list[list[bytes]] = []
    for op, ri, raw in ops:
        keys = list(dict.fromkeys(K(j) for j in raw))
        ctx = ctxs[ri]
        if op == "store" and not (isinstance(ctx.access, object) and getattr(ctx.access, "finished", False)):
            out = m.prepare_store(keys, ctx)
            if out is not None and out.keys_to_store:
                pending.append(out.keys_to_store)
        elif op == "complete" and pending:
            m.complete_store(pending.pop(0))
        elif op == "load" and not getattr(ctx.access, "finished", False):
            ready = [k for k in keys if m.lookup(k) is LookupResult.HIT]
            if ready:
                m.prepare_load(ready, ctx)
                loading.append(ready)
        elif op == "unload" and loading:
            m.complete_load(loading.pop(0))
        elif op == "finish":
            m.on_request_finished(ctx)
        m.check_integrity()
