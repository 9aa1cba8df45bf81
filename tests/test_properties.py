"""Property tests: random workloads (shared prefixes, salts, LoRAs, tiny pools, random scheduler
configs) driven through the scheduler, with invariants checked after every step -- on the unitary
full-attention fast path, and against the generic per-group coordinators as its oracle (the hybrid
coordinator's random workloads are in ``test_kv_groups.py``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from conftest import StepLog, drive, make_request, make_scheduler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.block_pool import BlockPool
from sim.core.hashing import make_block_hasher
from sim.core.kv_cache_spec import KVGroupSpec
from sim.core.kv_events import BlockStored
from sim.core.request import Request

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))


@dataclass
class Spec:
    rid: str
    prompt: list[int]
    max_tokens: int
    arrival: int
    salt: str | None
    lora: str | None
    priority: int
    prompt_logprobs: bool
    outputs: list[int] | None


@dataclass
class Scenario:
    block_size: int
    num_blocks: int
    config: dict
    specs: list[Spec]


@st.composite
def scenarios(draw, max_requests: int = 10) -> Scenario:
    bs = draw(st.sampled_from([4, 8, 16]))
    # a few shared bases; most prompts take a whole base (or a block-aligned part) plus a short
    # suffix over a tiny vocabulary, so prefixes -- and even generated blocks -- get shared
    base_lens = st.sampled_from([0, bs, 2 * bs + 1, 4 * bs, 6 * bs + 3])
    bases = [
        draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
        for n in draw(st.lists(base_lens, min_size=1, max_size=2))
    ]
    n = draw(st.integers(2, max_requests))
    specs = []
    for i in range(n):
        base = bases[draw(st.integers(0, len(bases) - 1))]
        cut = draw(st.sampled_from([len(base), len(base), len(base) // 2, draw(st.integers(0, len(base)))]))
        slen = draw(st.sampled_from([0, 0, 1, bs - 1, bs, 2 * bs + 3]))
        suffix = draw(st.lists(st.integers(0, 2), min_size=slen, max_size=slen))
        prompt = (base[:cut] + suffix) or [7]
        max_tokens = draw(st.sampled_from([1, 2, bs, 3 * bs + 1, draw(st.integers(1, 4 * bs))]))
        outputs = draw(
            st.one_of(st.none(), st.lists(st.integers(0, 1), min_size=max_tokens, max_size=max_tokens))
        )
        specs.append(
            Spec(
                rid=f"r{i}",
                prompt=prompt,
                max_tokens=max_tokens,
                arrival=draw(st.integers(0, 12)),
                salt=draw(st.sampled_from([None, None, None, None, "", "a", "b"])),
                lora=draw(st.sampled_from([None, None, None, None, "L1"])),
                priority=draw(st.integers(0, 2)),
                prompt_logprobs=draw(st.sampled_from([False] * 7 + [True])),
                outputs=outputs,
            )
        )
    longest = max(len(s.prompt) + s.max_tokens for s in specs)
    # every request must fit the pool on its own, or it can block the queue forever (spec row 30)
    min_blocks = -(-longest // bs) + 1
    num_blocks = min_blocks + draw(st.sampled_from([0, 0, 1, 2, 4, 8, 20, 60]))
    chunked = draw(st.booleans())
    if chunked:
        budget = draw(st.sampled_from([1, 3, bs, 2 * bs + 1, 64, 512]))
        threshold = draw(st.sampled_from([0, 0, 1, 5, bs, 40]))
    else:
        budget = longest + draw(st.sampled_from([0, 10, 500]))
        threshold = 0
    config = dict(
        max_num_batched_tokens=budget,
        max_num_seqs=draw(st.sampled_from([1, 2, 3, 8, 128])),
        max_model_len=longest + draw(st.sampled_from([0, 1, 100])),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.05, 0.2])),
        enable_prefix_caching=draw(st.sampled_from([True, True, True, False])),
    )
    return Scenario(bs, num_blocks, config, specs)


def build(sc: Scenario, algo: str = "sha256", **extra):
    sched = make_scheduler(sc.num_blocks, sc.block_size, algo, **sc.config, **extra)
    arrivals: dict[int, list[Request]] = {}
    for i, s in enumerate(sc.specs):
        # distinct arrival times, increasing in add order within a step, as vLLM's time.time() at
        # add_request: with ties, priority preemption (max over (priority, arrival_time)) can pick
        # two equal requests in turn forever, which a real engine's clock never lets happen
        r = make_request(
            sched, s.rid, s.prompt, s.max_tokens,
            cache_salt=s.salt, lora_name=s.lora, priority=s.priority,
            arrival_time=s.arrival + i / 1000, prompt_logprobs=s.prompt_logprobs,
            output_token_ids=s.outputs,
        )
        arrivals.setdefault(s.arrival, []).append(r)
    return sched, arrivals


def check_step(sc: Scenario, log: StepLog, sched) -> None:
    cfg = sc.config
    bs = sc.block_size
    kvm = sched.kv_cache_manager
    out = log.output
    # budgets
    assert out.total_num_scheduled_tokens == sum(log.scheduled.values()) <= cfg["max_num_batched_tokens"]
    assert all(n > 0 for n in log.scheduled.values())
    if cfg["long_prefill_token_threshold"]:
        assert all(n <= cfg["long_prefill_token_threshold"] for n in log.scheduled.values())
    assert len(sched.running) <= cfg["max_num_seqs"]
    assert len(log.scheduled) <= cfg["max_num_seqs"]
    if log.preempted:
        assert not log.admitted  # no admissions in a step that preempted
    # hits: whole blocks, capped at num_tokens - 1
    for s in out.scheduled:
        if s.admitted:
            r = s.request
            assert s.hit_tokens % bs == 0
            assert s.hit_tokens <= r.num_tokens - 1
            if r.prompt_logprobs or not cfg["enable_prefix_caching"]:
                assert s.hit_tokens == 0
    # block lists: the first num_cached blocks carry exactly the request's own hashes, the rest none
    holders: dict[int, list[tuple[Request, int]]] = {}
    for rid in kvm.request_ids():
        blocks = kvm.get_blocks(rid)
        r = sched.requests[rid]
        n_cached = kvm.get_num_cached_blocks(rid)
        for i, b in enumerate(blocks):
            if i < n_cached:
                assert b.block_hash == r.block_hashes[i], (rid, i)
            else:
                assert b.block_hash is None, (rid, i, b.block_id)
            holders.setdefault(b.block_id, []).append((r, i))
        assert len(blocks) * bs >= r.num_computed_tokens
    # a shared block holds the same content (salt, LoRA, token prefix) at the same index in all holders
    for bid, hs in holders.items():
        if len(hs) < 2:
            continue
        r0, i0 = hs[0]
        content0 = (r0.cache_salt or None, r0.lora_name, r0.all_token_ids[: (i0 + 1) * bs])
        for r, i in hs[1:]:
            assert i == i0, (bid, r.request_id)
            assert (r.cache_salt or None, r.lora_name, r.all_token_ids[: (i + 1) * bs]) == content0, bid
    # never a hit across different salts
    held = {rid: {b.block_id for b in kvm.get_blocks(rid)} for rid in kvm.request_ids()}
    rids = sorted(held)
    for x in range(len(rids)):
        for y in range(x + 1, len(rids)):
            ra, rb = sched.requests[rids[x]], sched.requests[rids[y]]
            if (ra.cache_salt or None) != (rb.cache_salt or None):
                assert held[rids[x]].isdisjoint(held[rids[y]]), (rids[x], rids[y])


def run(sc: Scenario, algo: str = "sha256", **extra):
    sched, arrivals = build(sc, algo, **extra)
    res = drive(sched, arrivals, max_steps=20_000, after_step=lambda log, s: check_step(sc, log, s))
    return sched, res


@SETTINGS
@given(sc=scenarios())
def test_random_workloads_keep_every_invariant(sc):
    sched, res = run(sc)
    assert not res.unfinished, res.unfinished
    assert not sched.has_unfinished_requests()
    for s in sc.specs:
        r = res.finished[s.rid]
        assert len(r.output_token_ids) == s.max_tokens
        if s.outputs is not None:
            assert r.output_token_ids == s.outputs
    # every admission follows a recorded lookup (skipped for prompt_logprobs / caching off)
    readers = {s.rid for s in sc.specs if not s.prompt_logprobs}
    n_adm = sum(len(v) for rid, v in res.admissions.items() if rid in readers)
    lookups = res.stats.requests + res.stats.preempted_requests
    if sc.config["enable_prefix_caching"]:
        assert lookups >= n_adm
        assert res.stats.requests >= len(readers)
        assert res.stats.hits <= res.stats.queries
        assert res.stats.preempted_hits <= res.stats.preempted_queries
    else:
        assert lookups == 0 and all(h == 0 for h in res.first_hits.values())
    # everything is free at the end; the pool holds nothing
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == sc.num_blocks - 1
    assert not sched.kv_cache_manager.request_ids()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(sc=scenarios(max_requests=8))
def test_fast_hasher_gives_the_same_simulation_as_sha256(sc):
    """The ``fast`` hasher has sha256's equality structure, so every step is identical."""
    _, a = run(sc, "sha256")
    _, b = run(sc, "fast")
    assert len(a.steps) == len(b.steps)
    for x, y in zip(a.steps, b.steps):
        assert (x.scheduled, x.admitted, x.preempted, x.finished, x.free_block_ids) == (
            y.scheduled, y.admitted, y.preempted, y.finished, y.free_block_ids
        )
        assert [s.new_block_ids for s in x.output.scheduled] == [s.new_block_ids for s in y.output.scheduled]
    assert a.stats == b.stats


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(sc=scenarios(max_requests=8))
def test_generic_coordinator_gives_the_same_simulation_as_the_fast_path(sc):
    """One full-attention group given as ``kv_groups`` goes through the per-group managers (the
    unitary coordinator, or the no-prefix-cache one with caching off) -- the fast path's oracle:
    every step, block id, free queue and stat is identical; integrity holds after every step."""
    fast, a = run(sc)
    generic, b = run(sc, kv_groups=(KVGroupSpec("full", sc.block_size),))
    assert fast.kv_cache_manager.is_unitary_full_attention and not generic.kv_cache_manager.is_unitary_full_attention
    assert len(a.steps) == len(b.steps)
    for x, y in zip(a.steps, b.steps):
        assert (x.scheduled, x.admitted, x.preempted, x.finished, x.free_block_ids, x.stats) == (
            y.scheduled, y.admitted, y.preempted, y.finished, y.free_block_ids, y.stats
        )
        assert [s.new_block_ids for s in x.output.scheduled] == [s.new_block_ids for s in y.output.scheduled]
    assert a.stats == b.stats


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(sc=scenarios(max_requests=8), pool_impl=st.sampled_from(["python", "compiled"]))
def test_fast_path_and_generic_coordinator_emit_identical_kv_events(sc, pool_impl):
    """With an event sink, the full-attention fast path and the generic per-group managers emit the
    same KV events, field for field -- ``BlockStored.kv_cache_spec_kind`` is ``"full_attention"``
    on both, as vLLM's KVCacheManager annotates every stored block with its group's spec kind."""
    # given outputs: synthetic ones are unique per request object, so they differ between the runs
    sc = Scenario(sc.block_size, sc.num_blocks, sc.config,
                  [replace(s, outputs=s.outputs or [1] * s.max_tokens) for s in sc.specs])
    fast, _ = run(sc, events=True, pool_impl=pool_impl)
    generic, _ = run(sc, events=True, pool_impl=pool_impl, kv_groups=(KVGroupSpec("full", sc.block_size),))
    assert fast.kv_cache_manager.is_unitary_full_attention and not generic.kv_cache_manager.is_unitary_full_attention
    assert list(fast.event_sink) == list(generic.event_sink)
    assert all(e.kv_cache_spec_kind == "full_attention" for e in fast.event_sink.of(BlockStored))


