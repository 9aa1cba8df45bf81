"""Every row of the spec's §10 edge-case table that applies to one full-attention KV group
(with or without EAGLE), plus the §5.3 and §6.4 worked examples. bs = 16 unless stated.

Each test names its row. Expected numbers are the spec's (rows marked V there were measured on
vLLM 0.25.1's own code); where a test checks more (block ids, queue orders, stats per step) the
extra numbers follow from vLLM 0.25.1's source and are explained inline.
"""

from __future__ import annotations

import pytest
from conftest import drive, make_request, make_scheduler, stats_tuple, toks

from sim.core.block_pool import BlockPool
from sim.core.hashing import external_block_hash, make_block_hasher
from sim.core.kv_cache_block import make_block_key
from sim.core.kv_cache_manager import KVCacheManager
from sim.core.kv_events import AllBlocksCleared, BlockRemoved
from sim.core.request import RequestStatus

BS = 16


def send_one_by_one(sched, reqs):
    """Each request arrives after the previous one has finished; returns (hits, per-request stats)."""
    hits, stats = [], []
    for r in reqs:
        res = drive(sched, [r])
        assert r.request_id in res.finished, f"{r.request_id} did not finish"
        hits.append(res.first_hits[r.request_id])
        stats.append(res.stats)
    return hits, stats


def blocks_of(sched, rid):
    return sched.kv_cache_manager.get_block_ids(rid)


# -- rows 1-5: the num_tokens - 1 cap and whole-block hits ----------------------------------------


@pytest.mark.parametrize("algo", ["sha256", "fast"])
def test_row01_exactly_two_blocks_sent_twice_recomputes_whole_last_block(algo):
    s = make_scheduler(64, algo=algo)
    a, b = make_request(s, "a", toks(32)), make_request(s, "b", toks(32))
    hits, stats = send_one_by_one(s, [a, b])
    assert hits == [0, 16]
    assert stats_tuple(stats[1]) == (1, 32, 16, 0, 0, 0)  # queries = num_tokens, not num_tokens - 1
    res = drive(s, [make_request(s, "c", toks(32))])
    assert res.steps[0].scheduled == {"c": 16}  # the whole 2nd block is recomputed, not 1 token


def test_row02_thirty_three_tokens_sent_twice():
    s = make_scheduler(64)
    hits, _ = send_one_by_one(s, [make_request(s, "a", toks(33)), make_request(s, "b", toks(33))])
    assert hits == [0, 32]


@pytest.mark.parametrize("n", [16, 15])
def test_row03_one_block_or_less_never_hits(n):
    s = make_scheduler(64)
    hits, stats = send_one_by_one(s, [make_request(s, "a", toks(n)), make_request(s, "b", toks(n))])
    assert hits == [0, 0]
    assert stats_tuple(stats[1]) == (1, n, 0, 0, 0, 0)


def test_row04_prompt_extending_a_cached_prompt():
    s = make_scheduler(64)
    hits, _ = send_one_by_one(s, [make_request(s, "a", toks(40)), make_request(s, "b", toks(100))])
    assert hits == [0, 32]


def test_row05_prefix_of_a_cached_prompt_is_capped_at_num_tokens_minus_one():
    s = make_scheduler(64)
    hits, _ = send_one_by_one(s, [make_request(s, "a", toks(100)), make_request(s, "b", toks(48))])
    assert hits == [0, 32]  # capped at 47 tokens -> 2 blocks


# -- rows 6, 7, 10: salts, LoRA names, prompt_logprobs ----------------------------------------


@pytest.mark.parametrize("algo", ["sha256", "fast"])
def test_row06_cache_salt(algo):
    s = make_scheduler(64, algo=algo)
    salts = [None, "x", "x", "y", ""]
    reqs = [make_request(s, f"r{i}", toks(64), cache_salt=salt) for i, salt in enumerate(salts)]
    hits, _ = send_one_by_one(s, reqs)
    assert hits == [0, 0, 48, 0, 48]  # "" counts as no salt


