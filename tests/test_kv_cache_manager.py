"""KVCacheManager's public interface (sim.core.kv_cache_manager) and the pieces under it that got a
public method of their own: which coordinator a layout gets, the stat-free lookup, the admission
queries, the unchecked allocation of the decode fast-forward, the hash map's bulk operations, the
coarse hash view and the waiting queues. Golden style: exact block ids, counts and order.
bs = 16; a manager of N blocks has N - 1 usable ones (block 0 is the null block).
"""

from __future__ import annotations

import pytest
from conftest import make_request, toks

from sim.core.block_hash_map import BlockHashToBlockMap
from sim.core.config import CacheConfig, SchedulerConfig
from sim.core.free_block_queue import FreeKVCacheBlockQueue
from sim.core.full_attention_coordinator import UnitaryFullAttentionCoordinator
from sim.core.grouped_kv_cache_coordinator import KVCacheCoordinatorNoPrefixCache, UnitaryKVCacheCoordinator
from sim.core.hashing import make_block_hasher
from sim.core.hybrid_kv_cache_coordinator import HybridKVCacheCoordinator
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_manager import KVCacheManager
from sim.core.kv_cache_spec import BlockHashView, KVGroupSpec
from sim.core.request import RequestStatus
from sim.core.request_queue import FCFSRequestQueue, PriorityRequestQueue, create_request_queue

BS = 16
HASHER = make_block_hasher("sha256", BS, 0)
FA16, FA32, SWA16 = KVGroupSpec("full", 16), KVGroupSpec("full", 32), KVGroupSpec("sliding_window", 16, 32)


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def stats(kvm: KVCacheManager) -> tuple[int, int, int, int, int, int]:
    s = kvm.make_prefix_cache_stats()
    assert s is not None
    return (s.requests, s.queries, s.hits, s.preempted_requests, s.preempted_queries, s.preempted_hits)


# -- construction -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "block_size, kv_groups, caching, coordinator",
    [
        (16, (), True, UnitaryFullAttentionCoordinator),
        (16, (), False, UnitaryFullAttentionCoordinator),
        (16, (FA16,), True, UnitaryKVCacheCoordinator),
        (16, (SWA16,), True, UnitaryKVCacheCoordinator),
        (32, (FA32, SWA16), True, HybridKVCacheCoordinator),
        (32, (FA32, SWA16), False, KVCacheCoordinatorNoPrefixCache),
        (16, (SWA16, SWA16), False, KVCacheCoordinatorNoPrefixCache),  # identical specs: fine without caching
    ],
)
def test_the_group_layout_picks_the_coordinator(block_size, kv_groups, caching, coordinator):
    kvm = KVCacheManager(64, block_size, 1024, kv_groups=kv_groups, enable_caching=caching)
    assert type(kvm.coordinator) is coordinator
    assert kvm.is_unitary_full_attention == (coordinator is UnitaryFullAttentionCoordinator)
    assert kvm.block_pool is kvm.coordinator.block_pool and kvm.block_size == block_size
    assert kvm.kv_groups == (kv_groups or (FA16,))


def test_hash_block_size_is_the_gcd_of_the_groups_or_the_block_size():
    assert KVCacheManager(64, 16, 1024).hash_block_size == 16
    assert KVCacheManager(64, 32, 1024, kv_groups=(FA32, SWA16)).hash_block_size == 16
    assert KVCacheManager(64, 32, 1024, kv_groups=(FA32, SWA16), enable_caching=False).hash_block_size == 32


def test_block_size_must_be_the_lcm_of_the_groups():
    with pytest.raises(ValueError, match="LCM"):
        KVCacheManager(64, 16, 1024, kv_groups=(FA32, SWA16))
    with pytest.raises(ValueError, match="non-negative"):
        KVCacheManager(64, 16, 1024, watermark=-0.1)
    with pytest.raises(ValueError, match="sliding-window"):
        KVCacheManager(64, 16, 1024, retention_interval=32)


def test_from_configs_reads_both_configs():
    kvm = KVCacheManager.from_configs(
        SchedulerConfig(max_model_len=512, watermark=0.25),
        CacheConfig(32, 40, kv_groups=(FA32, SWA16)),
        log_stats=False,
    )
    assert type(kvm.coordinator) is HybridKVCacheCoordinator
    assert (kvm.block_pool.num_gpu_blocks, kvm.max_model_len, kvm.watermark_blocks) == (40, 512, 10)
    assert kvm.make_prefix_cache_stats() is None