# -- the block pool against a plain list model of the free queue ------------------------------

_ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "cache", "touch", "free"]), st.integers(0, 10**6), st.integers(1, 4)),
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(num_blocks=st.integers(2, 12), ops=_ops)
def test_block_pool_matches_list_model(num_blocks, ops):
    """Free queue = a list: alloc pops the head (dropping hashes), touch unlinks free blocks,
    free puts ref-0 unhashed blocks (in order) at the head and hashed ones at the tail."""
    bs = 4
    hasher = make_block_hasher("sha256", bs)
    pool = BlockPool(num_blocks)
    model = list(range(1, num_blocks))
    refs = {i: 0 for i in range(1, num_blocks)}
    hashed: dict[int, bytes] = {}
    held: list[int] = []  # one entry per reference
    for op, seed, k in ops:
        if op == "alloc":
            k = min(k, len(model))
            got = [b.block_id for b in pool.get_new_blocks(k)]
            assert got == model[:k]
            for bid in got:
                hashed.pop(bid, None)
                refs[bid] = 1
            del model[:k]
            held.extend(got)
        elif op == "cache" and held:
            bid = held[seed % len(held)]
            if bid in hashed:
                continue
            # give it a unique content hash (a one-block request)
            r = make_request(hasher, f"c{seed}", [seed, bid, 1, 2])
            pool.cache_full_blocks(r, [pool.blocks[bid]], 0, 1, bs)
            hashed[bid] = r.block_hashes[0]
        elif op == "touch" and hashed:
            cands = sorted(hashed)
            bid = cands[seed % len(cands)]
            assert pool.get_cached_block(hashed[bid], [0])[0].block_id == bid
            pool.touch([pool.blocks[bid]])
            if refs[bid] == 0:
                model.remove(bid)
            refs[bid] += 1
            held.append(bid)
        elif op == "free" and held:
            n = min(k, len(held))
            start = seed % len(held)
            batch = (held[start:] + held[:start])[:n]
            for bid in batch:
                held.remove(bid)
            pool.free_blocks([pool.blocks[b] for b in batch])
            unhashed, withh = [], []
            for bid in batch:
                refs[bid] -= 1
                if refs[bid] == 0:
                    (withh if bid in hashed else unhashed).append(bid)
            model[:0] = unhashed
            model.extend(withh)
        assert pool.free_block_ids() == model
        pool.check_integrity()
        assert {b.block_id for b in pool.blocks[1:] if b.block_hash is not None} == set(hashed)