@pytest.mark.parametrize("algo", ["sha256", "fast"])
def test_row07_lora_name_is_hashed_not_id(algo):
    s = make_scheduler(64, algo=algo)
    loras = [(None, 0), ("L1", 1), ("L1", 7), ("L2", 1)]
    reqs = [make_request(s, f"r{i}", toks(64), lora_name=n, lora_int_id=k) for i, (n, k) in enumerate(loras)]
    hits, _ = send_one_by_one(s, reqs)
    assert hits == [0, 0, 48, 0]


def test_row10_prompt_logprobs_skips_reading_but_writes():
    s = make_scheduler(64)
    lp1 = make_request(s, "lp1", toks(64), prompt_logprobs=True)
    lp2 = make_request(s, "lp2", toks(64), prompt_logprobs=True)
    normal = make_request(s, "n", toks(64))
    hits, stats = send_one_by_one(s, [lp1, lp2, normal])
    assert hits == [0, 0, 48]
    assert stats_tuple(stats[0]) == stats_tuple(stats[1]) == (0, 0, 0, 0, 0, 0)  # no record
    assert stats_tuple(stats[2]) == (1, 64, 48, 0, 0, 0)


# -- rows 8, 9 (= §5.3): the final token's KV is never computed -------------------------------


@pytest.mark.parametrize("n_out,expect", [(13, 32), (12, 16)])
@pytest.mark.parametrize("algo", ["sha256", "fast"])
def test_row08_09_follow_up_hits_at_most_p_plus_n_minus_1(n_out, expect, algo):
    s = make_scheduler(64, algo=algo)
    prompt, outs = toks(20), toks(n_out, 1000)
    a = make_request(s, "a", prompt, max_tokens=n_out, output_token_ids=outs)
    res = drive(s, [a])
    assert a.output_token_ids == outs
    # exactly floor((P + N - 1) / bs) blocks got cached
    assert len(s.kv_cache_manager.block_pool.cached_block_hash_to_block) == (20 + n_out - 1) // BS
    follow = make_request(s, "b", prompt + outs + toks(10, 2000))
    hits, _ = send_one_by_one(s, [follow])
    assert hits == [expect]
    assert res.first_hits == {"a": 0}


# -- rows 11 (= §6.4 second example), 12, 19, 20: eviction order in tiny pools ----------------


def test_row11_six_block_pool_evicts_the_chain_tail_first():
    s = make_scheduler(7, events=True)  # 6 usable blocks
    pool = s.kv_cache_manager.block_pool
    a = make_request(s, "A", toks(80))
    drive(s, [a])
    assert pool.free_block_ids() == [6, 5, 4, 3, 2, 1]  # never-used 6, then A's chain tail-first
    b = make_request(s, "B", toks(32, 500))
    res_b = drive(s, [b])
    # B takes the one never-used block plus A's 5th block (its chain tail)
    assert res_b.steps[0].output.scheduled[0].new_block_ids == [6, 5]
    removed = s.event_sink.of(BlockRemoved)
    assert [e.block_hashes for e in removed] == [[external_block_hash(a.block_hashes[4])]]
    a2 = make_request(s, "A2", toks(80))
    res = drive(s, [a2])
    assert res.first_hits == {"A2": 64}


def test_row12_four_block_pool_fully_cached_prompt_admitted_then_decode_fails():
    s = make_scheduler(5)  # 4 usable blocks
    pool = s.kv_cache_manager.block_pool
    drive(s, [make_request(s, "A", toks(64))])
    assert pool.free_block_ids() == [4, 3, 2, 1]
    a2 = make_request(s, "A2", toks(64), max_tokens=2)
    res = drive(s, [a2], max_steps=6)
    # admitted: 3 evictable hits (counted) + 1 new = 4 <= 4
    assert res.admissions["A2"][0] == (0, 48, 64)
    assert res.steps[0].free_block_ids == []
    # its first decode needs a 5th block: it preempts itself ...
    assert res.steps[1].preempted == ["A2"] and res.steps[1].scheduled == {}
    # ... and, resumed with 65 tokens (4 hits + 1 new = 5 > 4), it never fits again (cf. row 30)
    for log in res.steps[2:]:
        assert log.scheduled == {}
        assert stats_tuple(log.stats) == (0, 0, 0, 1, 65, 64)
    assert res.unfinished == ["A2"] and a2.status == RequestStatus.PREEMPTED


