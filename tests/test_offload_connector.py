"""Golden tests of the offload connector's scheduler side (vLLM 0.33.0
``OffloadingConnectorScheduler``): which chunks a step offers, stores and flushes, one rule per test.
Steps are driven by hand so each test reads one step's ``kv_connector_metadata``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hst

from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
from sim.core.executor import planned_samples
from sim.core.hashing import make_block_hasher
from sim.core.kv_cache_block import KVCacheBlock
from sim.core.offload.connector import OffloadingConnectorScheduler
from sim.core.offload.manager import LookupResult
from sim.core.offload.policy import ReqContext
from sim.core.offload.request_state import RequestOffloadState, chunk_blocks, stored_indices, stored_run
from sim.core.offload.step_worker import StepDelayWorker
from sim.core.offload.transfer import KVConnectorMetadata, KVConnectorOutput
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.scheduler_output import SchedulerOutput
from sim.core.version_profile import V0_33_0

H = make_block_hasher("sha256", 16)


def make(cpu: int = 16, gpu: int = 64, budget: int = 256, prompt_only: bool = True) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_model_len=4096, profile=V0_33_0),
        CacheConfig(block_size=16, num_gpu_blocks=gpu, offload=OffloadConfig(cpu, offload_prompt_only=prompt_only)),
        H,
    )


def req(rid: str, tokens: list[int], out: int = 4, uid: int = 0) -> Request:
    return Request(rid, tokens, out, uid=uid, hasher=H)


def conn(s: Scheduler) -> OffloadingConnectorScheduler:
    assert s.tier is not None
    return s.tier.connector


def step(s: Scheduler, worker: StepDelayWorker | None = None) -> tuple[SchedulerOutput, KVConnectorMetadata]:
    """One sync step: schedule, report nothing unless a worker is given, sample planned tokens."""
    out = s.schedule()
    meta = out.kv_connector_metadata
    assert meta is not None
    kv = worker.execute(meta) if worker is not None else KVConnectorOutput()
    s.update_from_output(out, planned_samples(out), kv)
    return out, meta


def stores(meta: KVConnectorMetadata) -> list[tuple[str, int]]:
    return [(j.request_id, j.num_blocks) for j in meta.store_jobs]


def test_store_offered_right_after_the_step_that_computes_the_chunks() -> None:
    """A chunked prefill stores each step's newly full chunks, in that step's metadata."""
    s = make(budget=40)
    s.add_request(req("a", list(range(80))))
    _, m0 = step(s)
    _, m1 = step(s)
    assert stores(m0) == [("a", 2)]  # 40 tokens computed: 2 full blocks
    assert stores(m1) == [("a", 3)]  # 80: blocks 2..4


def test_prompt_only_never_stores_decode_blocks() -> None:
    """offload_prompt_only: decode tokens that fill a block are not stored; without it they are."""
    for prompt_only, expect in ((True, []), (False, [("a", 1)])):
        s = make(prompt_only=prompt_only)
        s.add_request(req("a", list(range(16)), out=40))
        metas = [step(s)[1] for _ in range(20)]
        assert [j for m in metas[1:] for j in stores(m)] == expect


def test_gpu_hit_chunks_offered_again_without_external_hit() -> None:
    """No CPU hit: next_stored_chunk_idx stays 0, so the GPU-hit chunks are offered again -- the
    ones missing from CPU are stored (here: evicted from CPU meanwhile)."""
    s = make(cpu=2)
    w = StepDelayWorker(1)
    s.add_request(req("a", list(range(32)), out=1))
    step(s, w)
    step(s, w)  # a's finish is committed
    s.add_request(req("x", list(range(500, 532)), out=1, uid=1))  # evicts a's 2 chunks from CPU
    step(s, w)
    step(s, w)
    s.add_request(req("b", list(range(32)) + [9, 9], out=1, uid=2))
    out, meta = step(s, w)
    assert out.scheduled[0].hit_tokens == 32 and out.scheduled[0].external_hit_tokens == 0
    assert stores(meta) == [("b", 2)]


def test_external_hit_skips_hit_chunks_when_storing() -> None:
    """With a CPU hit, next_stored_chunk_idx moves past the GPU- and CPU-hit chunks (CHUNK_LEVEL):
    none of them is offered again."""
    s = make()
    w = StepDelayWorker(1)
    p = list(range(48))
    s.add_request(req("a", p, out=1))
    for _ in range(3):
        step(s, w)
    s.add_request(req("b", p, out=2, uid=1))
    _, m = step(s, w)  # lookup: GPU 32 (capped at num_tokens - 1), CPU 16: a one-block load
    assert [(j.request_id, j.kind, j.num_blocks) for j in m.load_jobs] == [("b", "load", 1)]
    assert conn(s).state("b").next_stored_chunk_idx == 3
    metas = [step(s, w)[1] for _ in range(4)]
    assert [j for mm in metas for j in stores(mm)] == []
    assert conn(s).manager.stats.chunks_loaded == 1


def test_allocation_failure_reoffers_next_step() -> None:
    """prepare_store None (every CPU chunk pending): counted, the index stays, offered again."""
    s = make(cpu=1)
    s.add_request(req("a", list(range(16)), out=8))
    s.add_request(req("b", list(range(300, 316)), out=8, uid=1))
    _, m0 = step(s)  # no worker: a's store stays pending
    assert stores(m0) == [("a", 1)]
    assert conn(s).stats.allocation_failures == 1
    out = s.schedule()
    assert out.kv_connector_metadata is not None and stores(out.kv_connector_metadata) == []
    assert conn(s).stats.allocation_failures == 2
    conn(s).update_connector_output(KVConnectorOutput(completed_jobs={0}))
    s.update_from_output(out, planned_samples(out))
    _, m2 = step(s)
    assert stores(m2) == [("b", 1)]  # a's chunk is ready and evictable now


def test_preempted_requests_jobs_are_flushed() -> None:
    """A request preempted with stores in flight: they are in this step's jobs_to_flush."""
    s = make(gpu=5)
    s.add_request(req("a", list(range(32)), out=40))
    s.add_request(req("b", list(range(300, 332)), out=40, uid=1))
    flushed: set[int] = set()
    for _ in range(30):
        out, meta = step(s)  # no worker: every store stays in flight
        flushed |= meta.jobs_to_flush
        if out.preempted:
            victim = out.preempted[0].request_id
            jobs = {j for j, st in conn(s).jobs.items() if st.req_id == victim}
            assert jobs and jobs <= meta.jobs_to_flush
            break
    else:
        raise AssertionError("no preemption")


