"""Golden tests of the vLLM version profiles (``sim.core.version_profile``): each 0.25.1 -> 0.33.0
difference, one rule per test, on a small hand-built scenario run under both profiles, with the
exact hit tokens, stats and steps each version's own code gives (the function each rule comes from
is named in the test's docstring). Config-level rules (keys, seeds, caps) are at the end.
"""

from __future__ import annotations

import hashlib
import pickle

import pytest
from conftest import drive, make_request, make_scheduler, stats_tuple, toks

from sim.core.config import CacheConfig, SchedulerConfig
from sim.core.hashing import hash_function, make_block_hasher
from sim.core.kv_cache_spec import KVGroupSpec
from sim.core.request import MMFeature, Request
from sim.core.scheduler import Scheduler
from sim.core.version_profile import V0_25_1, V0_33_0, VersionProfile, get_profile

BOTH = pytest.mark.parametrize("profile", [V0_25_1, V0_33_0], ids=lambda p: p.version)


def _ids(out) -> dict[str, int]:
    return {s.request.request_id: s.num_new_tokens for s in out.scheduled}


# -- 1. prefix-cache stats --------------------------------------------------------------------
@pytest.mark.parametrize(("profile", "expected"), [
    # 0.25.1 get_computed_blocks: A once, then B's refused lookups at steps 0-8 and its admission
    # at step 9, each 48 tokens hitting A's 2 shared blocks
    (V0_25_1, (11, 40 + 10 * 48, 10 * 32, 0, 0, 0)),
    # 0.33 record_prefix_cache_stats after allocate_slots: A and B once each
    (V0_33_0, (2, 88, 32, 0, 0, 0)),
])
def test_prefix_cache_stats_recorded_once_per_admission(profile: VersionProfile, expected) -> None:
    s = make_scheduler(4, 16, profile=profile)  # 3 usable blocks, all A's while it runs
    a = make_request(s, "A", toks(40), max_tokens=9)
    b = make_request(s, "B", toks(32) + toks(16, 1000), max_tokens=1)
    res = drive(s, [a, b])
    assert res.admitted_step("B") == 9 and res.first_hits == {"A": 0, "B": 32}
    assert stats_tuple(res.stats) == expected


@pytest.mark.parametrize(("profile", "expected"), [
    # 0.25.1: B's lookups while preempted (steps 2-20, 32 tokens each) go to preempted_*; they hit
    # B's own first block until A's 4th block evicts it at step 17
    (V0_25_1, (2, 63, 0, 19, 19 * 32, 15 * 16)),
    # 0.33: one re-admission, under preempted_*
    (V0_33_0, (2, 63, 0, 1, 32, 0)),
])
def test_readmission_stats_go_to_preempted_counters(profile: VersionProfile, expected) -> None:
    s = make_scheduler(5, 16, profile=profile)
    a = make_request(s, "A", toks(32), max_tokens=20)
    b = make_request(s, "B", toks(31, 500), max_tokens=20)
    res = drive(s, [a, b])
    assert res.step(1).preempted == ["B"]
    assert [(k, hits) for k, hits, _ in res.admissions["B"]] == [(0, 0), (20, 0)]
    assert stats_tuple(res.stats) == expected


@BOTH
def test_prompt_logprobs_requests_are_not_counted(profile: VersionProfile) -> None:
    s = make_scheduler(16, 16, profile=profile)
    res = drive(s, [make_request(s, "A", toks(40), prompt_logprobs=True), make_request(s, "B", toks(40))])
    assert stats_tuple(res.stats)[:3] == (1, 40, 32)  # B only (A's blocks are written, never read by A)


def test_refused_lookup_repeated_by_the_window_records_nothing_under_033() -> None:
    """``KVCacheManager.repeat_lookup`` (the decode window's blocked head) follows the profile."""
    for profile, want in ((V0_25_1, (1, 48, 32)), (V0_33_0, (0, 0, 0))):
        s = make_scheduler(8, 16, profile=profile)
        head = make_request(s, "H", toks(48))
        s.kv_cache_manager.repeat_lookup(head, 32)
        assert stats_tuple(s.make_stats())[:3] == want


