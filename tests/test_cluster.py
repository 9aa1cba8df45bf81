"""Cluster replay (sim.cluster): one replica equals the single engine, routers follow their rules,
faults lose nothing, bad cluster configs fail with one message naming the key."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fleet_of_one import assert_fleet_of_one_equals_single

from sim.cluster.cluster import ClusterReplay, Fault
from sim.cluster.kv_event_pipeline import KVEventPipeline
from sim.cluster.prefix_index import KVEventIndex, LRUPrefixIndex
from sim.cluster.token_tree import TokenTree
from sim.core.kv_events import BlockRemoved, BlockStored
from sim.experiment.cluster_run import replica_specs
from sim.experiment.config import ConfigError, config_from_dict, load_config
from sim.experiment.run import build_latency, replay_experiment, simulated_executor
from workloads.trace_format import TraceRequest

ROOT = Path(__file__).resolve().parents[1]
ALL_ROUTERS = ["round_robin", "random", "least_loaded", "session_affinity", "llm_d", "dynamo", "sglang",
               "mooncake", "oracle"]


def _cfg(path: str, *overrides: str):
    return load_config(ROOT / path, list(overrides))


def _assert_single_equal(path: str, limit: int, routers: list[str], *extra: str) -> None:
    base = (f"workload.limit={limit}", *extra)
    single, _ = replay_experiment(_cfg(path, *base), progress=False)
    for router in routers:
        cl, _ = replay_experiment(_cfg(path, *base, "cluster.replicas=1", f"cluster.router={router}"), progress=False)
        assert_fleet_of_one_equals_single(single, cl, router)


def test_one_replica_equals_single_engine_for_every_router_quickstart() -> None:
    _assert_single_equal("configs/mooncake_sample.yaml", 120, ALL_ROUTERS)


def test_one_replica_equals_single_engine_chat_async_and_chunked() -> None:
    _assert_single_equal("configs/chat_synthetic.yaml", 150, ["round_robin", "llm_d", "dynamo"],
                         "engine.async_scheduling=true")
    _assert_single_equal("configs/agent_synthetic.yaml", 40, ["sglang", "mooncake"],
                         "engine.num_gpu_blocks=9000", "engine.long_prefill_token_threshold=512")


def _tr(i: int, t: float, tokens: np.ndarray, out: int = 4, session: str | None = None) -> TraceRequest:
    return TraceRequest(f"r{i}", t, tokens, out, session=session)


def _small_cfg(router: str | dict, replicas: int = 4, **cluster: object):
    return config_from_dict({
        "name": "t", "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 10},
        "cluster": {"replicas": replicas, "router": router, **cluster},
    })


def _replay(cfg, requests, **kw) -> object:
    from sim.experiment.cluster_run import build_router

    specs, _ = replica_specs(cfg, simulated_executor, build_latency)
    router, info = build_router(cfg)
    return ClusterReplay(specs, router, requests, router_info=info, integrity_check=True, **kw).run()


def _shared_prefix_stream(n: int, groups: int = 3, gap: float = 0.05) -> list[TraceRequest]:
    rng = np.random.default_rng(0)
    prefixes = [np.arange(g * 10_000, g * 10_000 + 320) for g in range(groups)]
    out = []
    for i in range(n):
        tail = rng.integers(1_000_000, 2_000_000, size=40)
        out.append(_tr(i, i * gap, np.concatenate([prefixes[i % groups], tail])))
    return out


def test_round_robin_cycles_over_replicas() -> None:
    res = _replay(_small_cfg("round_robin"), _shared_prefix_stream(8))
    assert res.requests["replica"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]


def test_prefix_routers_keep_a_group_on_one_replica_and_beat_round_robin() -> None:
    stream = _shared_prefix_stream(30)
    rr = _replay(_small_cfg("round_robin"), stream)
    for router in ("dynamo", "mooncake", "oracle", {"kind": "llm_d", "prefix": "approximate"}, "sglang"):
        res = _replay(_small_cfg(router), stream)
        assert res.summary["token_hit_rate"] > rr.summary["token_hit_rate"], router
        by_group = res.requests.assign(g=[int(r[1:]) % 3 for r in res.requests["request_id"]])
        # after the first request of a group, its requests stay on one replica
        late = by_group[by_group["request_id"].map(lambda r: int(r[1:]) >= 6)]
        assert late.groupby("g")["replica"].nunique().max() == 1, router


def test_precise_router_belief_matches_engine_without_delay() -> None:
    res = _replay(_small_cfg("dynamo"), _shared_prefix_stream(30))
    belief = res.summary["cluster"]["belief"]
    assert belief["false_positive_tokens"] == 0
    assert belief["actual_hit_tokens"] > 0


def test_kv_event_delay_makes_the_view_stale() -> None:
    stream = _shared_prefix_stream(30, gap=0.02)
    fresh = _replay(_small_cfg("dynamo"), stream)
    stale = _replay(_small_cfg("dynamo"), stream, kv_delay=lambda: 5.0)  # events arrive after the run
    assert stale.summary["cluster"]["belief"]["believed_hit_tokens"] == 0
    assert stale.summary["token_hit_rate"] <= fresh.summary["token_hit_rate"]
    assert fresh.summary["cluster"]["kv_events"]["events"] > 0


def test_fault_reroutes_every_request_and_loses_none() -> None:
    stream = [_tr(i, i * 0.01, np.arange(i * 1000, i * 1000 + 200), out=200) for i in range(40)]
    res = _replay(_small_cfg("round_robin", replicas=3), stream, faults=[Fault(1, 0.2, 0.5)])
    rq = res.requests
    assert len(rq) == 40 and rq["request_id"].is_unique and rq["finish"].notna().all()
    faults = res.summary["cluster"]["faults"]
    assert faults[0]["rerouted"] > 0 and rq["reroutes"].sum() == faults[0]["rerouted"]
    rerouted = rq[rq["reroutes"] > 0]
    assert (rerouted["replica"] != 1).any()
    # TTFT counts from the user's arrival
    assert (rerouted["ttft"] == rerouted["first_token"] - rerouted["arrival"]).all()
    assert (rerouted["replica_arrival"] >= 0.2 - 1e-9).all()
    # nothing is routed to replica 1 while it is down
    down = rq[(rq["replica_arrival"] >= 0.2) & (rq["replica_arrival"] < 0.5)]
    assert (down["replica"] != 1).all()


def test_idle_replicas_cost_no_events() -> None:
    stream = [_tr(i, i * 5.0, np.arange(i * 1000, i * 1000 + 100)) for i in range(3)]
    counts = []
    for n in (2, 32):
        cfg = _small_cfg("least_loaded", replicas=n)
        specs, _ = replica_specs(cfg, simulated_executor, build_latency)
        from sim.experiment.cluster_run import build_router

        router, _ = build_router(cfg)
        replay = ClusterReplay(specs, router, stream)
        replay.run()
        counts.append(next(replay.clock.env._eid))  # events scheduled so far
    # 30 more replicas add their start-up events only (a few each), not per-step or per-second work
    assert counts[1] - counts[0] <= 30 * 4


def test_kv_event_index_matches_contiguously_and_removes() -> None:
    idx = KVEventIndex(3)
    idx.store(0, [1, 2, 3])
    idx.store(1, [1, 2])
    idx.store(2, [2, 3])  # no block 0: holds no prefix
    assert idx.match([1, 2, 3, 4], [0, 1, 2]) == {0: 3, 1: 2}
    idx.remove(0, [2])
    assert idx.match([1, 2, 3], [0, 1, 2]) == {0: 1, 1: 2}
    idx.clear(1)
    assert idx.match([1, 2, 3], [0, 1, 2]) == {0: 1}


def test_lru_index_evicts_oldest() -> None:
    lru = LRUPrefixIndex(2, capacity=3)
    lru.add(0, [1, 2, 3])
    lru.add(0, [1, 4])  # touches 1, adds 4, evicts 2
    assert lru.match([1, 2], [0, 1]) == {0: 1}
    assert lru.match([1, 4], [0, 1]) == {0: 2}


def test_token_tree_match_insert_split_and_evict() -> None:
    t = TokenTree()
    t.insert(np.array([1, 2, 3, 4]), now=1.0)
    t.insert(np.array([1, 2, 9]), now=2.0)  # splits [1,2,3,4] at 2
    assert t.match(np.array([1, 2, 3, 7])) == 3
    assert t.match(np.array([1, 2, 9, 9])) == 3
    assert t.size == 5
    assert t.evict_to(3) == 2  # the older leaf [3, 4] goes first
    assert t.match(np.array([1, 2, 3])) == 2 and t.match(np.array([1, 2, 9])) == 3


def test_pipeline_delivers_per_step_batches_in_order_after_delay() -> None:
    got: list[tuple[int, list]] = []
    p = KVEventPipeline(2, lambda: 0.5, lambda r, b: got.append((r, b)))

    class S:
        step_index = 0

    s = S()
    sink = p.sink(0, s)
    a, b = BlockStored([1], None, [], 16, None), BlockRemoved([1])
    sink(a)
    s.step_index = 1
    sink(b)
    p.publish(0, 0, end=1.0)
    p.deliver_until(1.4)
    assert got == []
    p.deliver_until(1.5)
    assert got == [(0, [a])]
    p.publish(0, 1, end=1.1)  # due 1.6
    p.drop(0)  # the replica went down: the batch in flight is lost
    p.deliver_until(10.0)
    assert got == [(0, [a])]


def test_window_rows_in_bulk_equal_step_ends_row_by_row() -> None:
    """A fast-forward window's rows reach the cluster as columns (``step_ends``): the scraped
    gauges and the KV-event batches, random delays included, are those of ``step_end`` per row."""
    import random

    cfg = _small_cfg({"kind": "llm_d", "prefix": "precise"}, replicas=1)
    specs, _ = replica_specs(cfg, simulated_executor, build_latency)
    from sim.experiment.cluster_run import build_router

    class S:
        step_index = 0

    rows = [(3 + i, 0.013 * i, 0.011 + 0.001 * (i % 3), 1, 1, 0, 1, 0, 0, 0, 2, i % 4, 50 - i, i, 0.1 * i)
            for i in range(9)]
    got = []
    for bulk in (False, True):
        router, _ = build_router(cfg)
        rng = random.Random(7)
        replay = ClusterReplay(specs, router, [], kv_delay=lambda: rng.uniform(0.0, 0.05))
        assert replay.pipeline is not None and router.needs_metrics
        s = S()
        sink = replay.pipeline.sink(0, s)
        for step in (3, 3, 5, 6, 6, 6, 9):  # events of steps 3..9 of the window, none of 4, 7, 8 or 11
            s.step_index = step
            sink(BlockRemoved([step]))
        if bulk:
            replay.step_ends(0, tuple(map(list, zip(*rows))))
        else:
            for row in rows:
                replay.step_end(0, row)
        got.append((list(replay._metrics[0]), sorted(replay.pipeline._in_flight), replay.pipeline._last_due))
    assert got[0] == got[1]
    assert len(got[1][1]) == 4 and len(got[1][0]) == 10  # batches of steps 3, 5, 6 and 9; 9 rows + the initial


def test_metrics_are_what_the_last_scrape_saw() -> None:
    cfg = _small_cfg({"kind": "llm_d", "prefix": "none"}, replicas=1)
    specs, _ = replica_specs(cfg, simulated_executor, build_latency)
    from sim.experiment.cluster_run import build_router

    router, _ = build_router(cfg)
    replay = ClusterReplay(specs, router, [], metrics_interval_s=0.05)
    # rows in STEP_COLUMNS order: step, start, duration, ..., running, waiting, free, cached, kv_usage
    replay.step_end(0, (0, 0.0, 0.02, 1, 1, 0, 1, 0, 0, 0, 1, 3, 10, 0, 0.5))
    replay.step_end(0, (1, 0.02, 0.05, 1, 1, 0, 1, 0, 0, 0, 1, 5, 10, 0, 0.6))
    replay.clock.env.run(until=0.06)
    assert replay.metrics(0).num_waiting == 3  # scraped at 0.05
    replay.clock.env.run(until=0.11)
    assert replay.metrics(0).num_waiting == 5


def test_session_affinity_sticks_within_ttl() -> None:
    stream = [_tr(i, i * 1.0, np.arange(i * 100, i * 100 + 50), session=f"s{i % 2}") for i in range(6)]
    res = _replay(_small_cfg({"kind": "session_affinity", "ttl_s": 10}, replicas=4), stream)
    rq = res.requests
    assert rq.groupby("session")["replica"].nunique().max() == 1


@pytest.mark.parametrize("cluster, key", [
    ({"replicas": 0}, "cluster.replicas"),
    ({"router": "nope"}, "cluster.router"),
    ({"router": {"kind": "llm_d", "weights": {"queue": -1}}}, "cluster.router.weights.queue"),
    ({"replicas": 2, "faults": [{"replica": 5, "down_at": 1}]}, "faults[0].replica"),
    ({"replicas": 2, "faults": [{"replica": 1, "down_at": 1, "up_at": 5}, {"replica": 1, "down_at": 3}]},
     "faults[1] overlaps faults[0]"),
    ({"replicas": 1, "faults": [{"replica": 0, "down_at": 1, "up_at": 2}]}, "every replica is down"),
])
def test_bad_cluster_config_names_the_key(cluster: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "t", "workload": {"kind": "synthetic_shared_prefix"}, "cluster": cluster}, "c.yaml")
    msg = str(err.value)
    assert msg.startswith("c.yaml: ") and key in msg and len(msg.splitlines()) == 1, msg


def test_mixed_fleet_resolves_one_engine_per_group() -> None:
    cfg = config_from_dict({
        "name": "t", "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048},
        "latency": {"kind": "fixed", "step_time_s": 0.01},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 10},
        "cluster": {"replicas": [{"count": 2}, {"count": 1, "engine": {"kv_cache_gib": 1.0}}]},
    })
    _, engines = replica_specs(cfg, simulated_executor, build_latency)
    assert [e.num_gpu_blocks for e in engines[:2]] == [400, 400] and engines[2].num_gpu_blocks != 400
    with pytest.raises(ConfigError, match=r"cluster.replicas\[0\]: engine.blok_size: unknown key"):
        replica_specs(config_from_dict({
            "name": "t", "workload": {"kind": "synthetic_shared_prefix"},
            "cluster": {"replicas": [{"engine": {"blok_size": 3}}]}}, "c.yaml"), simulated_executor, build_latency)


def test_cluster_run_writes_fleet_tables(tmp_path: Path) -> None:
    from sim.experiment.run import run_experiment

    cfg = _cfg("configs/mooncake_sample.yaml", "workload.limit=60", "cluster.replicas=3", "cluster.router=dynamo")
    result, folder = run_experiment(cfg, out=tmp_path / "c", progress=False)
    rq = pd.read_parquet(folder / "requests.parquet")
    assert {"replica", "reroutes", "believed_hit_tokens"} <= set(rq.columns) and len(rq) == 60
    assert set(pd.read_parquet(folder / "steps.parquet")["replica"]) <= {0, 1, 2}
    reps = pd.read_csv(folder / "replicas.csv")
    assert len(reps) == 3 and reps["num_requests"].sum() == 60
    c = result.summary["cluster"]
    assert c["load_imbalance_busy"] >= 1.0 and not math.isnan(c["goodput_fraction"])


def test_fleet_bound_is_the_single_engine_infinite_cache_and_the_summary_names_the_routing(tmp_path: Path,
                                                                                        capsys) -> None:
    from sim.cli.main import main
    from sim.experiment.run import run_experiment

    base = ("workload.limit=60",)
    single, _ = run_experiment(_cfg("configs/mooncake_sample.yaml", *base), out=tmp_path / "s", progress=False,
                               bounds=True)
    fleet, _ = run_experiment(_cfg("configs/mooncake_sample.yaml", *base, "cluster.replicas=3",
                                   "cluster.router=sglang"), out=tmp_path / "f", progress=False, bounds=True)
    inf = single.summary["infinite_cache_hit_rate"]
    assert fleet.summary["infinite_cache_hit_rate"] == inf  # the stream's bound, whatever the routing
    assert fleet.summary["first_admission_token_hit_rate"] <= inf + 1e-12
    assert "belady_hit_rate" not in fleet.summary  # pool references model one engine
    # a sweep point of a fleet gets the same reference as the run, never one engine's pool bounds
    from sim.experiment.config import config_to_dict
    from sim.experiment.sweep_point import compute_point

    cl_cfg = _cfg("configs/mooncake_sample.yaml", *base, "cluster.replicas=3", "cluster.router=sglang")
    row, _ = compute_point({"key": "k", "config": config_to_dict(cl_cfg), "base_dir": cl_cfg.base_dir,
                            "source": cl_cfg.source, "bounds": True})
    assert row["status"] == "ok" and row["infinite_cache_hit_rate"] == inf
    assert "belady_hit_rate" not in row and "lru_sequential_hit_rate" not in row
    assert main(["run", str(ROOT / "configs/quickstart.yaml"), "--set", "workload.limit=80", "--out",
                 str(tmp_path / "q"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "infinite cache, one for the fleet" in out
    assert "diagnosis   routing -- on 8 replicas the sglang router" in out
    assert "round_robin" in out.split("diagnosis", 1)[1]



@pytest.mark.parametrize("widths", [[16] * 40, [32] * 7, [8], [12] * 5, [16, 8, 24], []])
def test_a_prompts_event_hashes_are_read_in_one_pass_as_one_by_one(widths: list[int]) -> None:
    from sim.cluster.router import external_block_hashes
    from sim.core.hashing import external_block_hash

    rng = np.random.default_rng(len(widths))
    hashes = [rng.bytes(w) for w in widths]
    got = external_block_hashes(hashes)
    assert got == [external_block_hash(h) for h in hashes] and all(type(x) is int for x in got)