# -- lookups --------------------------------------------------------------------------------------


def _cached_a(num_blocks: int = 8, **kw) -> KVCacheManager:
    """A manager where request A (40 tokens) holds blocks 1, 2, 3 and cached 1, 2."""
    kvm = KVCacheManager(num_blocks, BS, 4096, **kw)
    a = make_request(HASHER, "A", toks(40))
    assert ids(kvm.allocate_slots(a, 40)) == [1, 2, 3]
    return kvm


def test_peek_computed_blocks_records_no_stats():
    kvm = _cached_a()
    b = make_request(HASHER, "B", toks(40))
    hits, n = kvm.peek_computed_blocks(b)
    assert n == 32 and [ids(g) for g in hits] == [[1, 2]]
    assert stats(kvm) == (0, 0, 0, 0, 0, 0)
    got, n2 = kvm.get_computed_blocks(b)
    assert n2 == 32 and [ids(g) for g in got] == [[1, 2]]
    assert stats(kvm) == (1, 40, 32, 0, 0, 0)
    assert all(blk.ref_cnt == 1 for blk in got[0])  # neither lookup took a reference


def test_peek_computed_blocks_is_empty_when_the_request_skips_the_cache_or_caching_is_off():
    kvm = _cached_a()
    assert kvm.peek_computed_blocks(make_request(HASHER, "P", toks(40), prompt_logprobs=True)) == ((), 0)
    assert kvm.peek_computed_blocks(make_request(HASHER, "M", toks(40, 500))) == ((), 0)  # a miss
    off = _cached_a(enable_caching=False)
    assert off.peek_computed_blocks(make_request(HASHER, "B", toks(40))) == ((), 0)


def test_repeat_lookup_records_exactly_what_a_lookup_records():
    kvm = _cached_a()
    b = make_request(HASHER, "B", toks(40))
    kvm.repeat_lookup(b, 32)
    assert stats(kvm) == (1, 40, 32, 0, 0, 0)
    b.num_preemptions = 1  # a resumed request is counted apart
    kvm.repeat_lookup(b, 16)
    assert stats(kvm) == (0, 0, 0, 1, 40, 16)
    kvm.repeat_lookup(make_request(HASHER, "P", toks(40), prompt_logprobs=True), 0)
    assert stats(kvm) == (0, 0, 0, 0, 0, 0)


# -- admission queries ----------------------------------------------------------------------------


def test_full_sequence_fits_matches_the_allocate_slots_gate():
    kvm = KVCacheManager(6, BS, 4096)  # 5 usable
    a = make_request(HASHER, "A", toks(64))
    assert ids(kvm.allocate_slots(a, 64)) == [1, 2, 3, 4]  # 4 cached blocks, 1 free
    b = make_request(HASHER, "B", toks(100))
    hits, n = kvm.peek_computed_blocks(b)
    assert n == 64 and kvm.get_num_blocks_to_allocate(b, 100, hits, n) == 3  # in-use hits are free
    assert not kvm.full_sequence_fits(b, hits, n)  # 3 > 1 free
    assert kvm.allocate_slots(b, 36, n, hits, full_sequence_must_fit=True) is None
    kvm.free(a)
    assert kvm.block_pool.free_block_ids() == [5, 4, 3, 2, 1]
    hits, n = kvm.peek_computed_blocks(b)
    assert kvm.get_num_blocks_to_allocate(b, 100, hits, n) == 7  # 3 new + 4 free hits > 5
    assert not kvm.full_sequence_fits(b, hits, n)
    c = make_request(HASHER, "C", toks(80))
    hits, n = kvm.peek_computed_blocks(c)
    assert n == 64 and kvm.get_num_blocks_to_allocate(c, 80, hits, n) == 5
    assert kvm.full_sequence_fits(c, hits, n, has_scheduled_reqs=True)
    assert ids(kvm.allocate_slots(c, 16, n, hits, full_sequence_must_fit=True)) == [5]
    kvm.check_integrity()


def test_full_sequence_fits_adds_the_watermark_only_while_something_runs():
    kvm = KVCacheManager(6, BS, 4096, watermark=0.2)  # watermark int(0.2 * 6) = 1 block
    c = make_request(HASHER, "C", toks(80))  # 5 blocks of 5 free
    assert not kvm.full_sequence_fits(c, has_scheduled_reqs=True)
    assert kvm.full_sequence_fits(c, has_scheduled_reqs=False)
    c.status = RequestStatus.RUNNING  # the watermark applies to waiting / preempted requests only
    assert kvm.full_sequence_fits(c, has_scheduled_reqs=True)


