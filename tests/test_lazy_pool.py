"""A block pool grows with the blocks it touches (issue 38 item 1): a block's object (and, in the
compiled pool, its C state) is made when the block is first handed out, the never-used blocks
being a run of ids in the free queue (``sim.core.free_block_queue``, ``compiled_pool_queue.pxi``).

The spec is the pool that made every block up front (:func:`eager_pool`, the Python pool as it was
built before): the same block ids, free order, hits, evictions and KV events. Golden tests state
the free order before and after each kind of first touch; a property drives random operations on
the eager pool and on both lazy pools, with ``check_integrity`` after every step.
"""

from __future__ import annotations

import tracemalloc

import pytest
from conftest import EventLog, make_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compiled_pool import _apply, _Observer

from sim.core.block_pool import BlockPool
from sim.core.free_block_queue import FreeKVCacheBlockQueue
from sim.core.hashing import make_block_hasher
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_events import event_to_dict
from sim.core.pool_impl import compiled_pool_class

CompiledBlockPool = compiled_pool_class()
needs_compiled = pytest.mark.skipif(CompiledBlockPool is None, reason="the compiled pool is not built")
IMPLS = ["python", pytest.param("compiled", marks=needs_compiled)]

BS = 4
HASHER = make_block_hasher("sha256", BS, 0)


def eager_pool(num_blocks: int, enable_caching: bool = True, event_sink=None) -> BlockPool:
    """The Python pool as built before it grew lazily: every block made up front, the free queue
    every block in id order, block 0 popped as the null block."""
    pool = BlockPool(num_blocks, enable_caching, event_sink)
    pool.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
    pool.free_block_queue = FreeKVCacheBlockQueue(pool.blocks)
    pool.null_block = pool.free_block_queue.popleft()
    pool.null_block.is_null = True
    return pool


def lazy_pool(impl: str, num_blocks: int, enable_caching: bool = True, event_sink=None):
    cls = BlockPool if impl == "python" else CompiledBlockPool
    return cls(num_blocks, enable_caching, event_sink)


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def cache(pool, name: str, blocks, start: int = 0) -> list[bytes]:
    """Cache ``blocks`` as the full blocks of a request whose tokens count up from ``start``;
    returns their hashes."""
    req = make_request(HASHER, name, list(range(start, start + len(blocks) * BS)))
    pool.cache_full_blocks(req, blocks, 0, len(blocks), BS)
    return req.block_hashes


@pytest.mark.parametrize("impl", IMPLS)
def test_a_new_pool_makes_only_the_null_block(impl):
    pool = lazy_pool(impl, 10)
    assert ids(pool.blocks) == [0] and pool.blocks[0] is pool.null_block and pool.null_block.is_null
    assert pool.free_block_ids() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert pool.get_num_free_blocks() == 9 and pool.get_usage() == 0.0
    pool.check_integrity()


@pytest.mark.parametrize("impl", IMPLS)
def test_a_pop_makes_the_blocks_it_hands_out_in_id_order(impl):
    pool = lazy_pool(impl, 10)
    assert ids(pool.get_new_blocks(3)) == [1, 2, 3]
    assert ids(pool.blocks) == [0, 1, 2, 3]
    assert pool.free_block_ids() == [4, 5, 6, 7, 8, 9] and pool.get_num_free_blocks() == 6
    pool.check_integrity()


@pytest.mark.parametrize("impl", IMPLS)
def test_unhashed_free_goes_before_the_never_used_run(impl):
    """Freed without a hash -> the head, ahead of the never-used ids; the next pop takes them
    first, then the run, making only the ids it reaches."""
    pool = lazy_pool(impl, 10)
    a = pool.get_new_blocks(3)
    pool.free_blocks(reversed(a))
    assert pool.free_block_ids() == [3, 2, 1, 4, 5, 6, 7, 8, 9] and len(pool.blocks) == 4
    assert ids(pool.get_new_blocks(5)) == [3, 2, 1, 4, 5]
    assert len(pool.blocks) == 6 and pool.free_block_ids() == [6, 7, 8, 9]
    pool.check_integrity()


