"""The replay loops with a CPU offload tier: what keeps the engine stepping and what is a stall."""

from __future__ import annotations

import numpy as np

from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
from sim.core.hashing import make_block_hasher
from sim.core.scheduler import Scheduler
from sim.core.version_profile import V0_33_0
from sim.replay.engine import Replay
from sim.replay.kv_transfer import LinkKVWorker
from sim.timing.latency import FixedLatency
from sim.timing.simulated_executor import SimulatedExecutor
from sim.timing.transfer_link import TransferLink
from workloads.trace_format import TraceRequest


def test_an_empty_async_batch_carrying_a_finished_load_is_not_a_stall() -> None:
    # Async scheduling, a tiny pool: r4's CPU load completes in a batch that scheduled nothing; the
    # loop must apply that batch (its report admits r4, whose finish frees the pool for r5) before
    # it calls the engine stalled. Found by tests/test_attribution_tier.py's property.
    sched = Scheduler(
        SchedulerConfig(profile=V0_33_0, max_model_len=512, max_num_batched_tokens=32, max_num_seqs=2,
                        async_scheduling=True),
        CacheConfig(16, 10, offload=OffloadConfig(4, blocks_per_chunk=2, policy="lru")),
        make_block_hasher("fast", 16),
    )
    spec = [(134, True), (99, True), (99, True), (99, True), (134, False), (99, True)]
    reqs = [TraceRequest(f"r{i}", 0.0, np.zeros(n, dtype=np.int64), 1, prompt_logprobs=lp)
            for i, (n, lp) in enumerate(spec)]
    worker = LinkKVWorker(TransferLink(1000.0), 10**6)
    result = Replay(sched, SimulatedExecutor(FixedLatency(0.01)), reqs, fast_forward=False, kv_worker=worker).run()
    rows = result.requests.set_index("request_id")
    assert list(rows["status"]) == ["finished"] * 6
    assert rows.loc["r4", "hit_tokens"] == 96 and rows.loc["r4", "kv_wait_steps"] > 0