# -- the decode fast-forward's unchecked allocation -----------------------------------------------


def test_allocate_new_blocks_pops_what_the_tokens_need_and_caches_nothing():
    kvm = _cached_a()
    assert kvm.get_num_cached_blocks("A") == 2 and list(kvm.request_ids()) == ["A"]
    assert ids(kvm.allocate_new_blocks("A", 48)) == []  # 3 blocks hold 48 tokens
    assert ids(kvm.allocate_new_blocks("A", 49)) == [4]
    assert ids(kvm.allocate_new_blocks("A", 96)) == [5, 6]
    assert kvm.get_block_ids("A") == [1, 2, 3, 4, 5, 6] and kvm.get_num_cached_blocks("A") == 2
    assert kvm.block_pool.free_block_ids() == [7]
    with pytest.raises(ValueError, match="free blocks"):
        kvm.allocate_new_blocks("A", 200)
    kvm.check_integrity()


def test_allocate_new_blocks_fills_every_group_in_order():
    kvm = KVCacheManager(16, 16, 1024, kv_groups=(FA16, SWA16))
    assert ids(kvm.allocate_new_blocks("x", 40)) == [1, 2, 3, 4, 5, 6]  # group 0 first, then group 1
    assert kvm.get_block_ids_by_group("x") == ([1, 2, 3], [4, 5, 6])
    assert kvm.get_block_ids("x") == [1, 2, 3, 4, 5, 6]
    assert kvm.get_num_cached_blocks("x", 0) == kvm.get_num_cached_blocks("x", 1) == 0
    kvm.check_integrity()


def test_block_queries_of_the_fast_path():
    kvm = _cached_a()
    assert kvm.get_blocks_by_group("A") == (kvm.get_blocks("A"),)
    assert kvm.get_block_ids_by_group("A") == ([1, 2, 3],)
    assert kvm.get_blocks("nobody") == [] and kvm.get_num_cached_blocks("nobody") == 0
    with pytest.raises(IndexError):
        kvm.get_num_cached_blocks("A", 1)
    kvm.free(make_request(HASHER, "A", toks(40)))
    assert not kvm.request_ids() and kvm.block_pool.free_block_ids() == [3, 4, 5, 6, 7, 2, 1]  # spec §6.4


def _running(kvm: KVCacheManager, rid: str, prompt: int, start: int = 0):
    """A request whose whole prompt is computed (and cached) and that has sampled one token."""
    r = make_request(HASHER, rid, toks(prompt, start), max_tokens=8)
    assert kvm.allocate_slots(r, prompt) is not None
    r.status = RequestStatus.RUNNING
    r.num_computed_tokens = prompt
    r.append_output_token_ids(r.planned_output_token(0))
    return r


def test_num_ready_decodes_counts_the_leading_decodes_whose_slot_is_ready():
    kvm = KVCacheManager(16, BS, 1024)
    a = _running(kvm, "a", 20)  # position 20 lies in its second block, which stays partial
    b = _running(kvm, "b", 20, 100)
    c = _running(kvm, "c", 31, 200)  # position 31 fills its second block: it must be cached
    d = _running(kvm, "d", 32, 300)  # position 32 needs a third block
    prefill = make_request(HASHER, "p", toks(40, 400))
    assert kvm.allocate_slots(prefill, 16) is not None
    prefill.status, prefill.num_computed_tokens = RequestStatus.RUNNING, 16
    free = kvm.block_pool.get_num_free_blocks()
    assert kvm.num_ready_decodes([a, b, c], 0, 8, 1024) == 2  # stops at c
    assert kvm.num_ready_decodes([a, b, c], 0, 1, 1024) == 1  # the token budget
    assert kvm.num_ready_decodes([a, d, b], 0, 8, 1024) == 1
    assert kvm.num_ready_decodes([a, prefill, b], 0, 8, 1024) == 1
    assert kvm.num_ready_decodes([c, a, b], 1, 8, 1024) == 2  # from start
    assert kvm.num_ready_decodes([a, b], 0, 8, 22) == 2  # position 20 < max_model_len - 1
    assert kvm.num_ready_decodes([a, b], 0, 8, 21) == 0  # the scheduler asks for no token there
    a.num_output_placeholders = 1  # async: a token in flight
    assert kvm.num_ready_decodes([a, b], 0, 8, 1024) == 0
    a.num_output_placeholders = 0
    a.status = RequestStatus.PREEMPTED
    assert kvm.num_ready_decodes([a, b], 0, 8, 1024) == 0
    assert kvm.block_pool.get_num_free_blocks() == free  # a query: nothing allocated or cached
    kvm.check_integrity()