def test_row19_tiny_pool_duplicate_survives_eviction_of_original():
    s = make_scheduler(4, events=True)  # 3 usable
    pool = s.kv_cache_manager.block_pool
    a = make_request(s, "a", toks(32), max_tokens=4)
    res = drive(s, [a])
    assert len(res.steps) == 4
    assert pool.free_block_ids() == [3, 2, 1]  # a computed 35 tokens: block 3 unhashed -> head
    key1 = a.block_hashes[1]
    b = make_request(s, "b", toks(32), max_tokens=2)
    res = drive(s, [b])
    assert res.first_hits == {"b": 16}
    assert res.steps[0].scheduled == {"b": 16}  # recomputes block 1 (into a duplicate, see below)
    # b's decode popped block 2 (a's original copy): one BlockRemoved, hash still cached in 3
    removed = s.event_sink.of(BlockRemoved)
    assert [e.block_hashes for e in removed] == [[external_block_hash(key1)]]
    assert pool.cached_block_hash_to_block.block_ids(key1) == [3]
    assert pool.get_cached_block(key1, [0])[0].block_id == 3


def test_row19_duplicate_state_after_prefill():
    s = make_scheduler(4)
    pool = s.kv_cache_manager.block_pool
    a = make_request(s, "a", toks(32), max_tokens=4)
    drive(s, [a])
    b = make_request(s, "b", toks(32), max_tokens=2)
    drive(s, [b], until_idle=False, max_steps=1)
    assert blocks_of(s, "b") == [1, 3]
    assert pool.cached_block_hash_to_block.block_ids(a.block_hashes[1]) == [2, 3]  # no dedup
    assert pool.free_block_ids() == [2]
    drive(s, {})
    assert blocks_of(s, "b") == []


def test_row20_free_order_of_a_forty_token_request():
    s = make_scheduler(8)
    a = make_request(s, "A", toks(40))
    res = drive(s, [a])
    assert res.steps[0].output.scheduled[0].new_block_ids == [1, 2, 3]
    assert res.steps[0].free_block_ids == [3, 4, 5, 6, 7, 2, 1]


# -- rows 13-16: same-step sharing, budgets, head-of-line blocking -----------------------------


def test_row13_same_step_sharing():
    s = make_scheduler(64)
    a, b = make_request(s, "a", toks(64)), make_request(s, "b", toks(64))
    res = drive(s, [a, b])
    assert res.steps[0].admitted == {"a": 0, "b": 48}
    assert blocks_of(s, "a") == []  # both finished
    assert stats_tuple(res.steps[0].stats) == (2, 128, 48, 0, 0, 0)


def test_row14_budget_starves_lookup_then_full_prompt_hit():
    s = make_scheduler(1000, max_num_batched_tokens=1024)
    prompt = toks(3000)
    a, b = make_request(s, "A", prompt), make_request(s, "B", prompt)
    res = drive(s, {0: [a], 1: [b]})
    assert [log.scheduled for log in res.steps[:3]] == [{"A": 1024}, {"A": 1024}, {"A": 952, "B": 8}]
    assert stats_tuple(res.steps[1].stats) == (0, 0, 0, 0, 0, 0)  # B not even looked up
    assert res.admissions["B"] == [(2, 2992, 3000)]
    assert stats_tuple(res.steps[2].stats) == (1, 3000, 2992, 0, 0, 0)


def test_row15_long_prefill_threshold_parallel_duplicates():
    s = make_scheduler(1000, max_num_batched_tokens=1024, long_prefill_token_threshold=512)
    prompt = toks(3000)
    a, b = make_request(s, "A", prompt), make_request(s, "B", prompt)
    res = drive(s, [a, b])
    assert res.first_hits == {"A": 0, "B": 512}
    assert res.steps[0].scheduled == {"A": 512, "B": 512}
    m = s.kv_cache_manager.block_pool.cached_block_hash_to_block
    dup = [k for k, blocks in m.items() if len(blocks) > 1]
    assert len(dup) == 155  # blocks 32..186 computed by both A and B
    assert len(m) == 187


