"""The scheduler's connector path with the CPU tier (vLLM 0.33.0's OffloadingConnector): the facts
``shared/docs/vllm-033-offload.md`` confirmed by running vLLM's own scheduler with a stub worker,
one per test, driven step by step as ``tools/vllm_oracle`` drives vLLM (``sim.core.step_driver``),
plus the untiered path's guarantees (no connector, no deferred frees)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
from sim.core.hashing import make_block_hasher
from sim.core.offload.step_worker import StepDelayWorker
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.step_driver import DriveResult, drive
from sim.core.version_profile import V0_33_0

Spec = tuple[str, float, Sequence[int], int]  # id, arrival, prompt, output tokens


def run(
    reqs: Sequence[Spec], *, policy: str = "lru", cpu: int = 64, gpu: int = 64, async_: bool = False,
    delay: int = 1, blocks_per_chunk: int = 1,
) -> tuple[DriveResult, Scheduler]:
    h = make_block_hasher("sha256", 16)
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=256, max_model_len=4096, async_scheduling=async_, profile=V0_33_0),
        CacheConfig(block_size=16, num_gpu_blocks=gpu,
                    offload=OffloadConfig(cpu, blocks_per_chunk=blocks_per_chunk, policy=policy)),  # type: ignore[arg-type]
        h,
    )
    rs = [(t, Request(rid, list(toks), out, uid=i, hasher=h)) for i, (rid, t, toks, out) in enumerate(reqs)]
    return drive(sched, rs, worker=StepDelayWorker(delay)), sched


def hits(res: DriveResult) -> dict[str, tuple[int | None, int]]:
    return {rid: (o.hit_tokens, o.external_hit_tokens) for rid, o in res.requests.items()}


P32 = list(range(32))


def test_repeat_prompt_loads_last_block_from_cpu() -> None:
    """[run] a 32-token prompt repeated: GPU 16 (capped at num_tokens - 1) + CPU 16 -- the CPU
    lookup is bounded by num_tokens, so the last block is loaded although the GPU has it."""
    res, _ = run([("a", 0.0, P32, 2), ("b", 1.0, P32, 2)])
    assert hits(res) == {"a": (0, 0), "b": (16, 16)}


@pytest.mark.parametrize(("async_", "waited"), [(False, 2), (True, 3)])
def test_load_waits_two_steps_sync_three_async(async_: bool, waited: int) -> None:
    """[run] a load started at step s (K=1) runs at s+2 in the sync engine, s+3 with two batches."""
    res, _ = run([("a", 0.0, P32, 2), ("b", 1.0, P32, 2)], async_=async_)
    assert res.requests["b"].steps_waiting_for_kv == waited


def test_pending_store_defers_lookup_without_blocking_later_requests() -> None:
    """[run] pending_defer: b's chunk is still being stored (HIT_PENDING), so b is skipped for 3
    steps (K=3); c, behind it, is admitted first."""
    res, sched = run([("a", 0.0, P32, 4), ("b", 0.01, P32, 2), ("c", 0.01, list(range(700, 720)), 2)], delay=3)
    assert hits(res) == {"a": (0, 0), "b": (16, 16), "c": (0, 0)}
    assert res.requests["c"].first_scheduled_step == 1
    assert sched.tier is not None and sched.tier.connector.stats.deferred_lookups == 3


def _scan_reuse() -> list[Spec]:
    hot = list(range(64))

    def scan(i: int) -> list[int]:
        return list(range(1000 + 100 * i, 1064 + 100 * i))

    first: list[Spec] = [("h1", 0.0, hot, 1)]
    return (
        first
        + [(f"g{i}", 1.0 + 0.1 * i, scan(i), 1) for i in range(3)]
        + [("k", 1.5, list(range(9000, 9008)), 60), ("h2", 2.0, hot, 1)]
        + [(f"s{i}", 3.0 + 0.1 * i, scan(10 + i), 1) for i in range(4)]
        + [("h3", 5.0, hot, 1)]
    )


@pytest.mark.parametrize(("policy", "h3_cpu"), [("arc", 64), ("lru", 0)])
def test_scan_evicts_reused_chunks_under_lru_not_arc(policy: str, h3_cpu: int) -> None:
    """[run] scan_reuse: h2 reloads the hot prefix from CPU (ARC: T1 -> T2); a scan of 16 new
    chunks then evicts T1 only under ARC, so h3 gets CPU 64 under ARC and 0 under LRU."""
    res, _ = run(_scan_reuse(), policy=policy, cpu=16, gpu=14)
    assert hits(res)["h2"] == (0, 64)
    assert hits(res)["h3"] == (0, h3_cpu)


def test_preempted_request_resumes_from_gpu_and_cpu() -> None:
    """[run] preempt_resume: B, preempted, resumes with GPU 16 + CPU 32 of its own prompt."""
    res, _ = run([("A", 0.0, list(range(100, 132)), 40), ("B", 0.0, list(range(500, 548)), 40)], gpu=7)
    assert res.requests["B"].num_preemptions == 1
    assert res.requests["B"].readmit_hits == [(16, 32)]


def test_cpu_hit_under_one_chunk_is_zero() -> None:
    """Chunks of 2 blocks: a GPU hit of 16 tokens leaves 16 CPU tokens in the first chunk, under
    one chunk (32), so the CPU hit is 0 (``hit < tokens_per_chunk -> 0``)."""
    p = list(range(48))
    res, _ = run([("a", 0.0, p, 2), ("b", 1.0, p[:40], 2)], blocks_per_chunk=2)
    assert hits(res)["b"] == (32, 0)


def test_whole_prompt_load_recomputes_last_token() -> None:
    """A load that covers the whole prompt leaves num_tokens - 1 computed: one token scheduled."""
    res, sched = run([("a", 0.0, P32, 1), ("f", 0.5, list(range(5000, 5000 + 16 * 60)), 1), ("b", 1.0, P32, 1)],
                     gpu=61)
    assert hits(res)["b"] == (0, 32)


def test_no_connector_means_no_tier_and_no_deferred_free() -> None:
    """Without CacheConfig.offload the scheduler has no tier, no connector metadata, and frees
    blocks at once (defer_block_free is a connector-only setting)."""
    h = make_block_hasher("sha256", 16)
    sched = Scheduler(SchedulerConfig(async_scheduling=True), CacheConfig(block_size=16, num_gpu_blocks=64), h)
    assert sched.tier is None
    sched.add_request(Request("a", P32, 1, hasher=h))
    out = sched.schedule()
    assert out.kv_connector_metadata is None


def test_async_tier_defers_block_frees() -> None:
    """With async scheduling and a connector, a finished request's blocks return to the pool only
    after the in-flight step's output (vLLM defer_block_free)."""
    res, sched = run([("a", 0.0, P32, 1), ("b", 0.0, list(range(300, 332)), 3)], async_=True)
    assert sched.tier is not None and sched.tier.defer_block_free
    assert not sched.tier.deferred_frees
    assert res.requests["a"].finish_step is not None


def test_engine_keeps_stepping_while_stores_are_in_flight() -> None:
    """has_requests() stays true while connector jobs are pending (has_pending_push_work)."""
    h = make_block_hasher("sha256", 16)
    sched = Scheduler(
        SchedulerConfig(profile=V0_33_0), CacheConfig(block_size=16, num_gpu_blocks=64, offload=OffloadConfig(8)), h
    )
    sched.add_request(Request("a", P32, 1, hasher=h))
    worker = StepDelayWorker(3)
    out = sched.schedule()
    assert out.kv_connector_metadata is not None and len(out.kv_connector_metadata.store_jobs) == 1
    sched.update_from_output(out, {"a": [7]}, worker.execute(out.kv_connector_metadata))
    steps = 0
    while sched.has_requests():
        out = sched.schedule()
        assert out.total_num_scheduled_tokens == 0
        sched.update_from_output(out, {}, worker.execute(out.kv_connector_metadata))
        steps += 1
    assert steps == 3
