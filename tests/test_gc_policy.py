"""Every replay -- one engine or a fleet -- runs its clock under the replay GC policy
(``sim.replay.gc_policy``): what existed before is frozen out of the cyclic collector's passes, the
first generation runs every ``REPLAY_GC_THRESHOLD`` net allocations, and both are restored after.

The fleet once ran with CPython's default (a pass every 700 allocations, each walking every
router index and replica table that survived): about 30 % of a 16-replica run's CPU by ``perf``."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from sim.cluster.cluster import ClusterReplay
from sim.experiment.cluster_run import build_router, replica_specs
from sim.experiment.config import config_from_dict
from sim.experiment.engine_description import resolve
from sim.experiment.run import build_latency, build_scheduler, simulated_executor
from sim.replay.engine import Replay, SimClock
from sim.replay.gc_policy import REPLAY_GC_THRESHOLD, replay_gc
from workloads.trace_format import TraceRequest

ENGINE = {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048}
WORKLOAD = {"kind": "synthetic_shared_prefix", "num_requests": 4}


def _stream() -> list[TraceRequest]:
    return [TraceRequest(f"r{i}", 0.01 * i, np.arange(i * 1000, i * 1000 + 200), 4) for i in range(6)]


def _observe(clock: SimClock) -> list[tuple[int, int]]:
    """The GC's first-generation threshold and frozen count each time ``clock`` starts running."""
    seen: list[tuple[int, int]] = []
    run = clock.run

    def observed(*args: object, **kwargs: object) -> None:
        seen.append((gc.get_threshold()[0], gc.get_freeze_count()))
        run(*args, **kwargs)  # type: ignore[arg-type]

    clock.run = observed  # type: ignore[method-assign]
    return seen


@pytest.fixture()
def default_gc():
    """CPython's defaults around the test (as a plain ``python`` process has them)."""
    before = gc.get_threshold()
    gc.set_threshold(700, *before[1:])
    yield 700
    gc.set_threshold(*before)


def test_the_policy_freezes_raises_and_restores_even_on_error(default_gc) -> None:
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), replay_gc():
        assert gc.get_threshold()[0] == REPLAY_GC_THRESHOLD
        assert gc.get_freeze_count() > 0  # everything alive before the block is out of the passes
        raise RuntimeError("a replay failing half-way")
    assert gc.get_threshold()[0] == default_gc and gc.get_freeze_count() == 0


def test_a_single_engine_replay_runs_its_clock_under_the_policy(default_gc) -> None:
    cfg = config_from_dict({"name": "g", "engine": ENGINE, "workload": WORKLOAD})
    sched = build_scheduler(resolve(cfg))
    replay = Replay(sched, simulated_executor(cfg, sched), _stream())
    seen = _observe(replay.clock)
    replay.run()
    assert len(seen) == 1 and seen[0][0] == REPLAY_GC_THRESHOLD and seen[0][1] > 0
    assert gc.get_threshold()[0] == default_gc and gc.get_freeze_count() == 0


def test_a_fleet_replay_runs_its_clock_under_the_policy(default_gc) -> None:
    cfg = config_from_dict({"name": "g", "engine": ENGINE, "workload": WORKLOAD,
                            "cluster": {"replicas": 3, "router": "dynamo"}})
    specs, _ = replica_specs(cfg, simulated_executor, build_latency)
    router, info = build_router(cfg)
    replay = ClusterReplay(specs, router, _stream(), router_info=info)
    seen = _observe(replay.clock)
    res = replay.run()
    assert len(res.requests) == 6
    assert len(seen) == 1 and seen[0][0] == REPLAY_GC_THRESHOLD and seen[0][1] > 0
    assert gc.get_threshold()[0] == default_gc and gc.get_freeze_count() == 0


def test_what_the_replay_made_and_holds_ends_in_the_oldest_generation(default_gc) -> None:
    """One pass at the end moves the replay's survivors out of the young generations, where the
    default policy would walk them twice more while the result is built."""
    with replay_gc():
        held = [{"step": i} for i in range(1000)]  # (fewer than REPLAY_GC_THRESHOLD: no pass ran)
        assert any(o is held for o in gc.get_objects(0))
    assert any(o is held for o in gc.get_objects(2))
    assert not any(o is held for g in (0, 1) for o in gc.get_objects(g))
