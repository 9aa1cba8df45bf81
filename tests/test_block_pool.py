"""BlockPool golden tests (spec §2, §6): exact block ids and free-queue order after each operation.

``pool.free_block_ids()`` lists the free queue head (next reused/evicted) first.
"""

from __future__ import annotations

import pytest
from conftest import EventLog, make_request, toks

from sim.core.block_pool import BlockPool
from sim.core.hashing import external_block_hash, make_block_hasher
from sim.core.kv_cache_manager import KVCacheManager
from sim.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

BS = 16
HASHER = make_block_hasher("sha256", BS, 0)


def ids(blocks):
    return [b.block_id for b in blocks]


def cache_all(pool, request, blocks, start=0, end=None, group_id=0):
    end = len(request.block_hashes) if end is None else end
    pool.cache_full_blocks(request, blocks, start, end, BS, group_id)


def test_construction():
    pool = BlockPool(8)
    assert pool.free_block_ids() == [1, 2, 3, 4, 5, 6, 7]
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 7
    assert pool.get_usage() == 0.0
    assert len(pool.cached_block_hash_to_block) == 0
    pool.check_integrity()
    with pytest.raises(ValueError):
        BlockPool(1)


def test_get_new_blocks_pops_from_head():
    pool = BlockPool(8)
    got = pool.get_new_blocks(3)
    assert ids(got) == [1, 2, 3]
    assert all(b.ref_cnt == 1 for b in got)
    assert pool.free_block_ids() == [4, 5, 6, 7]
    assert pool.get_usage() == pytest.approx(3 / 7)
    assert ids(pool.get_new_blocks(2)) == [4, 5]
    with pytest.raises(ValueError):
        pool.get_new_blocks(3)
    pool.check_integrity()


def test_free_blocks_unhashed_to_head_hashed_to_tail_in_given_order():
    pool = BlockPool(10)
    r = make_request(HASHER, "r", toks(48))
    blocks = pool.get_new_blocks(6)  # 1..6
    cache_all(pool, r, blocks[:3])  # 1, 2, 3 hashed; 4, 5, 6 not
    assert pool.free_block_ids() == [7, 8, 9]
    b = {x.block_id: x for x in blocks}
    pool.free_blocks([b[4], b[1], b[5], b[2]])
    assert pool.free_block_ids() == [4, 5, 7, 8, 9, 1, 2]
    pool.free_blocks([b[6], b[3]])
    # the new unhashed batch goes in front of the older one
    assert pool.free_block_ids() == [6, 4, 5, 7, 8, 9, 1, 2, 3]
    # freed hashed blocks stay cached (free is not evict)
    assert pool.get_cached_block(r.block_hashes[0], [0])[0] is b[1]
    pool.check_integrity()


def test_free_only_when_ref_cnt_reaches_zero():
    pool = BlockPool(6)
    r = make_request(HASHER, "r", toks(32))
    blocks = pool.get_new_blocks(2)
    cache_all(pool, r, blocks)
    pool.touch(blocks)  # a second holder
    assert [b.ref_cnt for b in blocks] == [2, 2]
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_ids() == [3, 4, 5]
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_ids() == [3, 4, 5, 2, 1]
    pool.check_integrity()


def test_touch_unlinks_free_cached_blocks_only():
    pool = BlockPool(8)
    r = make_request(HASHER, "r", toks(48))
    blocks = pool.get_new_blocks(3)
    cache_all(pool, r, blocks)
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_ids() == [4, 5, 6, 7, 3, 2, 1]
    hit = [pool.get_cached_block(h, [0])[0] for h in r.block_hashes[:2]]
    assert ids(hit) == [1, 2]
    pool.touch(hit)
    assert pool.free_block_ids() == [4, 5, 6, 7, 3]
    assert [b.ref_cnt for b in hit] == [1, 1]
    assert all(b.block_hash is not None for b in hit)  # touching keeps the hash
    pool.touch(hit[:1])  # already in use: only the count changes
    assert hit[0].ref_cnt == 2 and pool.free_block_ids() == [4, 5, 6, 7, 3]
    # the null block is never linked back
    pool.touch([pool.null_block])
    assert pool.null_block not in pool.free_block_queue
    pool.null_block.ref_cnt = 0
    pool.check_integrity()