def test_row16_head_of_line_request_is_looked_up_every_step():
    s = make_scheduler(9)  # 8 usable
    a = make_request(s, "A", toks(100), max_tokens=3)  # 7 blocks
    b = make_request(s, "B", toks(64, 1000))  # needs 4
    c = make_request(s, "C", toks(16, 2000))  # would fit (1 block) but waits behind B
    res = drive(s, [a, b, c])
    assert [sorted(log.admitted) for log in res.steps[:4]] == [["A"], [], [], ["B", "C"]]
    assert [log.stats.requests for log in res.steps[:4]] == [2, 1, 1, 2]
    assert [log.stats.queries for log in res.steps[:4]] == [164, 64, 64, 80]
    assert res.stats.requests == 6  # B counted 4 times


# -- §5.1 step 4: the full-sequence admission gate (scheduler_reserve_full_isl) -----------------


@pytest.mark.parametrize("reserve_full", [True, False])
def test_full_sequence_gate_checks_the_whole_prompt_not_the_first_chunk(reserve_full):
    s = make_scheduler(7, max_num_batched_tokens=16, scheduler_reserve_full_isl=reserve_full)  # 6 usable
    x = make_request(s, "X", toks(48), max_tokens=20)  # 3 blocks, a 4th on its first decode
    y = make_request(s, "Y", toks(64, 500))  # 4 blocks; its first 15-token chunk needs 1
    res = drive(s, [x, y])
    assert [log.scheduled.get("X") for log in res.steps[:4]] == [16, 16, 16, 1]
    # step 3: X's decode leaves a budget of 15 and 2 free blocks
    assert stats_tuple(res.steps[3].stats) == (1, 64, 0, 0, 0, 0)
    if reserve_full:  # 4 > 2: Y waits until X has finished (step 21), looked up every step
        assert res.admitted_step("Y") == 22
        assert res.stats.requests == 2 + (22 - 3)
    else:  # vLLM with the gate off admits the first chunk
        assert res.admitted_step("Y") == 3 and res.steps[3].scheduled["Y"] == 15


# -- rows 17, 25, 27, 28: preemption -------------------------------------------------------------


def test_row17_fcfs_preempts_the_later_admitted_request():
    s = make_scheduler(5)  # 4 usable
    a = make_request(s, "A", toks(32), max_tokens=20)
    b = make_request(s, "B", toks(32, 100), max_tokens=20)
    seen = {}

    def after(log, sch):
        if log.step == 1:
            seen["status"] = b.status
            seen["computed"] = b.num_computed_tokens
            seen["head"] = sch.waiting.peek().request_id
            seen["holds"] = "B" in sch.kv_cache_manager.request_ids()

    res = drive(s, [a, b], after_step=after)
    assert res.steps[0].admitted == {"A": 0, "B": 0}
    assert res.steps[1].preempted == ["B"] and res.steps[1].scheduled == {"A": 1}
    assert seen == {"status": RequestStatus.PREEMPTED, "computed": 0, "head": "B", "holds": False}
    assert b.num_preemptions == 1 and a.num_preemptions == 0
    # resumed lookups go to preempted_* (num_tokens = 32 + 1 output); B's block 1 was evicted by
    # A's 3rd block, its block 0 by A's 4th (step 17)
    for log in res.steps[2:21]:
        assert (log.stats.requests, log.stats.preempted_requests, log.stats.preempted_queries) == (0, 1, 33)
    assert [log.stats.preempted_hits for log in res.steps[2:21]] == [16] * 15 + [0] * 4
    assert res.admissions["B"] == [(0, 0, 32), (20, 0, 33)]
    assert len(b.output_token_ids) == 20 and len(a.output_token_ids) == 20


def test_row25_resumed_request_hits_its_own_generated_block():
    s = make_scheduler(8)  # 7 usable
    c = make_request(s, "C", toks(60, 500), max_tokens=19)
    b = make_request(s, "B", toks(16, 100), max_tokens=40)
    res = drive(s, [c, b])
    assert res.steps[0].admitted == {"C": 0, "B": 0}
    assert res.steps[17].preempted == ["B"]  # B needs its 3rd block, none free: preempts itself
    assert stats_tuple(res.steps[18].stats) == (0, 0, 0, 1, 33, 32)
    # resumed at step 19 over prompt + 17 outputs (33 tokens): hits 32 -- its prompt block and the
    # block of its first 16 generated tokens, on the same physical blocks as before
    assert res.admissions["B"] == [(0, 0, 16), (19, 32, 33)]
    assert res.steps[19].output.scheduled[0].new_block_ids == [5, 6, 7]
    assert res.steps[19].scheduled == {"B": 1}
    assert len(b.output_token_ids) == 40