# -- 2. EAGLE ---------------------------------------------------------------------------------
def _eagle_scheduler(profile: VersionProfile) -> Scheduler:
    lookahead = 1 if profile.eagle_lookahead_hashes else 0  # engine_description: no connector, caching on
    return Scheduler(
        SchedulerConfig(profile=profile),
        CacheConfig(16, 32, use_eagle=not lookahead, num_hash_lookahead_tokens=lookahead),
        make_block_hasher("sha256", 16, 0, lookahead),
    )


@pytest.mark.parametrize(("profile", "hit"), [(V0_25_1, 48), (V0_33_0, 64)])
def test_eagle_hits_one_block_longer_with_lookahead_hashes(profile: VersionProfile, hit: int) -> None:
    """0.25.1 drops the last hit block (``use_eagle``); 0.33 hashes each block with its next token
    (``get_request_block_hasher(num_hash_lookahead_tokens=1)``, ``use_eagle_block_drop=False``), so
    B, continuing A's turn (A's 64 prompt tokens, A's output 5000), hits A's 4 blocks."""
    s = _eagle_scheduler(profile)
    a = make_request(s, "A", toks(64), max_tokens=2, output_token_ids=[5000, 5001])
    b = make_request(s, "B", toks(64) + [5000] + toks(31, 2000), max_tokens=1)
    res = drive(s, {0: [a], 3: [b]})
    assert res.first_hits == {"A": 0, "B": hit}


def test_lookahead_hashes_cache_a_block_once_its_next_token_exists() -> None:
    """0.33 ``cache_blocks`` caps at the hashed tokens: A's 4th block (tokens 48-63) is cached at
    the decode step after its next token (the first output) arrived, not at the prefill."""
    s = _eagle_scheduler(V0_33_0)
    a = make_request(s, "A", toks(64), max_tokens=3, output_token_ids=[5000, 5001, 5002])
    cached: list[int] = []
    drive(s, [a], after_step=lambda log, sc: cached.append(sc.kv_cache_manager.get_num_cached_blocks("A")))
    assert cached[:2] == [3, 4]
    assert len(a.block_hashes) == 4  # 66 tokens: block 4 (64-79) is not full


