"""An engine waiting for a CPU-tier transfer wakes for an arrival (``sim.replay.step_runner.
empty_step_end``): vLLM 0.33.0's ``EngineCore.run_busy_loop`` keeps stepping while a transfer is
pending, each empty step only polls the connector, and ``_process_input_queue`` runs between steps,
so a request arriving while a load is in flight is scheduled at the first step after its arrival --
not when the load lands. Golden timelines computed by hand, in the single engine and in a fleet.

The scenario (block 16, 8 usable GPU blocks, a fixed 0.01 s step, a CPU tier over a 0.04 GB/s link
per direction, 1 MB per block: one block crosses in 0.025 s):

* ``r0`` (t=0, 64 tokens, 4 blocks) runs in [0, 0.01] and is stored to the CPU tier;
* ``r1`` (t=0.3, 128 tokens, 8 blocks) evicts ``r0``'s blocks from the GPU pool;
* ``r2`` (t=0.6) = ``r0``'s 64 tokens + 16 new: 64 tokens hit the CPU tier. Step 4 at 0.60 submits
  the 4-block load (lands at 0.60 + 4 x 0.025 = 0.70) and schedules nothing; a load is never
  reported in its own step, so step 4 takes no time;
* ``r3`` (t=0.62, 32 tokens, 2 blocks, fits beside ``r2``'s 5) arrives while the load is in flight.

Step 5 (empty, at 0.60) lasts until ``r3``'s arrival at 0.62 (before: until the landing at 0.70);
step 6 at 0.62 prefills ``r3``: first token at 0.63, TTFT = one step = 0.01 s (before: 0.70 - 0.62
+ 0.01 = 0.09 s). Step 7 (empty, 0.63) lasts until ``r3``'s 2-block store lands (0.63 + 0.05 =
0.68), step 8 until the load lands (0.70), whose output reports it; step 9 at 0.70 prefills ``r2``'s
last 16 tokens: TTFT 0.11 s, ``kv_wait_steps`` 5 (steps 4 to 8: the count keeps its meaning -- the
engine's steps while the request waited -- and counts the poll step that ended at ``r3``'s arrival
and ``r3``'s own step).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from store_polling_fleet import STORE, replay_polling_fleet

from sim.cluster.basic_routers import RoundRobinRouter
from sim.cluster.cluster import ClusterReplay
from sim.cluster.replica import ReplicaSpec
from sim.cluster.router import ReplicaFacts
from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
from sim.core.hashing import make_block_hasher
from sim.core.scheduler import Scheduler
from sim.core.version_profile import V0_33_0
from sim.experiment.config import config_from_dict
from sim.replay.engine import Replay
from sim.replay.kv_transfer import LinkKVWorker
from sim.replay.step_runner import empty_step_end
from sim.timing.latency import FixedLatency
from sim.timing.simulated_executor import SimulatedExecutor
from sim.timing.transfer_link import TransferLink
from workloads.trace_format import TraceRequest

STEP = 0.01
PROMPT0 = np.arange(100, 164)
STREAM = [
    TraceRequest("r0", 0.0, PROMPT0, 1),
    TraceRequest("r1", 0.3, np.arange(1000, 1128), 1),
    TraceRequest("r2", 0.6, np.concatenate([PROMPT0, np.arange(2000, 2016)]), 1),
    TraceRequest("r3", 0.62, np.arange(3000, 3032), 1),
]
# (request, first step's start, first token, external hit tokens, kv_wait_steps), by hand above
EXPECTED = [("r0", 0.0, 0.01, 0, 0), ("r1", 0.3, 0.31, 0, 0), ("r2", 0.70, 0.71, 64, 5), ("r3", 0.62, 0.63, 0, 0)]
# (start, duration) of every step, by hand above
STEPS = [(0.0, STEP), (0.01, 0.10), (0.30, STEP), (0.31, 0.20), (0.60, 0.0), (0.60, 0.02), (0.62, STEP),
         (0.63, 0.05), (0.68, 0.02), (0.70, STEP), (0.71, 0.025)]


def _scheduler(async_scheduling: bool = False) -> Scheduler:
    return Scheduler(
        SchedulerConfig(profile=V0_33_0, max_model_len=256, max_num_batched_tokens=256, max_num_seqs=4,
                        async_scheduling=async_scheduling),
        CacheConfig(16, 9, offload=OffloadConfig(64, blocks_per_chunk=1, policy="lru")),
        make_block_hasher("fast", 16),
    )


def _worker() -> LinkKVWorker:
    return LinkKVWorker(TransferLink(0.04), 10**6)


def _check(requests: Any, steps: Any) -> None:
    rows = requests.set_index("request_id")
    for rid, start, first, external, waits in EXPECTED:
        r = rows.loc[rid]
        assert (r["first_scheduled"], r["first_token"]) == pytest.approx((start, first), abs=1e-9), rid
        assert (r["external_hit_tokens"], r["kv_wait_steps"]) == (external, waits), rid
    assert rows.loc["r3", "ttft"] == pytest.approx(STEP, abs=1e-9)  # scheduled at its arrival
    assert list(steps["start"]) == pytest.approx([s for s, _ in STEPS], abs=1e-9)
    assert list(steps["duration"]) == pytest.approx([d for _, d in STEPS], abs=1e-9)


def test_an_engine_waiting_for_a_load_schedules_an_arrival_at_once() -> None:
    res = Replay(_scheduler(), SimulatedExecutor(FixedLatency(STEP)), STREAM, fast_forward=False,
                 kv_worker=_worker(), integrity_check=True).run()
    _check(res.requests, res.steps)


def test_the_async_engine_waiting_for_a_load_schedules_an_arrival_at_once() -> None:
    # the two-batch loop (EngineCore.step_with_batch_queue) runs the same requests' timeline; its
    # step table differs (a batch is applied one step later: r2 waits 6 steps, not 5)
    res = Replay(_scheduler(async_scheduling=True), SimulatedExecutor(FixedLatency(STEP)), STREAM,
                 fast_forward=False, kv_worker=_worker(), integrity_check=True).run()
    rows = res.requests.set_index("request_id")
    for rid, start, first, external, _ in EXPECTED:
        r = rows.loc[rid]
        assert (r["first_scheduled"], r["first_token"]) == pytest.approx((start, first), abs=1e-9), rid
        assert r["external_hit_tokens"] == external, rid


@pytest.mark.parametrize("fast_forward", [False, True])
def test_a_replica_waiting_for_a_load_schedules_a_routed_request_at_once(fast_forward: bool) -> None:
    # the replica's empty step ends at the cluster's next routing instant (RoutedIntake.next_arrival)
    spec = ReplicaSpec("replica-0", ReplicaFacts(16, 9, 256, "fast", 0, FixedLatency(STEP), cpu_tier=True),
                       _scheduler, lambda s: SimulatedExecutor(FixedLatency(STEP)), fast_forward,
                       build_kv_worker=_worker)
    res = ClusterReplay([spec], RoundRobinRouter(0), STREAM, integrity_check=True).run()
    assert list(res.requests["replica"]) == [0] * 4
    _check(res.requests, res.replicas[0].steps)


@pytest.mark.parametrize(("landing", "now", "arrival", "end"), [
    (0.70, 0.60, 0.62, 0.62),  # an arrival before the landing ends the poll
    (0.70, 0.60, 0.80, 0.70),  # the landing first
    (0.70, 0.60, float("inf"), 0.70),  # nothing more arrives
    (0.60, 0.60, 0.62, 0.60),  # nothing may be reported in this step: no time
    (0.70, 0.60, 0.55, 0.60),  # never before the step's start
])
def test_an_empty_step_ends_at_the_landing_or_the_next_arrival(landing: float, now: float, arrival: float,
                                                               end: float) -> None:
    assert empty_step_end(landing, now, arrival) == end


def test_a_replica_waiting_for_its_own_store_write_schedules_routed_requests_at_once() -> None:
    # a shared store with slow writes (0.01 GB/s: a's 4 blocks land near 0.85 s): replica 0 has only
    # that write pending when x (t=0.05) and d (t=0.2) are routed to it (round robin: a, x, d on 0;
    # c, b on 1); each is scheduled at its arrival and prefills in one 0.01 s step (before: both
    # waited for the write's landing, TTFT 0.81 and 0.66 s). b still waits for a's blocks.
    cfg = config_from_dict({
        "name": "t", "latency": {"kind": "fixed", "step_time_s": STEP},
        "engine": {"block_size": 16, "num_gpu_blocks": 600, "max_model_len": 8192, "vllm_version": "0.33.0"},
        "workload": {"kind": "chat", "sessions": 30},
        "cluster": {"replicas": 2, "router": "round_robin",
                    "kv_store": STORE},
    })
    res = replay_polling_fleet(cfg)
    rows = res.requests.set_index("request_id")
    assert list(rows.loc[["x", "d"], "replica"]) == [0, 0]
    for rid, arrival in (("x", 0.05), ("d", 0.2)):
        assert rows.loc[rid, "first_scheduled"] == pytest.approx(arrival, abs=1e-9)
        assert rows.loc[rid, "ttft"] == pytest.approx(STEP, abs=1e-9)
    b = res.requests[res.requests["request_id"] == "b"]
    assert list(b["remote_hit_tokens"]) == [64] and float(b["first_scheduled"].iloc[0]) > 0.8