@pytest.mark.parametrize("impl", IMPLS)
def test_hashed_free_goes_after_the_run_and_a_hit_takes_it_from_there(impl):
    pool = lazy_pool(impl, 10)
    a = pool.get_new_blocks(2)
    hashes = cache(pool, "a", a)
    pool.free_blocks(reversed(a))
    assert pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2, 1]
    hits = pool.longest_cached_prefix(hashes, 2)
    assert ids(hits) == [1, 2]
    pool.touch(hits)
    assert pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9] and len(pool.blocks) == 3
    pool.check_integrity()


@pytest.mark.parametrize("impl", IMPLS)
def test_a_pop_through_the_run_reaches_the_tail_and_evicts_there(impl):
    log = EventLog()
    pool = lazy_pool(impl, 8, event_sink=log)
    a = pool.get_new_blocks(2)
    cache(pool, "a", a)
    pool.free_blocks(reversed(a))
    stored = log[0].block_hashes
    b = pool.get_new_blocks(1)
    pool.free_blocks(b)
    assert pool.free_block_ids() == [3, 4, 5, 6, 7, 2, 1] and len(pool.blocks) == 4
    assert ids(pool.get_new_blocks(7)) == [3, 4, 5, 6, 7, 2, 1]  # the run, then the tail
    assert len(pool.blocks) == 8 and pool.num_evictions == 2 and pool.num_cached_blocks == 0
    assert [e.block_hashes for e in log[1:]] == [[stored[1]], [stored[0]]]  # block 2, then 1: pop order
    pool.free_blocks(pool.blocks[1:4])  # once the run is gone: one queue, as before
    assert pool.free_block_ids() == [1, 2, 3]
    pool.check_integrity()


@pytest.mark.parametrize("impl", IMPLS)
def test_evict_blocks_skips_never_used_ids_and_refuses_ids_outside_the_pool(impl):
    pool = lazy_pool(impl, 10)
    cache(pool, "a", pool.get_new_blocks(1))
    pool.evict_blocks([9, 5, 1])
    assert pool.num_cached_blocks == 0 and len(pool.blocks) == 2 and pool.num_evictions == 1
    for bad in (10, -1):
        with pytest.raises(IndexError):
            pool.evict_blocks([bad])
    pool.check_integrity()


@pytest.mark.parametrize("impl", IMPLS)
def test_reset_prefix_cache_keeps_the_run_and_the_order(impl):
    pool = lazy_pool(impl, 10)
    a = pool.get_new_blocks(3)
    cache(pool, "a", a[:2])
    pool.free_blocks(reversed(a))
    order = pool.free_block_ids()
    assert order == [3, 4, 5, 6, 7, 8, 9, 2, 1]
    assert pool.reset_prefix_cache()
    assert pool.free_block_ids() == order and len(pool.blocks) == 4
    assert all(b.block_hash is None for b in pool.blocks) and pool.num_cached_blocks == 0
    pool.check_integrity()


@needs_compiled
def test_compiled_pool_grows_its_arrays_and_table_keeping_every_list():
    """Past its first arrays (64 blocks) the compiled pool grows the ring (with entries on both
    sides of the run) and rebuilds its table larger: every cached block is still found, and the
    state equals the eager pool's."""
    pools = (eager_pool(1000), CompiledBlockPool(1000), BlockPool(1000))
    chains: list[list[bytes]] = []
    for step in range(12):
        for p in pools:
            got = p.get_new_blocks(40)
            hashes = cache(p, f"c{step}", got[:30], start=1000 * step)
            p.free_blocks(reversed(got))  # 10 unhashed to the head, 30 hashed to the tail
            p.check_integrity()
        chains.append(hashes)
        assert len({tuple(p.free_block_ids()) for p in pools}) == 1
        assert len(pools[1].blocks) == len(pools[2].blocks) == 41 + 30 * step
    for hashes in chains:
        assert len({tuple(ids(p.longest_cached_prefix(hashes, 30))) for p in pools}) == 1
    assert ids(pools[1].longest_cached_prefix(chains[0], 30)) == list(range(1, 31))  # never reused