def test_row27_fcfs_victims_only_from_the_end_of_running():
    s = make_scheduler(6)  # 5 usable
    a = make_request(s, "A", toks(20, 0), max_tokens=10)
    b = make_request(s, "B", toks(16, 100), max_tokens=10)
    c = make_request(s, "C", toks(20, 200), max_tokens=10)
    d = make_request(s, "D", toks(8, 300))
    res = drive(s, {0: [a, b, c], 1: [d]}, max_steps=3, until_idle=False)
    assert res.steps[0].free_block_ids == []
    step1 = res.steps[1]
    # A was scheduled first; B's allocation fails; the victim is C (last of running), never A
    assert step1.scheduled == {"A": 1, "B": 1} and step1.preempted == ["C"]
    # row 28: no admissions (and no lookups at all) in a step that preempted
    assert step1.admitted == {} and stats_tuple(step1.stats) == (0, 0, 0, 0, 0, 0)
    assert [r.request_id for r in s.waiting] == ["C", "D"]


def test_row27_priority_may_preempt_an_already_scheduled_request():
    s = make_scheduler(6, policy="priority")
    a = make_request(s, "A", toks(20, 0), max_tokens=10, priority=5, arrival_time=0.0)
    b = make_request(s, "B", toks(16, 100), max_tokens=10, priority=0, arrival_time=1.0)
    c = make_request(s, "C", toks(20, 200), max_tokens=10, priority=0, arrival_time=1.5)
    res = drive(s, {0: [a], 1: [b, c]}, max_steps=3, until_idle=False)
    assert res.steps[1].admitted == {"B": 0, "C": 0}
    step2 = res.steps[2]
    # A (worst priority) was scheduled before B; B's failure preempts A and refunds its tokens
    assert step2.preempted == ["A"]
    assert step2.scheduled == {"B": 1, "C": 1}
    assert step2.output.total_num_scheduled_tokens == 2
    assert a.status == RequestStatus.PREEMPTED and a.num_computed_tokens == 0
    assert blocks_of(s, "B") == [3, 2]  # A's freed unhashed tail block went to the head


def test_row28_no_admissions_in_a_step_with_preemption():
    s = make_scheduler(5, policy="priority")  # 4 usable
    a = make_request(s, "A", toks(16, 0), max_tokens=10, priority=0, arrival_time=0.0)
    b = make_request(s, "B", toks(48, 100), max_tokens=10, priority=1, arrival_time=1.0)
    d = make_request(s, "D", toks(8, 300), priority=-1, arrival_time=2.0)  # 1 block, best priority
    res = drive(s, {0: [a, b], 1: [d]}, max_steps=3, until_idle=False)
    step1 = res.steps[1]
    assert step1.preempted == ["B"] and step1.scheduled == {"A": 1}
    assert len(step1.free_block_ids) == 2  # D would fit, budget is left, yet:
    assert step1.admitted == {} and stats_tuple(step1.stats) == (0, 0, 0, 0, 0, 0)
    assert res.steps[2].admitted == {"D": 0}


# -- row 18: reset_prefix_cache -----------------------------------------------------------------


def test_row18_reset_prefix_cache():
    s = make_scheduler(64, events=True)
    a = make_request(s, "A", toks(64), max_tokens=3)
    results = []

    def after(log, sch):
        if log.step == 0:
            results.append(sch.reset_prefix_cache())

    drive(s, [a], after_step=after)
    assert results == [False]
    assert s.reset_prefix_cache() is True
    assert len(s.event_sink.of(AllBlocksCleared)) == 1
    st = s.make_stats()
    assert st.reset is True
    res = drive(s, [make_request(s, "B", toks(64))])
    assert res.first_hits == {"B": 0}


def test_row18_reset_with_running_requests_preempts_them():
    s = make_scheduler(64)
    a = make_request(s, "A", toks(64), max_tokens=5)
    drive(s, [a], max_steps=1, until_idle=False)
    assert s.reset_prefix_cache(reset_running_requests=True) is True
    assert a.status == RequestStatus.PREEMPTED and not s.running
    res = drive(s, {})
    assert res.admissions["A"] == [(0, 0, 65)]