def test_lookahead_hash_keys_are_vllm_033s() -> None:
    """``hash_block_tokens(parent, tokens, (extra_keys, next_token))`` with sha256 over pickle."""
    h = make_block_hasher("sha256", 4, "vllm-none-hash", 1)
    r = Request("r", [1, 2, 3, 4, 5, 6, 7, 8, 9], 1, hasher=h)
    none = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()
    b0 = hashlib.sha256(pickle.dumps((none, (1, 2, 3, 4), (None, 5)), protocol=pickle.HIGHEST_PROTOCOL)).digest()
    b1 = hashlib.sha256(pickle.dumps((b0, (5, 6, 7, 8), (None, 9)), protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert r.block_hashes == [b0, b1]
    r8 = Request("r8", [1, 2, 3, 4, 5, 6, 7, 8], 1, hasher=h)
    assert r8.block_hashes == [b0]  # the second block waits for its next token


def test_fast_lookahead_hashes_have_the_exact_equality_structure() -> None:
    for algo in ("fast", "sha256"):
        h = make_block_hasher(algo, 4, 0, 1)
        x = Request("x", list(range(13)), 1, hasher=h).block_hashes
        y = Request("y", list(range(12)) + [99], 1, hasher=h).block_hashes  # differs in block 2's next token
        z = Request("z", list(range(8)) + [99, 9, 10, 11, 12], 1, hasher=h).block_hashes
        assert (len(x), x[:2] == y[:2], x[2] == y[2]) == (3, True, False)
        assert x[0] == z[0] and x[1] != z[1]  # block 1 (4-7) equal, its next token (index 8) not


@pytest.mark.parametrize(("profile", "mm_keys"), [
    (V0_25_1, (("img-b", 1),)),  # curr_mm_idx = -1: the last item only
    (V0_33_0, (("img-a", 0), ("img-b", 1))),  # get_mm_features_in_window: every item in the block
])
def test_resumed_hash_pass_scans_multimodal_items(profile: VersionProfile, mm_keys) -> None:
    """``get_request_block_hasher``: a block completed by output tokens, with two image items in
    the prompt's tail (tokens 4 and 5), gets both as extra keys in 0.33, the last one in 0.25.1."""
    h = make_block_hasher("sha256", 4, 0, 0, profile.mm_resume_scan_from_last)
    feats = [MMFeature("img-a", 4, 1), MMFeature("img-b", 5, 1)]
    r = Request("r", [1, 2, 3, 4, 5, 6], 2, mm_features=feats, output_token_ids=[7, 8], hasher=h)
    assert len(r.block_hashes) == 1
    r.append_output_token_ids(7)
    r.append_output_token_ids(8)
    fn = hash_function("sha256")
    b0 = fn((fn("0"), (1, 2, 3, 4), None))
    assert r.block_hashes == [b0, fn((b0, (5, 6, 7, 8), mm_keys))]


@pytest.mark.parametrize(("profile", "block0_keys"), [
    (V0_25_1, ("ada", ("img", 2), "salt")),
    (V0_33_0, (("lora", "ada", None), ("mm", "img", 2), ("cache_salt", "salt"))),
])
def test_extra_keys_are_tagged_under_033(profile: VersionProfile, block0_keys) -> None:
    """0.33 ``generate_block_hash_extra_keys``: ``("lora", name, path)``, ``("mm", id, offset)``,
    ``("cache_salt", salt)``; 0.25.1 the bare forms (a trace has no adapter path: None). Checked
    byte for byte against vLLM 0.33.0's ``get_request_block_hasher`` for a salted prompt."""
    h = make_block_hasher("sha256", 4, 0, 0, profile.mm_resume_scan_from_last, profile.tagged_extra_keys)
    r = Request("r", [1, 2, 3, 4, 5], 1, cache_salt="salt", lora_name="ada", mm_features=[MMFeature("img", 2, 1)],
                hasher=h)
    fn = hash_function("sha256")
    assert r.block_hashes == [fn((fn("0"), (1, 2, 3, 4), block0_keys))]
    if profile.tagged_extra_keys:  # vLLM 0.33.0, PYTHONHASHSEED=0, tokens 1..11, cache_salt "s": its first bytes
        def first_bytes(lookahead: int) -> list[str]:
            h = make_block_hasher("sha256", 4, 0, lookahead, False, True)
            return [b.hex()[:16] for b in Request("s", list(range(1, 12)), 1, cache_salt="s", hasher=h).block_hashes]

        assert first_bytes(0) == ["f4b25c9b1d083991", "b0d1d9510a44afa0"]
        assert first_bytes(1) == ["b44d39d7d1d0b327", "c66d871fa35020e3"]


# -- 4. stale in-flight output ----------------------------------------------------------------
@pytest.mark.parametrize(("profile", "step2"), [
    (V0_25_1, {"A": 1}),  # B, at the head, is refused (2 blocks needed, 1 free): head-of-line blocking
    (V0_33_0, {"A": 1, "C": 15}),  # B is skipped while its output is stale; C behind it is admitted
])
def test_preempted_request_with_stale_output_is_skipped(profile: VersionProfile, step2: dict[str, int]) -> None:
    """0.33 ``_preempt_request``: ``num_stale_output_tokens = num_in_flight_tokens``; the waiting
    loop ``skip_request``s it until ``update_from_output`` drains it (requeued at the front)."""
    s = make_scheduler(5, 16, profile=profile, async_scheduling=True)
    a = make_request(s, "A", toks(32), max_tokens=20)
    b = make_request(s, "B", toks(32, 500), max_tokens=20)
    c = make_request(s, "C", toks(15, 900), max_tokens=20)
    s.add_request(a)
    s.add_request(b)
    out0 = s.schedule()  # A and B prefill, both sample (in flight)
    s.add_request(c)
    out1 = s.schedule()  # A's next slot preempts B, whose step-0 output is still in flight
    assert _ids(out0) == {"A": 32, "B": 32} and [r.request_id for r in out1.preempted] == ["B"]
    assert (b.num_stale_output_tokens, b.num_output_placeholders) == ((32, 0) if profile.stale_output_skip else (0, 1))
    out2 = s.schedule()  # before step 0's output is applied
    assert _ids(out2) == step2
    assert [r.request_id for r in s.waiting] == (["B"] if profile.stale_output_skip else ["B", "C"])
    s.update_from_output(out0, {"A": [7000], "B": [7001]})
    assert (b.num_stale_output_tokens, b.num_output_placeholders, list(b.output_token_ids)) == (0, 0, [7001])


# -- 5. long_prefill_token_threshold ----------------------------------------------------------
@pytest.mark.parametrize(("profile", "alone", "pair"), [
    (V0_25_1, [100], [32, 32]),
    (V0_33_0, [100], [32, 32]),
])
def test_long_prefill_threshold_off_for_a_lone_request(profile: VersionProfile, alone, pair) -> None:
    """0.33 ``schedule``: the threshold is 0 when ``num_running + num_waiting <= 1``."""
    s = make_scheduler(64, 16, profile=profile, long_prefill_token_threshold=32)
    s.add_request(make_request(s, "A", toks(100)))
    first = _ids(s.schedule())["A"]
    assert first == (100 if profile.threshold_off_when_alone else 32)
    s2 = make_scheduler(64, 16, profile=profile, long_prefill_token_threshold=32)
    s2.add_request(make_request(s2, "A", toks(100)))
    s2.add_request(make_request(s2, "B", toks(100, 500)))
    assert list(_ids(s2.schedule()).values()) == pair


# -- 6. max_num_active_seqs and the prefill cadence -------------------------------------------
def test_max_num_active_seqs_caps_admission_into_running() -> None:
    """0.33 ``max_num_active_reqs``: the waiting loop stops at it; ``max_num_seqs`` stays the runner's."""
    s = make_scheduler(64, 16, profile=V0_33_0, max_num_seqs=4, max_num_active_seqs=2)
    reqs = [make_request(s, f"R{i}", toks(20, 100 * i), max_tokens=3) for i in range(3)]
    res = drive(s, reqs)
    assert [res.admitted_step(f"R{i}") for i in range(3)] == [0, 0, 3]


@pytest.mark.parametrize(("interval", "admitted", "a_steps"), [
    (1, 1, [0, 1, 2, 3, 4, 5]),
    # held at steps 1-2 (fewer than 3 executed steps since step 0's prefill, A decoding); released at 3
    (3, 3, [0, 1, 2, 3, 4, 5]),
])
def test_prefill_schedule_interval_holds_admissions(interval: int, admitted: int, a_steps: list[int]) -> None:
    """0.33 ``schedule``: ``defer_prefills`` from ``prefill_schedule_interval`` (sim.core.prefill_cadence)."""
    s = make_scheduler(64, 16, profile=V0_33_0, prefill_schedule_interval=interval)
    a = make_request(s, "A", toks(16), max_tokens=6)
    b = make_request(s, "B", toks(40, 500), max_tokens=2)
    res = drive(s, {0: [a], 1: [b]})
    assert res.admitted_step("B") == admitted
    assert [k for k, log in enumerate(res.steps) if "A" in log.scheduled] == a_steps


def test_prefill_cadence_defers_running_prefill_chunks_not_decodes() -> None:
    s = make_scheduler(64, 16, profile=V0_33_0, prefill_schedule_interval=3, max_num_batched_tokens=32,
                       max_num_seqs=4)
    a = make_request(s, "A", toks(16), max_tokens=8)
    b = make_request(s, "B", toks(96, 500), max_tokens=2)
    res = drive(s, {0: [a], 1: [b]})
    chunks = [(k, log.scheduled["B"]) for k, log in enumerate(res.steps) if "B" in log.scheduled]
    # released at step 3 (31 tokens beside A's decode), held at 4-5, released at 6, held at 7; A
    # finished at step 7, so step 8 has no decode to protect: B alone takes the budget
    assert chunks == [(3, 31), (6, 31), (8, 32), (9, 2), (10, 1)]


# -- priority preemption ----------------------------------------------------------------------
@pytest.mark.parametrize(("profile", "step3"), [
    (V0_25_1, {}),  # L preempts itself and the loop stops: H waits a step
    (V0_33_0, {"H": 1}),  # the loop goes on to H behind L
])
def test_priority_self_preemption_scans_on(profile: VersionProfile, step3: dict[str, int]) -> None:
    """0.33 ``schedule``: a lowest-priority request that preempted itself does not stop the running
    loop (``continue``); 0.25.1 ``break``s."""
    s = make_scheduler(5, 16, profile=profile, policy="priority")  # 4 usable blocks
    low = make_request(s, "L", toks(30), max_tokens=20, priority=5)
    h = make_request(s, "H", toks(20, 600), max_tokens=20, priority=1, arrival_time=1.0)
    res = drive(s, {0: [low], 1: [h]}, max_steps=4)
    assert res.step(1).scheduled == {"L": 1, "H": 20}  # running = [L, H], every block taken
    assert res.step(3).preempted == ["L"] and res.step(3).scheduled == step3


# -- config-level rules -----------------------------------------------------------------------
def test_unknown_version_lists_the_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown vLLM version '0\.30\.0'; supported: 0\.33\.0, 0\.25\.1"):
        get_profile("0.30.0")


def test_in_flight_admission_cap_doubles_with_async_under_033() -> None:
    """0.33 ``VllmConfig.max_in_flight_tokens`` = concurrent batches x budget (2 with async)."""
    assert V0_33_0.max_in_flight_tokens(512, True) == 1024
    assert V0_33_0.max_in_flight_tokens(512, False) == V0_25_1.max_in_flight_tokens(512, True) == 512


@pytest.mark.parametrize(("profile", "free"), [(V0_25_1, [61, 59, 59, 60]), (V0_33_0, [61, 59, 57, 58])])
def test_sliding_window_frees_on_the_processed_token_basis(profile: VersionProfile, free: list[int]) -> None:
    """0.33 ``KVCacheManager.allocate_slots``: ``remove_skipped_blocks(total - num_in_flight_tokens)``;
    with async scheduling a 32-token window's blocks are freed one step later than 0.25.1's."""
    s = Scheduler(SchedulerConfig(profile=profile, async_scheduling=True, max_num_batched_tokens=32),
                  CacheConfig(16, 64, kv_groups=(KVGroupSpec("sliding_window", 16, 32),)),
                  make_block_hasher("sha256", 16, 0))
    s.add_request(make_request(s, "A", toks(96), max_tokens=4))
    pool = s.kv_cache_manager.block_pool
    outs, seen = [], []
    for k in range(4):
        outs.append(s.schedule())
        seen.append(pool.get_num_free_blocks())
        if k:  # the step before is applied once the next one is scheduled (two in flight)
            s.update_from_output(outs[k - 1], {"A": [9000 + k]} if outs[k - 1].scheduled[0].samples else {})
    assert seen == free
