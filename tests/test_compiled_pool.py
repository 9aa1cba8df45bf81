"""The compiled block pool against its oracle, the Python pool: the same random operation sequences
on both must give identical block ids, free order, hits, evictions, KV events, duplicates, groups
and null-block ref counts, with ``check_integrity`` after every step (the compiled one also checks
its C structures); and whole scheduler runs must be identical step for step."""

from __future__ import annotations

import pytest
from conftest import EventLog, drive, make_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_properties import build, check_step, scenarios

from sim.core.block_pool import BlockPool
from sim.core.hashing import make_block_hasher
from sim.core.kv_events import event_to_dict
from sim.core.pool_impl import compiled_pool_class, make_block_pool

CompiledBlockPool = compiled_pool_class()
pytestmark = pytest.mark.skipif(CompiledBlockPool is None, reason="the compiled pool is not built")

BS = 4
HASHERS = {algo: make_block_hasher(algo, BS, 0) for algo in ("sha256", "fast")}

# a few prompts sharing prefixes, so lookups hit, and identical content is cached twice (duplicates)
_PROMPTS = [list(range(24)), list(range(12)) + [99] * 12, list(range(24)), [5] * 24, list(range(8)) + [7] * 16]

_op = st.tuples(
    st.sampled_from(["new", "new", "cache", "cache", "hit", "free", "free", "evict", "reset", "null", "lookup"]),
    st.integers(0, 10**6),
    st.integers(0, 6),
)


def _state(pool) -> tuple:
    """Everything observable of a pool (the map's key order aside)."""
    blocks = [(b.block_id, b.ref_cnt, b.block_hash, b.group_id, b.is_null) for b in pool.blocks]
    cmap = sorted((k, [b.block_id for b in v]) for k, v in pool.cached_block_hash_to_block.items())
    return (pool.free_block_ids(), pool.get_num_free_blocks(), pool.num_cached_blocks, pool.num_evictions,
            len(pool.cached_block_hash_to_block), cmap, blocks, pool.get_usage())


def _ids(blocks) -> list[int] | None:
    return None if blocks is None else [b.block_id for b in blocks]


