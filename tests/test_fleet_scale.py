"""Fleets at scale (issue 38 item 1): a replica builds its engine on first use, and that changes no
result. The eager fleet (every engine built at start, ``Replica(lazy=False)``) is the oracle: on
fleets where most replicas stay idle, with routers that read KV events, gauges, pending tokens or
every engine (oracle), with faults on idle and busy replicas, async scheduling and event recording,
the lazy fleet's request and step tables, summary and KV events are equal to the eager one's. A
replica that never gets a request holds no engine, and costs little memory."""

from __future__ import annotations

import functools
import gc
import tracemalloc

import pandas as pd
import pytest

import sim.cluster.cluster as cluster_mod
from sim.cluster.replica import Replica
from sim.experiment.config import config_from_dict
from sim.experiment.run import replay_experiment


def _cfg(replicas: int, router: dict, *, n: int = 30, faults: tuple = (), engine: dict | None = None,
         record_events: bool = False, attribution: str = "off"):
    return config_from_dict({
        "name": "fleet_scale", "seed": 4, "model": "llama-3-8b", "gpu": "H100-SXM",
        "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048, **(engine or {})},
        "replay": {"record_events": record_events, "attribution": attribution},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": n, "num_prefixes": 3,
                     "prefix_tokens": 256, "suffix_tokens": 48, "output_tokens": 24, "rate": 40.0},
        "cluster": {"replicas": replicas, "router": router, "faults": list(faults)},
    })


def _run(cfg, lazy: bool, monkeypatch):
    built: list[Replica] = []

    def make(*args, **kwargs):
        r = Replica(*args, **kwargs, lazy=lazy)
        built.append(r)
        return r

    with monkeypatch.context() as m:
        m.setattr(cluster_mod, "Replica", make)
        result, _ = replay_experiment(cfg, progress=False)
    return result, built


