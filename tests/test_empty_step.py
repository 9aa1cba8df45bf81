"""An engine step that schedules nothing costs no time.

vLLM runs no forward pass for an empty batch (``GPUModelRunner.execute_model`` returns
``EMPTY_MODEL_RUNNER_OUTPUT`` at once), so the engine's next iteration starts at the same instant.
Under async scheduling such a step happens whenever the only running request has its last token in
flight and the waiting head does not fit; in sync mode, when a step only preempts.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.core.hashing import make_block_hasher
from sim.core.scheduler import CacheConfig, Scheduler, SchedulerConfig
from sim.replay.engine import Replay
from sim.timing.latency import FixedLatency
from sim.timing.simulated_executor import SimulatedExecutor
from workloads.trace_format import TraceRequest


def _sched(num_blocks: int, *, async_scheduling: bool, **kw) -> Scheduler:
    kw.setdefault("max_model_len", 1024)
    return Scheduler(SchedulerConfig(async_scheduling=async_scheduling, **kw), CacheConfig(16, num_blocks),
                     make_block_hasher("sha256", 16))


def _req(rid: str, arrival: float, n: int, out: int, base: int) -> TraceRequest:
    return TraceRequest(rid, arrival, np.arange(base, base + n, dtype=np.int64), out)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_waiting_request_admitted_when_the_running_one_finishes(async_scheduling):
    # 4 usable blocks: "a" holds 3 (40 prompt + 2 generated tokens), "b" needs 3, so it waits for a.
    reqs = [_req("a", 0.0, 40, 3, 0), _req("b", 0.0, 40, 1, 1000)]
    res = Replay(_sched(5, async_scheduling=async_scheduling), SimulatedExecutor(FixedLatency(0.1)), reqs,
                 integrity_check=True, fast_forward=False).run()
    r = res.requests.set_index("request_id")
    assert r.loc["a", "finish"] == pytest.approx(0.3)
    # b is admitted the instant a's last token is applied: the empty batch in between is free
    assert r.loc["b", "first_scheduled"] == pytest.approx(0.3)
    steps = res.steps
    if async_scheduling:
        empty = steps[steps["batch_size"] == 0]
        assert len(empty) >= 1 and (empty["duration"] == 0).all()
        assert empty["start"].iloc[0] == pytest.approx(0.3)
    assert np.allclose(steps.loc[steps["batch_size"] > 0, "duration"], 0.1)


def test_an_executor_cannot_charge_an_empty_step():
    class Charging(SimulatedExecutor):
        def execute(self, output):  # a latency model's intercept on an empty batch
            res = super().execute(output)
            res.duration_s = res.duration_s or 0.05
            return res

    reqs = [_req("a", 0.0, 40, 3, 0), _req("b", 0.0, 40, 1, 1000)]
    res = Replay(_sched(5, async_scheduling=True), Charging(FixedLatency(0.1)), reqs, fast_forward=False).run()
    assert res.requests.set_index("request_id").loc["b", "first_scheduled"] == pytest.approx(0.3)
    assert (res.steps.loc[res.steps["batch_size"] == 0, "duration"] == 0).all()


def test_simulated_executor_returns_zero_for_an_empty_batch():
    from sim.core.scheduler import SchedulerOutput

    ex = SimulatedExecutor(FixedLatency(0.1))
    res = ex.execute(SchedulerOutput(step=0, scheduled=[], preempted=[], finished_req_ids=set(),
                                     total_num_scheduled_tokens=0))
    assert res.duration_s == 0.0 and res.sampled_token_ids == {}