def test_lazy_eviction_on_reuse_emits_block_removed():
    events = EventLog()
    pool = BlockPool(4, event_sink=events)  # 3 usable
    r = make_request(HASHER, "r", toks(48))
    blocks = pool.get_new_blocks(3)
    cache_all(pool, r, blocks)
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_ids() == [3, 2, 1]
    assert len(pool.cached_block_hash_to_block) == 3 and not events.of(BlockRemoved)
    got = pool.get_new_blocks(1)
    assert ids(got) == [3]
    assert got[0].block_hash is None and got[0].ref_cnt == 1
    assert pool.get_cached_block(r.block_hashes[2], [0]) is None
    assert pool.get_cached_block(r.block_hashes[1], [0])[0].block_id == 2
    removed = events.of(BlockRemoved)
    assert len(removed) == 1
    assert removed[0].block_hashes == [external_block_hash(r.block_hashes[2])]
    assert removed[0].group_idx == 0 and removed[0].medium == "GPU"
    assert pool.num_evictions == 1
    pool.check_integrity()


def test_forty_token_request_free_order_spec_6_4():
    """Spec §6.4 / row 20: a 40-token request on 8 blocks, freed -> [3,4,5,6,7,2,1]."""
    kvm = KVCacheManager(8, BS, 4096)
    r = make_request(HASHER, "A", toks(40))
    blocks, hits = kvm.get_computed_blocks(r)
    assert hits == 0
    new = kvm.allocate_slots(r, 40, full_sequence_must_fit=True, has_scheduled_reqs=False)
    assert ids(new) == [1, 2, 3]
    assert kvm.get_num_cached_blocks("A") == 2
    assert [b.block_hash is not None for b in new] == [True, True, False]
    kvm.free(r)
    assert kvm.block_pool.free_block_ids() == [3, 4, 5, 6, 7, 2, 1]
    kvm.check_integrity()


def test_no_dedup_two_blocks_under_one_key():
    events = EventLog()
    pool = BlockPool(8, event_sink=events)
    a = make_request(HASHER, "a", toks(32))
    b = make_request(HASHER, "b", toks(32))
    assert a.block_hashes == b.block_hashes
    ba = pool.get_new_blocks(2)  # 1, 2
    bb = pool.get_new_blocks(2)  # 3, 4
    cache_all(pool, a, ba)
    cache_all(pool, b, bb)
    key1 = a.block_hashes[1]
    m = pool.cached_block_hash_to_block
    assert len(m) == 2 and m.block_ids(key1) == [2, 4]
    assert pool.num_cached_blocks == 4
    assert pool.get_cached_block(key1, [0])[0].block_id == 2  # first inserted
    pool.free_blocks(reversed(ba))
    pool.free_blocks(reversed(bb))
    assert pool.free_block_ids() == [5, 6, 7, 2, 1, 4, 3]
    # reuse 5, 6, 7, then 2: evicts block 2's entry, the key survives through block 4
    assert ids(pool.get_new_blocks(4)) == [5, 6, 7, 2]
    assert m.block_ids(key1) == [4]
    assert pool.get_cached_block(key1, [0])[0].block_id == 4
    assert len(events.of(BlockRemoved)) == 1  # emitted although the hash is still cached
    assert events.of(BlockRemoved)[0].block_hashes == [external_block_hash(key1)]
    # popping the last copy removes the key
    assert ids(pool.get_new_blocks(2)) == [1, 4]
    assert pool.get_cached_block(key1, [0]) is None
    assert m.block_ids(a.block_hashes[0]) == [3]
    pool.check_integrity()


def test_map_pop_only_removes_given_block_id():
    pool = BlockPool(6)
    a = make_request(HASHER, "a", toks(16))
    b1 = pool.get_new_blocks(1)
    b2 = pool.get_new_blocks(1)
    cache_all(pool, a, b1)
    cache_all(pool, a, b2)
    m = pool.cached_block_hash_to_block
    key = a.block_hashes[0]
    assert m.pop(key, 99) is None and m.block_ids(key) == [1, 2]
    assert m.pop(key, 1) is b1[0] and m.block_ids(key) == [2]
    assert m.pop(key, 1) is None and m.block_ids(key) == [2]
    assert m.pop(key, 2) is b2[0] and m.block_ids(key) == [] and len(m) == 0