# -- row 21: EAGLE ------------------------------------------------------------------------------


@pytest.mark.parametrize("n,expect", [(33, 16), (48, 16), (100, 80)])
def test_row21_eagle_drops_the_last_matched_block(n, expect):
    s = make_scheduler(64, use_eagle=True)
    hits, _ = send_one_by_one(s, [make_request(s, "a", toks(n)), make_request(s, "b", toks(n))])
    assert hits == [0, expect]


# -- row 26: watermark --------------------------------------------------------------------------


def test_row26_watermark_manager_level():
    hasher = make_block_hasher("sha256", BS)
    kvm = KVCacheManager(11, BS, 4096, watermark=0.5)  # 10 usable, watermark int(0.5 * 11) = 5
    assert kvm.watermark_blocks == 5
    r = make_request(hasher, "r", toks(120))  # 8 blocks
    assert kvm.allocate_slots(r, 120, full_sequence_must_fit=True, has_scheduled_reqs=True) is None
    assert kvm.block_pool.get_num_free_blocks() == 10
    new = kvm.allocate_slots(r, 120, full_sequence_must_fit=True, has_scheduled_reqs=False)
    assert [b.block_id for b in new] == list(range(1, 9))
    # RUNNING requests never pay the watermark
    r2 = make_request(hasher, "r2", toks(20, 900))
    r2.status = RequestStatus.RUNNING
    assert kvm.allocate_slots(r2, 20, has_scheduled_reqs=True) is not None


def test_row26_watermark_scheduler_level():
    s = make_scheduler(11, watermark=0.5)
    x = make_request(s, "X", toks(16, 500), max_tokens=5)
    r = make_request(s, "R", toks(120))
    res = drive(s, [x, r])
    # R is rejected while X runs (8 + 5 > 9 free), admitted once nothing is running
    assert res.steps[0].admitted == {"X": 0}
    assert res.admitted_step("R") == 5
    assert [log.stats.requests for log in res.steps] == [2, 1, 1, 1, 1, 1]


# -- row 29: max_num_seqs -----------------------------------------------------------------------


def test_row29_max_num_seqs_blocks_before_lookup():
    s = make_scheduler(64, max_num_seqs=1)
    a = make_request(s, "A", toks(64), max_tokens=10)
    b = make_request(s, "B", toks(64))
    res = drive(s, [a, b])
    assert res.admissions["B"] == [(10, 48, 64)]
    assert [log.stats.requests for log in res.steps] == [1] + [0] * 9 + [1]
    assert stats_tuple(res.steps[10].stats) == (1, 64, 48, 0, 0, 0)


# -- row 30: pool smaller than one max_model_len sequence ---------------------------------------


def _build_from_engine(**engine):
    run = pytest.importorskip("sim.experiment.run",
                              reason="row 30 is checked by the experiment layer (sim.experiment.run)")
    from sim.experiment.config import ConfigError, config_from_dict

    cfg = config_from_dict({"name": "row30", "engine": engine, "workload": {"kind": "synthetic_shared_prefix"}})
    return run.build_scheduler, cfg, ConfigError


def test_row30_pool_smaller_than_one_max_model_len_sequence_is_rejected():
    """The core Scheduler takes any pool (row 12 shows the head-of-line livelock that follows);
    the experiment layer (``sim.experiment.run.build_scheduler``) rejects such a configuration, as vLLM's
    ``_check_enough_kv_cache_memory`` refuses to start."""
    engine = dict(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=64, hash_algo="sha256")
    build, cfg, config_error = _build_from_engine(num_gpu_blocks=5, **engine)
    with pytest.raises(config_error, match="max_model_len"):
        build(cfg)
    # 256 blocks of 16 hold one 4096-token sequence; 257 with the null block is accepted
    build, cfg, _ = _build_from_engine(num_gpu_blocks=257, **engine)
    assert build(cfg).cache_config.num_gpu_blocks == 257


# -- row 31: group ids --------------------------------------------------------------------------