def test_lookup_stops_at_first_missing_chunk() -> None:
    """Consecutive resident chunks from the GPU-hit boundary only: a gap ends the CPU hit."""
    c = make().tier
    assert c is not None
    con = c.connector
    r = req("x", list(range(64)))
    con.on_new_request(r)
    st = con.state("x")
    st.update_offload_keys(1, 16)
    keys = st.keys
    for i in (0, 2):  # (an offer names the index of its first key: the compiled tier reads it)
        out = con.manager.prepare_store([keys[i]], st.ctx, i)
        assert out is not None
        con.manager.complete_store(out.keys_to_store)
    assert con.manager.lookup(keys[1]) is LookupResult.MISS
    assert con.get_num_new_matched_tokens(r, 0) == (16, True)
    assert con.get_num_new_matched_tokens(r, 32) == (16, True)  # from chunk 2: k2 then k3 missing


def test_lookup_defers_while_request_has_jobs_in_flight() -> None:
    """A request with its own stores in flight is deferred (None) at its next lookup."""
    s = make(gpu=5)
    con = conn(s)
    r = req("a", list(range(32)))
    s.add_request(r)
    step(s)
    assert con.state("a").transfer_jobs
    assert con.get_num_new_matched_tokens(r, 0) == (None, False)


def test_block_sized_chunks_share_the_requests_hash_list() -> None:
    """A chunk of one block without key positions (the compiled tier): the keys are the request's
    own hash list, not a copy, equal at every update to the copy the positions path makes (the
    oracle); a released request (new, empty hash list) keeps its keys; two blocks a chunk copy."""
    r = req("a", list(range(40)), out=40)
    shared = RequestOffloadState(r, ReqContext("a"), track_positions=False)
    copied = RequestOffloadState(r, ReqContext("a"), track_positions=True)
    for st in (shared, copied):
        st.update_offload_keys(1, 16)
    assert shared.keys is r.block_hashes and copied.keys is not r.block_hashes
    assert shared.keys == copied.keys and len(copied.keys) == 2
    for grow in (list(range(40, 50)), list(range(50, 70))):  # blocks 2 and 3, then 4
        r.append_output_token_ids(grow)
        for st in (shared, copied):
            st.update_offload_keys(1, 16)
        assert shared.keys == copied.keys == r.block_hashes
    kept = list(copied.keys)
    r.release_tokens()
    for st in (shared, copied):
        st.update_offload_keys(1, 16)
    assert shared.keys == copied.keys == kept and len(kept) == 4
    r2 = req("b", list(range(64)))
    two = RequestOffloadState(r2, ReqContext("b"), track_positions=False)
    two.update_offload_keys(2, 32)
    assert two.keys == r2.block_hashes[1::2] and two.keys is not r2.block_hashes


@settings(max_examples=200, deadline=None)
@given(bpc=hst.integers(1, 3), picked=hst.sets(hst.integers(0, 11), min_size=1))
def test_a_store_jobs_source_blocks_are_its_chunks_blocks(bpc: int, picked: set[int]) -> None:
    """``chunk_blocks`` of listed chunk indices (ascending, distinct: a partial offer's stored
    chunks) gives every block of those chunks, in order -- a run of indices as one slice."""
    blocks = [KVCacheBlock(i) for i in range(12 * bpc)]
    ids = sorted(picked)
    want = [blocks[c * bpc + j] for c in ids for j in range(bpc)]
    assert chunk_blocks(blocks, ids[0], ids[-1] + 1, ids, bpc) == want
    assert chunk_blocks(blocks, ids[0], ids[-1] + 1, [], bpc) == blocks[ids[0] * bpc : (ids[-1] + 1) * bpc]


@settings(max_examples=200, deadline=None)
@given(n=hst.integers(1, 10), start=hst.integers(0, 5), data=hst.data())
def test_a_partial_offers_stored_chunks_are_a_run_or_listed(n: int, start: int, data: hst.DataObject) -> None:
    """``stored_run``: a partial offer whose stored keys are its tail gives ``(first, [])`` -- the
    chunks from ``first`` to the offer's end, no list --, any other subsequence its indices, listed
    (``stored_indices``), and both name the same chunks."""
    offered = [f"k{start + i}".encode() for i in range(n)]
    picked = sorted(data.draw(hst.sets(hst.integers(0, n - 1), min_size=1)))
    stored = [offered[i] for i in picked]
    first, listed = stored_run(offered, stored, start)
    want = [start + i for i in picked]
    assert stored_indices(offered, stored, start) == want
    if picked == list(range(picked[0], n)):
        assert (first, listed) == (start + picked[0], [])
    else:
        assert (first, listed) == (want[0], want)
