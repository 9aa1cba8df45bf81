"""Property: random small traces through the scheduler with a CPU tier (both policies, sync and
async, chunk sizes 1-2 blocks, transfer delays 1-3) keep every invariant after every step
(``Scheduler.check_integrity``: the pool with deferred frees, the connector's jobs, the manager's
chunk accounting and policy), finish every request, and leave nothing in flight."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
from sim.core.hashing import make_block_hasher
from sim.core.offload.step_worker import StepDelayWorker
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.step_driver import drive
from sim.core.version_profile import V0_33_0

REQS = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 6), st.integers(0, 30), st.integers(1, 12), st.integers(0, 3)),
    min_size=1, max_size=14,
)


@settings(max_examples=60, deadline=None)
@given(
    reqs=REQS,
    policy=st.sampled_from(["lru", "arc"]),
    async_=st.booleans(),
    cpu=st.integers(1, 12),
    bpc=st.integers(1, 2),
    delay=st.integers(1, 3),
    budget=st.sampled_from([32, 64, 256]),
)
def test_tier_keeps_invariants(
    reqs: list[tuple[int, int, int, int, int]], policy: str, async_: bool, cpu: int, bpc: int, delay: int, budget: int
) -> None:
    h = make_block_hasher("fast", 16)
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=512, async_scheduling=async_,
                        profile=V0_33_0),
        CacheConfig(block_size=16, num_gpu_blocks=24, offload=OffloadConfig(cpu, bpc, policy)),  # type: ignore[arg-type]
        h,
    )
    prefixes = [list(range(1000 * (i + 1), 1000 * (i + 1) + 96)) for i in range(3)]
    requests = []
    t = 0.0
    for i, (pid, blocks, extra, out, gap) in enumerate(reqs):
        t += 0.01 * gap
        prompt = prefixes[pid][: 16 * blocks] + list(range(50_000 + 100 * i, 50_000 + 100 * i + extra))
        if not prompt:
            prompt = [7]
        requests.append((t, Request(f"r{i}", prompt, out, uid=i, arrival_time=t, hasher=h)))
    res = drive(sched, requests, worker=StepDelayWorker(delay), check=True, max_steps=20_000)
    assert all(o.finish_step is not None for o in res.requests.values())
    tier = sched.tier
    assert tier is not None
    assert not sched.has_requests() and not tier.connector.jobs and not tier.deferred_frees
    assert not tier.connector.req_status, "a finished request's state outlived its jobs"
    m = tier.connector.manager
    assert m.num_write_pending == 0
    assert m.stats.chunks_stored - m.stats.chunks_evicted == m.num_resident()