def _apply(pool, holders: list, op: str, seed: int, k: int, algo: str, grouped: bool):
    """One operation on ``pool``; returns what it answered (block ids, a bool, or an error type)."""
    hasher = HASHERS[algo]
    if op == "new":
        try:
            blocks = pool.get_new_blocks(k)
        except ValueError:
            return "ValueError"
        req = make_request(hasher, f"r{seed}", _PROMPTS[seed % len(_PROMPTS)], uid=seed % 7)
        group = (seed // 7) % 2 if grouped else 0
        holders.append([req, blocks, 0, group])
        return _ids(blocks)
    if op == "cache" and holders and pool.enable_caching:  # (with caching off nothing caches)
        h = holders[seed % len(holders)]
        req, blocks, done, group = h
        upto = min(len(blocks), len(req.block_hashes), done + k)
        mask = None
        if grouped and seed % 3 == 0:
            mask = [(seed >> i) & 1 == 1 for i in range(upto - done)]
        pool.cache_full_blocks(req, blocks, done, upto, BS, group, mask=mask,
                               spec_kind="full" if group == 0 else "sliding_window")
        h[2] = max(done, upto)
        return upto
    if op == "hit":
        req = make_request(hasher, f"h{seed}", _PROMPTS[seed % len(_PROMPTS)])
        if grouped:
            got = pool.get_cached_block(req.block_hashes[min(k, len(req.block_hashes) - 1)], [0, 1])
            hits = got or []
        else:
            hits = pool.longest_cached_prefix(req.block_hashes, k)
        evictable = pool.num_evictable(hits)  # (what the coordinator asks before touching)
        pool.touch(hits)
        holders.append([req, list(hits), len(hits), 0])
        return _ids(hits), evictable
    if op == "free" and holders:
        _, blocks, _, _ = holders.pop(seed % len(holders))
        pool.free_blocks(reversed(blocks) if seed % 2 else blocks)
        return None
    if op == "evict":
        ids = [(seed >> (3 * i)) % pool.num_gpu_blocks for i in range(k)]
        pool.evict_blocks(ids)
        return ids
    if op == "reset":
        return pool.reset_prefix_cache()
    if op == "null" and any(h[3] for h in holders):
        # null blocks stand for skipped sliding-window blocks: only in a group other than 0
        grouped_holders = [h for h in holders if h[3]]
        h = grouped_holders[seed % len(grouped_holders)]
        pool.touch([pool.null_block])
        h[1].append(pool.null_block)
        return None
    if op == "lookup":
        req = make_request(hasher, f"l{seed}", _PROMPTS[seed % len(_PROMPTS)])
        key = req.block_hashes[k % len(req.block_hashes)]
        return (_ids(pool.get_cached_block(key, [0])), pool.cached_block_hash_to_block.block_ids(key))
    return None


class _Observer:
    """A ``sim.core.cache_observer`` observer that records every call, with the blocks' ids and keys
    as they were when it was told (an eviction is told before the key goes)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_allocate(self, request, num_new_computed_tokens) -> None:  # coordinators only
        self.calls.append(("allocate", request.request_id, num_new_computed_tokens))

    def on_allocate_new_blocks(self, request_id) -> None:  # coordinators only
        self.calls.append(("allocate_new", request_id))

    def on_cache(self, request, blocks, start, end, group_id) -> None:
        self.calls.append(("cache", request.request_id, [(b.block_id, b.block_hash) for b in blocks], start, end,
                           group_id))

    def on_evict(self, blocks, reason) -> None:
        self.calls.append(("evict", [(b.block_id, b.block_hash) for b in blocks], reason))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    num_blocks=st.integers(2, 14),
    ops=st.lists(_op, max_size=80),
    algo=st.sampled_from(["sha256", "fast"]),
    events=st.booleans(),
    grouped=st.booleans(),
    caching=st.sampled_from([True, True, True, False]),
    observed=st.booleans(),
)
def test_compiled_pool_equals_python_pool_on_random_operations(num_blocks, ops, algo, events, grouped, caching,
                                                               observed):
    logs = (EventLog(), EventLog())
    pools = (
        BlockPool(num_blocks, caching, logs[0] if events else None),
        CompiledBlockPool(num_blocks, caching, logs[1] if events else None),
    )
    observers = (_Observer(), _Observer())
    if observed:  # the miss attribution's hooks (sim.core.cache_observer): the same calls, in order
        for p, o in zip(pools, observers):
            p.observer = o
    holders: tuple[list, list] = ([], [])
    for op, seed, k in ops:
        answers = [_apply(p, h, op, seed, k, algo, grouped) for p, h in zip(pools, holders)]
        assert answers[0] == answers[1], (op, seed, k)
        for p in pools:
            p.check_integrity()
        assert _state(pools[0]) == _state(pools[1]), (op, seed, k)
        assert [event_to_dict(e) for e in logs[0]] == [event_to_dict(e) for e in logs[1]]
        assert observers[0].calls == observers[1].calls, (op, seed, k)
        if observed and caching:
            keys = [p.cached_block_hash_to_block.keys() for p in pools]
            assert set(keys[0]) == set(keys[1]) and len(keys[0]) == len(keys[1])
            probe = [b.block_hash for b in pools[0].blocks if b.block_hash is not None] + [bytes(16)]
            assert keys[0] & probe == keys[1] & probe == set(probe[:-1])
        for hp, hc in zip(*holders):
            assert _ids(hp[1]) == _ids(hc[1])


def test_compiled_pool_golden_free_order_and_duplicates():
    """The golden free-order rule and no de-duplication, on the compiled pool itself."""
    pool = CompiledBlockPool(10)
    hasher = HASHERS["sha256"]
    a = make_request(hasher, "a", list(range(12)))
    b = make_request(hasher, "b", list(range(12)))  # same content: cached twice under one key
    blocks_a = pool.get_new_blocks(3)
    blocks_b = pool.get_new_blocks(3)
    pool.cache_full_blocks(a, blocks_a, 0, 3, BS)
    pool.cache_full_blocks(b, blocks_b, 0, 2, BS)
    assert pool.cached_block_hash_to_block.block_ids(a.block_hashes[0]) == [1, 4]
    assert pool.longest_cached_prefix(a.block_hashes, 3)[0].block_id == 1  # first inserted
    pool.free_blocks(reversed(blocks_b))  # 6 unhashed -> head; 5, 4 hashed -> tail
    assert pool.free_block_ids() == [6, 7, 8, 9, 5, 4]
    assert [blk.block_id for blk in pool.get_new_blocks(6)] == [6, 7, 8, 9, 5, 4]
    assert pool.num_evictions == 2 and pool.cached_block_hash_to_block.block_ids(a.block_hashes[0]) == [1]
    pool.check_integrity()


def test_compiled_pool_table_rebuild_keeps_lists():
    """Many evictions leave empty-list keys behind; the table rebuild must keep every live list."""
    pool = CompiledBlockPool(5)
    hasher = HASHERS["fast"]
    for i in range(200):
        r = make_request(hasher, f"x{i}", list(range(i * 8, i * 8 + 8)))
        blocks = pool.get_new_blocks(2)
        pool.cache_full_blocks(r, blocks, 0, 2, BS)
        pool.free_blocks(reversed(blocks))
        pool.check_integrity()
        hits = pool.longest_cached_prefix(r.block_hashes, 2)
        assert [blk.block_id for blk in hits] == [blk.block_id for blk in blocks]
    assert pool.num_evictions == 2 * 200 - 4  # the pool keeps the last two requests' blocks


def test_compiled_pool_table_churn_with_both_key_lengths():
    """Keys of 16 bytes (group 0) and 20 bytes (group 1, compared in full) churning through a pool
    of 3 blocks (a 16-slot table, rebuilt every few inserts): each step must leave the same pool
    as the Python one, a consistent table, and its first block found under its key."""
    hasher = HASHERS["fast"]
    pools = (BlockPool(3), CompiledBlockPool(3))
    for i in range(300):
        r = make_request(hasher, f"x{i}", list(range(i * 8, i * 8 + 8)))
        group = (i // 3) % 2
        for p in pools:
            blocks = p.get_new_blocks(2)
            p.cache_full_blocks(r, blocks, 0, 2 - i % 2, BS, group)
            p.free_blocks(reversed(blocks))
            p.check_integrity()
        assert _state(pools[0]) == _state(pools[1]), i
        found = [_ids(p.get_cached_block(r.block_hashes[0], [group])) for p in pools]
        assert found[0] == found[1] and found[0] is not None, i


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(n_blocks=st.integers(3, 9), seed=st.integers(0, 2**32 - 1))
def test_compiled_free_queue_ring_keeps_the_linked_list_order(n_blocks, seed):
    """Random pops, frees (either order) and hits on free cached blocks, which leave stale entries
    anywhere in the compiled pool's free-queue ring: after every step its free order is the Python
    pool's linked list's (the next test makes the ring compact)."""
    import random

    rng = random.Random(seed)
    hasher = HASHERS["fast"]
    pools = [BlockPool(n_blocks), CompiledBlockPool(n_blocks)]
    held: list[list[list]] = [[], []]  # per pool: the block lists requests hold
    for step in range(300):
        op = rng.choice(["alloc", "free", "free", "hit", "hit", "hit"])
        k = rng.randint(1, n_blocks - 1)
        victim = rng.random()  # which held list a free releases (the same draw for both pools)
        r = make_request(hasher, f"q{step}", list(range(step % 7 * 4, step % 7 * 4 + 4 * k)), uid=step)
        for pool, mine in zip(pools, held):
            if op == "alloc" and pool.get_num_free_blocks() >= k:
                blocks = pool.get_new_blocks(k)
                pool.cache_full_blocks(r, blocks, 0, min(k, len(r.block_hashes)) if step % 3 else 0, BS)
                mine.append(blocks)
            elif op == "free" and mine:
                pool.free_blocks(mine.pop(int(victim * len(mine)))[::-1])
            elif op == "hit":
                hits = pool.longest_cached_prefix(r.block_hashes, k)
                pool.touch(hits)  # free cached blocks leave the queue from anywhere in it
                mine.append(hits)
            pool.check_integrity()
        a, b = pools
        assert a.free_block_ids() == b.free_block_ids(), step
        assert [x.block_id for x in a.blocks if x.ref_cnt] == [x.block_id for x in b.blocks if x.ref_cnt]


def test_compiled_free_queue_ring_compacts_in_order():
    """Hitting the same free cached blocks again and again, with no pop in between, leaves four
    stale ring entries per round (ring of 16): the ring compacts every few rounds, and the queue
    keeps the Python pool's order (hashed blocks freed last-first go to the tail)."""
    hasher = HASHERS["fast"]
    r = make_request(hasher, "r", list(range(16)))
    pools = [BlockPool(6), CompiledBlockPool(6)]
    for pool in pools:
        blocks = pool.get_new_blocks(4)
        pool.cache_full_blocks(r, blocks, 0, 4, BS)
        pool.free_blocks(blocks[::-1])
    for rnd in range(40):
        for pool in pools:
            hits = pool.longest_cached_prefix(r.block_hashes, 2 + rnd % 3)
            pool.touch(hits)
            pool.free_blocks(hits[::-1] if rnd % 2 else hits)
            pool.check_integrity()
        assert pools[0].free_block_ids() == pools[1].free_block_ids(), rnd
    assert [b.block_id for b in pools[1].get_new_blocks(5)] == [b.block_id for b in pools[0].get_new_blocks(5)]


def test_compiled_pool_refusing_an_item_leaves_it_consistent():
    """An item that is not a block stops ``cache_full_blocks`` or ``free_blocks`` with a TypeError,
    from the list fast paths too; what was done before it stays done and counted -- blocks cached,
    blocks released and queued (unhashed ones at the head, which the call pushes last)."""
    pool = CompiledBlockPool(40)
    r = make_request(HASHERS["fast"], "r", list(range(4 * 20)))
    blocks = pool.get_new_blocks(20)
    with pytest.raises(TypeError):  # the bad item in the second group of 16 inserts
        pool.cache_full_blocks(r, blocks[:17] + ["not a block"] + blocks[18:], 0, 20, BS)
    pool.check_integrity()
    assert pool.num_cached_blocks == 17
    with pytest.raises(TypeError):
        pool.free_blocks([blocks[19], blocks[18], "not a block", blocks[0]])
    pool.check_integrity()
    assert pool.free_block_ids()[:2] == [20, 19] and blocks[0].ref_cnt == 1


def test_make_block_pool_picks_the_implementation():
    assert type(make_block_pool(4, impl="python")) is BlockPool
    assert type(make_block_pool(4)) is CompiledBlockPool
    with pytest.raises(ValueError, match="unknown pool implementation"):
        make_block_pool(4, impl="numpy")


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(sc=scenarios(max_requests=8), algo=st.sampled_from(["sha256", "fast"]))
def test_compiled_pool_gives_the_same_simulation_as_the_python_pool(sc, algo):
    """Whole scheduler runs (random configs, salts, LoRA, preemption) with KV events: every step's
    schedule, block ids, free queue, stats and every event are identical."""
    runs = []
    for impl in ("python", "compiled"):
        sched, arrivals = build(sc, algo, pool_impl=impl, events=True)
        for uid, r in enumerate(r for step in sorted(arrivals) for r in arrivals[step]):
            r.uid = uid  # generated output ids (and so their blocks) depend on it: the same in both runs
        res = drive(sched, arrivals, max_steps=20_000, after_step=lambda log, s: check_step(sc, log, s))
        runs.append((sched, res))
    (sa, a), (sb, b) = runs
    assert type(sa.kv_cache_manager.block_pool) is BlockPool
    assert type(sb.kv_cache_manager.block_pool) is CompiledBlockPool
    assert len(a.steps) == len(b.steps)
    for x, y in zip(a.steps, b.steps):
        assert (x.scheduled, x.admitted, x.preempted, x.finished, x.free_block_ids, x.stats) == (
            y.scheduled, y.admitted, y.preempted, y.finished, y.free_block_ids, y.stats
        )
        assert [s.new_block_ids for s in x.output.scheduled] == [s.new_block_ids for s in y.output.scheduled]
    assert [event_to_dict(e) for e in sa.event_sink] == [event_to_dict(e) for e in sb.event_sink]
    assert sa.kv_cache_manager.block_pool.num_evictions == sb.kv_cache_manager.block_pool.num_evictions


class _Keyed:
    """A request stand-in holding raw keys (``cache_full_blocks`` reads its ``block_hashes``)."""

    def __init__(self, keys: list[bytes]) -> None:
        self.request_id = "k"
        self.block_hashes = keys


# 16-byte keys (their own digest) and 20-byte ones (folded, compared in full), sharing prefixes
_KEYS = [bytes([i]) * 16 for i in range(1, 9)] + [bytes([i]) * 20 for i in range(1, 5)]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(n_blocks=st.integers(4, 8), rounds=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 2**30)), max_size=60))
def test_compiled_pool_deletes_emptied_keys_keeping_every_probe_run(n_blocks, rounds):
    """Up to 7 live keys in a 16-slot table churn: a key whose last block is reused leaves the table
    at once (backward-shift deletion), moving later keys of its probe run back. After every round
    each pool has the same state, every key is found under the same blocks, no used slot is left
    without blocks (``check_integrity``), and the table's used slots are exactly the live keys."""
    pools = (BlockPool(n_blocks), CompiledBlockPool(n_blocks))
    for k, seed in rounds:
        keys = [_KEYS[(seed >> (4 * i)) % len(_KEYS)] for i in range(k)]
        for p in pools:
            if p.get_num_free_blocks() < k:
                continue
            blocks = p.get_new_blocks(k)
            p.cache_full_blocks(_Keyed(keys), blocks, 0, k, BS)  # (the hot path: a list of blocks)
            p.free_blocks(blocks if seed % 2 else blocks[::-1])
            p.check_integrity()
        assert _state(pools[0]) == _state(pools[1]), (k, seed)
        for key in _KEYS:
            assert pools[0].cached_block_hash_to_block.block_ids(key) == pools[1].cached_block_hash_to_block.block_ids(
                key), key