def test_reset_prefix_cache_fails_while_in_use_then_succeeds():
    events = EventLog()
    pool = BlockPool(6, event_sink=events)
    r = make_request(HASHER, "r", toks(40))
    blocks = pool.get_new_blocks(3)
    cache_all(pool, r, blocks)
    assert pool.reset_prefix_cache() is False
    assert len(pool.cached_block_hash_to_block) == 2 and not events.of(AllBlocksCleared)
    pool.free_blocks(reversed(blocks))
    order = pool.free_block_ids()
    assert pool.reset_prefix_cache() is True
    assert len(pool.cached_block_hash_to_block) == 0
    assert all(b.block_hash is None for b in pool.blocks)
    assert pool.free_block_ids() == order  # the queue is untouched
    assert len(events.of(AllBlocksCleared)) == 1
    assert pool.get_cached_block(r.block_hashes[0], [0]) is None
    pool.check_integrity()


def test_block_stored_event_fields():
    events = EventLog()
    pool = BlockPool(10, event_sink=events)
    tokens = toks(56, 100)
    r = make_request(HASHER, "r", tokens, cache_salt="salt", lora_name="L", lora_int_id=5)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(r, blocks, 0, 2, BS)
    pool.cache_full_blocks(r, blocks, 2, 2, BS)  # nothing new: no event
    pool.cache_full_blocks(r, blocks, 2, 3, BS)
    stored = events.of(BlockStored)
    assert len(stored) == 2
    e0, e1 = stored
    assert e0.block_hashes == [external_block_hash(h) for h in r.block_hashes[:2]]
    assert all(0 <= h < 2**64 for h in e0.block_hashes)
    assert e0.block_hashes[0] == int.from_bytes(r.block_hashes[0][-8:], "big")
    assert e0.parent_block_hash is None
    assert e0.token_ids == tokens[:32]
    assert e0.block_size == BS
    assert (e0.lora_id, e0.lora_name) == (5, "L")
    assert e0.extra_keys == [("L", "salt"), ("L",)]
    assert e0.group_idx == 0 and e0.medium == "GPU"
    assert e1.block_hashes == [external_block_hash(r.block_hashes[2])]
    assert e1.parent_block_hash == external_block_hash(r.block_hashes[1])
    assert e1.token_ids == tokens[32:48]
    assert e1.extra_keys == [("L",)]

    plain = make_request(HASHER, "p", toks(16))
    pool.cache_full_blocks(plain, pool.get_new_blocks(1), 0, 1, BS, group_id=2)
    e2 = events.of(BlockStored)[-1]
    # vLLM passes ``extra_keys_list or None``: a list of one None is truthy, so it stays [None]
    assert (e2.lora_id, e2.lora_name, e2.extra_keys, e2.group_idx) == (None, None, [None], 2)
    assert e2.block_hashes == [external_block_hash(plain.block_hashes[0])]


def test_block_removed_event_for_non_zero_group_strips_group_id():
    events = EventLog()
    pool = BlockPool(3, event_sink=events)  # 2 usable
    r = make_request(HASHER, "r", toks(16))
    b = pool.get_new_blocks(1)
    pool.cache_full_blocks(r, b, 0, 1, BS, group_id=3)
    pool.free_blocks(b)
    pool.get_new_blocks(2)
    (rm,) = events.of(BlockRemoved)
    assert rm.block_hashes == [external_block_hash(r.block_hashes[0])]
    assert rm.group_idx == 3


def test_caching_disabled_pool_never_hashes_or_evicts():
    kvm = KVCacheManager(6, BS, 4096, enable_caching=False)
    r = make_request(HASHER, "A", toks(40))
    assert kvm.get_computed_blocks(r) == ((), 0)
    assert kvm.make_prefix_cache_stats().requests == 0  # no lookup recorded
    assert ids(kvm.allocate_slots(r, 40)) == [1, 2, 3]
    assert all(b.block_hash is None for b in kvm.block_pool.blocks)
    kvm.free(r)
    assert kvm.block_pool.free_block_ids() == [3, 2, 1, 4, 5]
    r2 = make_request(HASHER, "B", toks(40))
    assert kvm.get_computed_blocks(r2) == ((), 0)
    kvm.check_integrity()
