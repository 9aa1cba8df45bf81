"""A fleet's fast-forward is exact: with several replicas, every router, KV-event delay, async
scheduling and a fault, the cluster replay with ``replay.fast_forward`` on equals the plain step loop
table for table.

What this pins (each broke it once): a replica's window reports every one of its rows as a step end
(the router's scraped gauges and the per-step KV-event batches come from them), and a window is over
before the fleet's next routing instant (the router reads the replica's state then, so a window may
not run past an arrival even while the replica's admissions are blocked, as the single engine's may).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.experiment.config import load_config
from sim.experiment.run import replay_experiment

ROOT = Path(__file__).resolve().parents[1]
ROUTERS = ["round_robin", "random", "least_loaded", "session_affinity", "llm_d", "dynamo", "sglang",
           "mooncake", "oracle"]


def _both(*overrides: str) -> tuple[object, object]:
    base = ["workload.limit=160", "cluster.replicas=4", *overrides]
    on, _ = replay_experiment(load_config(ROOT / "configs/mooncake_sample.yaml", [*base, "replay.fast_forward=true"]),
                              progress=False)
    off, _ = replay_experiment(load_config(ROOT / "configs/mooncake_sample.yaml",
                                           [*base, "replay.fast_forward=false"]), progress=False)
    return on, off


def _assert_equal(on, off) -> None:  # type: ignore[no-untyped-def]
    pd.testing.assert_frame_equal(on.requests, off.requests)
    pd.testing.assert_frame_equal(on.steps, off.steps)
    assert on.summary == off.summary
    for a, b in zip(on.replicas, off.replicas, strict=True):
        pd.testing.assert_frame_equal(a.steps, b.steps)


@pytest.mark.parametrize("router", ROUTERS)
def test_fast_forward_equals_the_plain_loop_on_a_fleet(router: str) -> None:
    on, off = _both(f"cluster.router={router}")
    _assert_equal(on, off)
    assert on.summary["num_steps"] > 100  # the fleet did run (and windows had room to form)


def test_fast_forward_equals_the_plain_loop_with_delay_async_and_a_fault() -> None:
    _assert_equal(*_both("cluster.router=llm_d", "cluster.kv_events.delay_s=0.05"))
    _assert_equal(*_both("cluster.router=dynamo", "engine.async_scheduling=true"))
    _assert_equal(*_both("cluster.router=sglang", "cluster.faults=[{replica: 1, down_at: 20.0, up_at: 60.0}]"))