def test_row31_group_id_is_part_of_the_key():
    pool = BlockPool(8)
    r = make_request(make_block_hasher("sha256", BS), "r", toks(32))
    g0, g1 = pool.get_new_blocks(2), pool.get_new_blocks(2)
    pool.cache_full_blocks(r, g0, 0, 2, BS, group_id=0)
    pool.cache_full_blocks(r, g1, 0, 2, BS, group_id=1)
    h = r.block_hashes[1]
    assert make_block_key(h, 0) != make_block_key(h, 1)
    assert make_block_key(h, 1) == h + (1).to_bytes(4, "big")
    assert len(pool.cached_block_hash_to_block) == 4  # 2 keys per group
    assert [b.block_id for b in pool.get_cached_block(h, [0])] == [2]
    assert [b.block_id for b in pool.get_cached_block(h, [1])] == [4]
    assert [b.block_id for b in pool.get_cached_block(h, [0, 1])] == [2, 4]
    pool.evict_blocks([4])  # a miss in any group of the lookup is a miss
    assert pool.get_cached_block(h, [0, 1]) is None
    assert g1[1].ref_cnt == 1  # evict_blocks drops the hash but does not free
    pool.check_integrity()


# -- row 32: hits shared with a running request cost nothing ------------------------------------


def test_row32_hit_blocks_in_use_are_not_counted_as_evictable():
    s = make_scheduler(6)  # 5 usable
    a = make_request(s, "A", toks(64), max_tokens=10)  # 4 blocks
    b = make_request(s, "B", toks(64))
    res = drive(s, [a, b], max_steps=1, until_idle=False)
    # B: 3 hits with ref_cnt 1 (free of charge) + 1 new = 1 <= 1 free; counting them would be 4
    assert res.steps[0].admitted == {"A": 0, "B": 48}
    assert res.steps[0].output.scheduled[1].new_block_ids == [1, 2, 3, 5]


def test_row32_evictable_hits_do_cost_capacity():
    hasher = make_block_hasher("sha256", BS)
    kvm = KVCacheManager(6, BS, 4096)
    a = make_request(hasher, "A", toks(64))
    kvm.allocate_slots(a, 64)
    b = make_request(hasher, "B", toks(64))
    hits, n = kvm.get_computed_blocks(b)
    assert n == 48 and all(x.ref_cnt == 1 for x in hits[0])
    assert kvm.get_num_blocks_to_allocate(b, 64, hits, n) == 1
    kvm.free(a)
    hits, n = kvm.get_computed_blocks(b)
    assert n == 48 and kvm.get_num_blocks_to_allocate(b, 64, hits, n) == 4


# -- row 33: abort before allocation ------------------------------------------------------------


def test_row33_free_before_allocation_is_a_noop():
    hasher = make_block_hasher("sha256", BS)
    kvm = KVCacheManager(4, BS, 4096)
    r = make_request(hasher, "r", toks(40))
    order = kvm.block_pool.free_block_ids()
    kvm.free(r)
    assert kvm.block_pool.free_block_ids() == order and "r" not in kvm.request_ids()
    # a failed allocation leaves nothing behind either
    big = make_request(hasher, "big", toks(100))
    assert kvm.allocate_slots(big, 100, full_sequence_must_fit=True) is None
    kvm.free(big)
    assert kvm.block_pool.free_block_ids() == order
    kvm.check_integrity()


# -- row 34: chunk boundaries not multiples of bs -----------------------------------------------


def test_row34_unaligned_chunks_cache_per_full_block():
    s = make_scheduler(64, max_num_batched_tokens=20)
    a = make_request(s, "A", toks(50))
    seen = []

    def after(log, sch):
        kvm = sch.kv_cache_manager
        if "A" in kvm.request_ids():
            seen.append((kvm.get_num_cached_blocks("A"), [b.block_hash is not None for b in kvm.get_blocks("A")]))

    res = drive(s, [a], after_step=after)
    assert [log.scheduled for log in res.steps] == [{"A": 20}, {"A": 20}, {"A": 10}]
    assert seen == [(1, [True, False]), (2, [True, True, False])]  # step 2 finished and freed A
    assert len(s.kv_cache_manager.block_pool.cached_block_hash_to_block) == 3


# -- rows 22-24 need sliding-window / hybrid KV groups ------------------------------------------
# They are in tests/test_kv_groups.py (KVCacheManager over CacheConfig.kv_groups).