def _assert_equal(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert a.summary == b.summary  # NaN-free summaries of these fleets compare exactly
    assert a.events == b.events
    for ra, rb in zip(a.replicas, b.replicas, strict=True):
        pd.testing.assert_frame_equal(ra.requests, rb.requests)
        pd.testing.assert_frame_equal(ra.steps, rb.steps)


ROUTERS = [
    {"kind": "round_robin"},
    {"kind": "least_loaded"},
    {"kind": "session_affinity"},
    {"kind": "dynamo"},
    {"kind": "llm_d", "prefix": "precise"},
    {"kind": "sglang"},
    {"kind": "mooncake"},
    {"kind": "oracle"},
]


@pytest.mark.parametrize("router", ROUTERS, ids=lambda r: r["kind"] + (":" + r["prefix"] if "prefix" in r else ""))
def test_lazy_fleet_equals_the_eager_fleet(router, monkeypatch):
    cfg = _cfg(24, router, n=12)  # at most 12 of 24 replicas ever get a request
    lazy, replicas = _run(cfg, True, monkeypatch)
    eager, _ = _run(cfg, False, monkeypatch)
    _assert_equal(lazy, eager)
    if router["kind"] != "oracle":  # the oracle reads every engine: every one is built
        assert sum(not r.built for r in replicas) >= 12


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": True}], ids=["sync", "async"])
def test_lazy_fleet_with_faults_and_events(engine, monkeypatch):
    """Faults on a replica that never had work (down, up again) and on busy ones; KV events recorded."""
    faults = ({"replica": 9, "down_at": 0.05, "up_at": 0.3}, {"replica": 0, "down_at": 0.2, "up_at": 0.4},
              {"replica": 1, "down_at": 0.25})
    cfg = _cfg(10, {"kind": "dynamo"}, n=40, faults=faults, engine=engine, record_events=True)
    lazy, _ = _run(cfg, True, monkeypatch)
    eager, _ = _run(cfg, False, monkeypatch)
    assert lazy.events  # the comparison covers the KV events
    _assert_equal(lazy, eager)


@pytest.mark.parametrize("attribution", ["summary", "full"])
def test_lazy_fleet_with_miss_attribution(attribution, monkeypatch):
    """The fleet's miss attribution (an observer on every incarnation's pool) on idle replicas."""
    cfg = _cfg(12, {"kind": "llm_d", "prefix": "precise"}, n=20, attribution=attribution,
               faults=({"replica": 11, "down_at": 0.05, "up_at": 0.3},))
    lazy, _ = _run(cfg, True, monkeypatch)
    eager, _ = _run(cfg, False, monkeypatch)
    _assert_equal(lazy, eager)
    if attribution == "full":
        pd.testing.assert_frame_equal(lazy.blocks, eager.blocks)


def test_one_replica_equals_the_single_engine(monkeypatch):
    """``replicas: 1``: the lazy replica's tables equal the single engine's replay."""
    cfg = _cfg(1, {"kind": "round_robin"}, n=20)
    fleet, _ = _run(cfg, True, monkeypatch)
    data = {"name": "fleet_scale", "seed": 4, "model": "llama-3-8b", "gpu": "H100-SXM",
            "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048},
            "workload": {"kind": "synthetic_shared_prefix", "num_requests": 20, "num_prefixes": 3,
                         "prefix_tokens": 256, "suffix_tokens": 48, "output_tokens": 24, "rate": 40.0}}
    single, _ = replay_experiment(config_from_dict(data), progress=False)
    pd.testing.assert_frame_equal(fleet.replicas[0].requests, single.requests)
    pd.testing.assert_frame_equal(fleet.replicas[0].steps, single.steps)


def test_a_never_used_replica_costs_under_64_kib():
    """Python memory per idle replica, a 201-replica fleet against a 1-replica fleet serving the
    same single request (the pool of a built engine alone is megabytes at this size)."""
    def peak(replicas: int) -> int:
        cfg = config_from_dict({
            "name": "idle", "seed": 0, "model": "llama-3-8b", "gpu": "H100-SXM", "engine": {"block_size": 16},
            "workload": {"kind": "synthetic_shared_prefix", "num_requests": 1, "num_prefixes": 1,
                         "prefix_tokens": 64, "suffix_tokens": 8, "output_tokens": 4, "rate": 1.0},
            "cluster": {"replicas": replicas, "router": {"kind": "dynamo"}},
        })
        gc.collect()
        tracemalloc.start()
        try:
            replay_experiment(cfg, progress=False)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak(1)  # imports and caches first
    per_replica = (peak(201) - peak(1)) / 200
    assert per_replica < 64 * 1024, f"{per_replica:.0f} bytes per idle replica"


def test_eager_replica_is_built_at_start_lazy_on_first_use(monkeypatch):
    cfg = _cfg(3, {"kind": "round_robin"}, n=1)
    _, lazy = _run(cfg, True, monkeypatch)
    _, eager = _run(cfg, False, monkeypatch)
    assert [r.built for r in lazy] == [True, False, False]
    assert all(r.built for r in eager)
    assert functools.reduce(lambda a, r: a + r.incarnations, lazy, 0) == 3


def test_memory_estimate_counts_only_the_pools_that_can_be_built():
    """A fleet larger than its stream: the pools of at most as many replicas as requests (the
    oracle router reads every engine: all), the rest idle; 5,000 idle replicas fit where their
    pools would not."""
    from sim.experiment.cluster_run import config_memory
    from sim.experiment.engine_description import resolve
    from sim.experiment.fleet_memory import (
        IDLE_REPLICA_BYTES,
        check_fleet_memory,
        estimate_fleet,
        replica_bytes,
        request_bound,
    )

    cfg = _cfg(5000, {"kind": "dynamo"}, n=60)
    engine = resolve(cfg)
    assert request_bound(cfg) == 60
    est = config_memory(cfg)
    full = estimate_fleet([engine] * 5000)
    assert est.total_bytes == full.total_bytes - 4940 * (replica_bytes(engine) - IDLE_REPLICA_BYTES)
    assert estimate_fleet([engine] * 5000, 6000) == full
    assert request_bound(_cfg(5000, {"kind": "oracle"}, n=60)) is None
    with pytest.raises(Exception, match="cluster.replicas"):
        check_fleet_memory("f.yaml", [engine] * 5000, available=est.total_bytes * 2 // 3)
    assert check_fleet_memory("f.yaml", [engine] * 5000, available=est.total_bytes * 2, max_built=60) == est


def test_ray_tasks_ask_for_their_points_memory(tmp_path, monkeypatch):
    """``apcsim sweep --ray``: each point's task asks Ray for the memory its fleet will take (a
    stand-in for Ray records the requests and runs the tasks in this process)."""
    import sys
    import types

    import yaml

    from sim.experiment.cluster_run import config_memory
    from sim.experiment.sweep import run_sweep
    from sim.experiment.sweep_config import load_sweep

    asked: dict[str, int | None] = {}

    class Ref:  # an object ref: hashed by identity, run when got
        def __init__(self, run):
            self.run = run

    class Remote:
        def __init__(self, fn, memory=None):
            self.fn, self.memory = fn, memory

        def options(self, memory=None):
            return Remote(self.fn, memory)

        def remote(self, task):
            asked[task["key"]] = self.memory
            return Ref(lambda: self.fn(task))

    fake = types.SimpleNamespace(
        is_initialized=lambda: True, shutdown=lambda: None,
        remote=lambda **kw: (lambda fn: Remote(fn)),
        wait=lambda refs, num_returns: (refs[:1], refs[1:]),
        get=lambda ref: ref.run(),
    )
    monkeypatch.setitem(sys.modules, "ray", fake)
    base = _cfg(4, {"kind": "round_robin"}, n=6)
    from sim.experiment.config import config_to_dict

    spec = {"name": "fleet_ray", "output_dir": str(tmp_path), "base": config_to_dict(base), "bounds": False,
            "grid": {"cluster.replicas": [2, 40]}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    report = run_sweep(path, ray=True, progress=False)
    assert report.ran == 2 and not report.errors
    expected = {p.key: config_memory(p.config).total_bytes for p in load_sweep(path).points}
    assert asked == expected
    small, large = sorted(expected.values())
    assert small < large  # 2 replicas' pools against 6 (6 requests) of 40


@pytest.mark.parametrize("attribution", ["off", "full"])
def test_a_config_run_releases_its_engines_once_the_clock_stops(monkeypatch, attribution):
    """A config run (``replay_cluster``) drops every replica's engine before building the tables --
    the pools would otherwise stay alive beside them, the peak memory of large fleets -- and that
    changes no result: keeping the engines (``release`` a no-op) gives the same tables, summary and
    events, with a fault taking a replica down before the end (its evictions counted once)."""
    cfg = _cfg(4, {"kind": "dynamo"}, n=60, engine={"num_gpu_blocks": 140}, record_events=True, attribution=attribution,
               faults=({"replica": 2, "down_at": 0.3},))
    released, reps = _run(cfg, True, monkeypatch)
    assert all(r.released for r in reps) and sum(r.built for r in reps) >= 2
    with pytest.raises(RuntimeError, match="released after the run"):
        _ = reps[0].scheduler  # (no fresh engine is built behind the results)
    with monkeypatch.context() as m:
        m.setattr(Replica, "release", lambda self, pipeline=None: None)
        kept, kept_reps = _run(cfg, True, monkeypatch)
    assert not any(r.released for r in kept_reps)
    _assert_equal(released, kept)
    assert released.summary["num_evictions"] == kept.summary["num_evictions"] > 0


def test_a_released_engine_is_freed_when_its_kv_events_travel_raw(monkeypatch):
    """With KV events as raw words (``kv_event_pipeline``: the Dynamo router, events not recorded,
    the compiled pool) each replica's log tags events with its scheduler's step; after the run the
    pipeline lets go of it (``KVEventPipeline.detach``), so a released engine is really freed --
    a log still holding its scheduler kept every pool alive beside the result tables (256 replicas
    at 16x: 4,393 MiB peak against 3,326 with event objects)."""
    from sim.cluster.kv_event_pipeline import KVEventPipeline, _Log

    if _Log is None:
        pytest.skip("the compiled pool is not built: events travel as objects")
    cfg = _cfg(4, {"kind": "dynamo"}, n=40, engine={"num_gpu_blocks": 140})
    engines: dict[int, type] = {}
    logs: list[bool] = []
    release, detach = Replica.release, KVEventPipeline.detach

    def spy_release(self, pipeline=None):
        if self._scheduler is not None:
            engines[id(self._scheduler)] = type(self._scheduler)
        release(self, pipeline)

    def spy_detach(self, replica):
        logs.append(isinstance(self._collected[replica], _Log))
        detach(self, replica)

    monkeypatch.setattr(Replica, "release", spy_release)
    monkeypatch.setattr(KVEventPipeline, "detach", spy_detach)
    result, reps = _run(cfg, True, monkeypatch)
    assert engines and any(logs)  # engines were built, and some replica's events travelled raw
    gc.collect()
    alive = [o for o in gc.get_objects() if id(o) in engines and type(o) is engines[id(o)]]
    assert alive == []