@needs_compiled
@pytest.mark.parametrize("num_blocks, sizes", [
    (40_000, [64, 128, 256, 512, 1024, 2048, 4096, 40_000]),  # 4,096 x 8 < 40,000 <= 8,193 x 8
    (20_000, [64, 128, 256, 512, 1024, 2048, 20_000]),  # 2,048 x 8 < 20,000 <= 4,096 x 8
    (1_000, [64, 128, 256, 512, 1_000]),  # never 2,048 blocks: doubling to its size
])
def test_the_growth_past_an_eighth_of_a_large_pool_takes_it_whole(num_blocks, sizes):
    """The compiled pool's state doubles with the blocks it hands out (pops of 50) until a growth
    reaches both 2,048 blocks and an eighth of the pool, which takes the whole pool at once (a pool
    that fills skips its last doublings and table rebuilds: ``WHOLE`` / ``JUMP_FROM``)."""
    pool = CompiledBlockPool(num_blocks)
    seen = [pool.state_blocks]
    while pool.get_num_free_blocks() >= 50:
        pool.get_new_blocks(50)
        if pool.state_blocks != seen[-1]:
            seen.append(pool.state_blocks)
    assert seen == sizes
    pool.check_integrity()


@needs_compiled
def test_a_pool_whose_table_is_huge_pages_equals_the_python_pool():
    """A pool of 40,000 blocks takes its whole table (131,072 slots, 4 MiB: its own huge-page
    mapping, ``huge_pages.pxi``) past 8,192 blocks, moving its keys there: pops of up to 3,000
    blocks, caching, hits and frees until it churns (evictions), then a reset (a new huge table):
    the free order, hits and counters of the Python pool at every step."""
    import random

    rng = random.Random(38)
    pools = (BlockPool(40_000), CompiledBlockPool(40_000))
    chains: list[list[bytes]] = []
    for step in range(30):
        n = rng.randint(500, 3000)
        req = make_request(HASHER, f"c{step}", list(range(10**6 * step, 10**6 * step + n * BS)))
        old = chains[rng.randrange(len(chains))] if chains else []
        for p in pools:
            hits = p.longest_cached_prefix(old, len(old))
            p.touch(hits)
            got = p.get_new_blocks(n)
            p.cache_full_blocks(req, got, 0, n * 4 // 5, BS)
            p.free_blocks(reversed(got))
            p.free_blocks(hits)
        chains.append(req.block_hashes[: n * 4 // 5])
        facts = [(p.free_block_ids(), p.num_cached_blocks, p.num_evictions) for p in pools]
        assert facts[0] == facts[1], step
    assert pools[1].state_blocks == 40_000 and pools[0].num_evictions > 0
    for chain in chains:
        assert ids(pools[0].longest_cached_prefix(chain, len(chain))) == ids(
            pools[1].longest_cached_prefix(chain, len(chain)))
    pools[1].check_integrity()
    assert [p.reset_prefix_cache() for p in pools] == [True, True]
    assert pools[1].free_block_ids() == pools[0].free_block_ids() and pools[1].num_cached_blocks == 0
    pools[1].check_integrity()


@pytest.mark.parametrize("impl", IMPLS)
def test_hits_and_frees_beside_the_run_compact_the_ring_in_order(impl):
    """Hit-and-free cycles leave stale ring entries after the run (the compiled pool never pops
    past it while it lasts), and touching a free block before it leaves one there, so its ring
    compacts again and again with blocks and stale entries on both sides of the run; the order
    stays the eager pool's."""
    pools = (eager_pool(500), lazy_pool(impl, 500))
    hashes = [cache(p, "a", p.get_new_blocks(10)) for p in pools][0]
    for p in pools:
        p.free_blocks(reversed(p.blocks[1:11]))
    for i in range(120):
        for p in pools:
            hits = p.longest_cached_prefix(hashes, 10 - i % 3)
            p.touch(hits)
            head = p.get_new_blocks(1 + i % 4)  # unhashed: back to the head, before the run
            p.free_blocks(head)
            p.touch(head[-1:])  # taken from before the run (legal, if no caller does it) ...
            p.free_blocks(head[-1:])  # ... and back at the head
            p.free_blocks(reversed(hits))
            p.check_integrity()
        assert pools[0].free_block_ids() == pools[1].free_block_ids(), i
    assert len(pools[1].blocks) == 15  # the null block, a's 10 and the 4 of the largest pop


def _pool_bytes(make) -> int:
    """Bytes ``make()``'s pool holds (tracemalloc: Python objects and the compiled pool's PyMem
    arrays), measured while it is alive."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pool = make()
        held = tracemalloc.get_traced_memory()[0] - before
        del pool
    finally:
        tracemalloc.stop()
    return held


@pytest.mark.parametrize("impl", IMPLS)
def test_a_pool_costs_the_blocks_it_handed_out_not_num_gpu_blocks(impl):
    """A pool of a million blocks that handed out 100 holds under 64 KiB, as one of 1,000 does."""
    def used(n: int):
        def make():
            pool = lazy_pool(impl, n)
            pool.free_blocks(pool.get_new_blocks(100))
            return pool
        return make

    big, small = _pool_bytes(used(1_000_000)), _pool_bytes(used(1_000))
    assert big < 64 << 10, big
    assert abs(big - small) < 4 << 10, (big, small)


_op = st.tuples(
    st.sampled_from(["new", "new", "new", "cache", "cache", "hit", "free", "free", "evict", "reset", "null",
                     "lookup"]),
    st.integers(0, 10**6),
    st.integers(0, 64),
)


def _blocks_state(pool) -> list[tuple]:
    return [(b.block_id, b.ref_cnt, b.block_hash, b.group_id, b.is_null) for b in pool.blocks]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    num_blocks=st.integers(2, 400),
    ops=st.lists(_op, max_size=120),
    grouped=st.booleans(),
    caching=st.sampled_from([True, True, True, False]),
    observed=st.booleans(),
)
def test_lazy_pools_equal_the_eager_pool_on_random_operations(num_blocks, ops, grouped, caching, observed):
    """Random pops (up to 64 blocks, so the compiled pool grows past its first arrays), caching,
    hits, frees, explicit evictions, resets and null-block touches: the same answers, free order,
    counters, KV events and observer calls as the eager pool; the lazy pools made exactly the
    blocks handed out, equal to the eager pool's, and the eager pool's others are untouched."""
    makers = [eager_pool, BlockPool] + ([CompiledBlockPool] if CompiledBlockPool is not None else [])
    logs = [EventLog() for _ in makers]
    pools = [make(num_blocks, caching, log) for make, log in zip(makers, logs)]
    observers = [_Observer() for _ in makers]
    if observed:
        for p, o in zip(pools, observers):
            p.observer = o
    holders: list[list] = [[] for _ in makers]
    for op, seed, k in ops:
        answers = [_apply(p, h, op, seed, k, "fast", grouped) for p, h in zip(pools, holders)]
        assert all(a == answers[0] for a in answers), (op, seed, k, answers)
        for p in pools:
            p.check_integrity()
        eager = pools[0]
        facts = [(p.free_block_ids(), p.get_num_free_blocks(), p.num_cached_blocks, p.num_evictions,
                  len(p.cached_block_hash_to_block), p.get_usage()) for p in pools]
        assert all(f == facts[0] for f in facts), (op, seed, k)
        made = len(pools[1].blocks)
        for p in pools[1:]:
            assert _blocks_state(p) == _blocks_state(eager)[:made], (op, seed, k)
        assert all(b.ref_cnt == 0 and b.block_hash is None for b in eager.blocks[made:])
        events = [[event_to_dict(e) for e in log] for log in logs]
        assert all(e == events[0] for e in events)
        assert all(o.calls == observers[0].calls for o in observers)