def test_a_coordinator_without_the_fast_path_reports_no_ready_decode():
    kvm = KVCacheManager(16, BS, 1024, kv_groups=(FA16,))
    a = _running(kvm, "a", 20)
    assert kvm.num_ready_decodes([a], 0, 8, 1024) == 0


# -- hash map, free queue, hash view, waiting queues ----------------------------------------------


def _blocks(n: int) -> list[KVCacheBlock]:
    return [KVCacheBlock(i) for i in range(n)]


def test_longest_cached_prefix_stops_at_the_first_miss_and_returns_the_first_inserted():
    m = BlockHashToBlockMap()
    b = _blocks(5)
    m.insert_blocks([b[1], b[2], b[4]], [b"k0", b"k1", b"k3"])
    m.insert(b"k0", b[3])  # a duplicate of k0's content
    assert [x.block_hash for x in b] == [None, b"k0", b"k1", None, b"k3"]  # insert leaves block_hash alone
    assert ids(m.longest_cached_prefix([b"k0", b"k1", b"k2", b"k3"])) == [1, 2]
    assert ids(m.longest_cached_prefix(iter([b"k3"]))) == [4]
    assert m.longest_cached_prefix([b"zz", b"k0"]) == []
    assert m.block_ids(b"k0") == [1, 3] and len(m) == 3


def test_evict_blocks_drops_only_the_given_block_under_a_shared_key():
    m = BlockHashToBlockMap()
    b = _blocks(4)
    m.insert_blocks([b[1], b[2], b[3]], [b"k", b"k", b"j"])
    assert m.block_ids(b"k") == [1, 2]
    assert m.evict_blocks([b[1], b[0]]) == 1  # b0 holds no hash: not counted
    assert m.block_ids(b"k") == [2] and b[1].block_hash is None and b[2].block_hash == b"k"
    assert m.get_one_block(b"k") is b[2]
    assert m.evict_blocks([b[2], b[3]]) == 2 and len(m) == 0


def test_free_queue_popleft_n_takes_the_head_in_order():
    b = _blocks(5)
    q = FreeKVCacheBlockQueue(b)
    assert ids(q.popleft_n(2)) == [0, 1] and q.block_ids() == [2, 3, 4]
    q.prepend_n([b[1], b[0]])
    assert q.block_ids() == [1, 0, 2, 3, 4]
    with pytest.raises(ValueError, match="Cannot get 6 free blocks"):
        q.popleft_n(6)
    assert q.num_free_blocks == 5  # a failed pop takes nothing


def test_block_hash_view_indexes_slices_and_grows_with_the_list():
    fine = [b"A", b"B", b"C", b"D", b"E"]
    v = BlockHashView(fine, 16, 32)
    assert v[0:2] == [b"B", b"D"] and v[::-1] == [b"D", b"B"] and v[5:] == []
    assert b"D" in v and b"C" not in v and v.index(b"D") == 1
    fine.append(b"F")
    assert len(v) == 3 and v[-1] == b"F"
    with pytest.raises(IndexError):
        v[3]


def test_fcfs_prepend_goes_to_the_head_and_priority_prepend_is_a_push():
    r = [make_request(HASHER, f"r{i}", toks(4), priority=p, arrival_time=float(i)) for i, p in enumerate([1, 0, 2])]
    fcfs = create_request_queue("fcfs")
    assert isinstance(fcfs, FCFSRequestQueue)
    for x in r[1:]:
        fcfs.add(x)
    fcfs.prepend(r[0])  # a preempted request goes back to the head
    assert [x.request_id for x in fcfs] == ["r0", "r1", "r2"] and fcfs.peek() is r[0]
    fcfs.remove_where(lambda x: x.request_id == "r1")
    assert [fcfs.pop_head().request_id for _ in range(len(fcfs))] == ["r0", "r2"]
    prio = create_request_queue("priority")
    assert isinstance(prio, PriorityRequestQueue)
    for x in r:
        prio.add(x)
    assert prio.peek() is r[1]
    prio.prepend(prio.pop_head())
    assert [x.request_id for x in prio] == ["r1", "r0", "r2"]
    prio.remove_where(lambda x: x.request_id == "r0")
    assert [prio.pop_head().request_id for _ in range(len(prio))] == ["r1", "r2"]
