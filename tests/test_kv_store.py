"""A fleet's shared KV store (sim.cluster.kv_store, issue 34 item 2): the CPU tier's connector
mechanism against one manager for the fleet. A store of 0 capacity is no store, table for table;
one replica with a store replays what the single engine with a CPU tier of the same size and link
replays; a remote hit's load is on the clock (golden); fleet attribution adds up with the store as a
hit source; the store's events name their medium; bad input is one line naming the key."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from store_polling_fleet import STORE, replay_polling_fleet

from sim.cluster.cluster import ClusterReplay, ClusterResult
from sim.cluster.kv_store import MEDIUM_STORE
from sim.experiment.cluster_run import build_router, replica_specs
from sim.experiment.cluster_store import build_store
from sim.experiment.config import ConfigError, ExperimentConfig, config_from_dict
from sim.experiment.engine_description import resolve
from sim.experiment.run import build_latency, replay_experiment, simulated_executor
from sim.replay.attribution_records import check_attribution
from workloads.trace_format import TraceRequest

ENGINE = {"block_size": 16, "num_gpu_blocks": 600, "max_model_len": 8192, "vllm_version": "0.33.0"}
CHAT = {"kind": "chat", "sessions": 30}


def _cfg(cluster: dict[str, Any] | None, engine: dict[str, Any] | None = None, **top: Any) -> ExperimentConfig:
    data: dict[str, Any] = {"name": "t", "engine": {**ENGINE, **(engine or {})}, "workload": CHAT, **top}
    if cluster is not None:
        data["cluster"] = cluster
    return config_from_dict(data)


def _run(cfg: ExperimentConfig) -> Any:
    result, _ = replay_experiment(cfg, progress=False)
    return result


def test_a_store_of_zero_capacity_is_no_store() -> None:
    fleet = {"replicas": 3, "router": "round_robin"}
    plain = _run(_cfg(fleet, replay={"attribution": "summary"}))
    for zero in ({"capacity_blocks": 0}, {"capacity_gib": 0, "read_gb_s": 3.0}):
        empty = _run(_cfg({**fleet, "kv_store": zero}, replay={"attribution": "summary"}))
        pd.testing.assert_frame_equal(plain.requests, empty.requests)
        pd.testing.assert_frame_equal(plain.steps, empty.steps)
        assert plain.summary == empty.summary
        for a, b in zip(plain.replicas, empty.replicas, strict=True):
            pd.testing.assert_frame_equal(a.requests, b.requests)
            assert a.summary == b.summary


def test_one_replica_with_a_store_replays_the_single_engine_with_its_cpu_tier() -> None:
    """The store is the CPU tier's mechanism: one replica against a store of N blocks over a link of
    B GB/s each way replays the single engine with a CPU tier of N chunks on a B GB/s duplex link."""
    single = _run(_cfg(None, {"num_cpu_blocks": 700, "offload_bandwidth_gb_s": 3.0}))
    assert single.summary["cpu_tier"]["chunks_evicted"] > 0 and single.summary["cpu_tier"]["chunks_loaded"] > 0
    store = {"capacity_blocks": 700, "read_gb_s": 3.0, "write_gb_s": 3.0}
    one = _run(_cfg({"replicas": 1, "router": "round_robin", "kv_store": store}))
    rq = one.replicas[0].requests
    assert (rq["remote_hit_tokens"] == rq["external_hit_tokens"]).all()
    pd.testing.assert_frame_equal(single.requests, rq[list(single.requests.columns)])
    pd.testing.assert_frame_equal(single.steps, one.replicas[0].steps)
    s, cpu = one.summary, single.summary["cpu_tier"]
    assert s["prompt_tokens_by_source"] == single.summary["prompt_tokens_by_source"]
    assert s["hit_rate_by_source"]["remote"] == single.summary["hit_rate_by_source"]["cpu"]
    assert "cpu_tier" not in s and "cpu_tier" not in one.replicas[0].summary
    kv = s["kv_store"]
    assert (kv["blocks_stored"], kv["blocks_loaded"], kv["blocks_evicted"]) == (
        cpu["chunks_stored"], cpu["chunks_loaded"], cpu["chunks_evicted"])
    assert (kv["load_bytes"], kv["store_bytes"], kv["num_blocks"]) == (cpu["load_bytes"], cpu["store_bytes"], 700)


def _golden(read_gb_s: float, latency_s: float, write_gb_s: float = 50.0,
            b_arrival: float = 1.0) -> tuple[ClusterResult, int]:
    cfg = _cfg({"replicas": 2, "router": "round_robin",
                "kv_store": {"capacity_blocks": 100, "read_gb_s": read_gb_s, "write_gb_s": write_gb_s,
                             "latency_s": latency_s}},
               latency={"kind": "fixed", "step_time_s": 0.01})
    subs = [resolve(cfg)] * 2
    store = build_store(cfg, subs)
    assert store is not None
    specs, _ = replica_specs(cfg, simulated_executor, build_latency, store)
    router, info = build_router(cfg)
    prompt = np.arange(1000, 1064)  # 4 full blocks of 16
    stream = [TraceRequest("a", 0.0, prompt, 2), TraceRequest("b", b_arrival, prompt, 2)]
    res = ClusterReplay(specs, router, stream, router_info=info, integrity_check=True, kv_store=store).run()
    return res, store.spec.kv_bytes_per_block


@pytest.mark.parametrize(("read_gb_s", "latency_s"), [(2.0, 0.0), (0.5, 0.003)])
def test_a_remote_hit_waits_for_its_transfer_on_the_clock(read_gb_s: float, latency_s: float) -> None:
    """``a`` computes 4 blocks on replica 0, which stores them; ``b`` (same prompt, replica 1, 1 s
    later) hits all 64 tokens in the store: the admission's step starts the load and charges nothing,
    the next empty step lasts until the load lands (latency + 4 blocks' bytes / read GB/s), then the
    last prompt token is recomputed in one 10 ms step: TTFT = transfer + 10 ms."""
    res, per_block = _golden(read_gb_s, latency_s)
    rq = res.requests.set_index("request_id")
    assert list(rq["replica"]) == [0, 1]
    assert rq.loc["b", "remote_hit_tokens"] == 64 and rq.loc["b", "hit_tokens"] == 0
    assert rq.loc["a", "remote_hit_tokens"] == 0
    transfer = latency_s + 4 * per_block / (read_gb_s * 1e9)
    assert rq.loc["b", "ttft"] == pytest.approx(transfer + 0.01, abs=1e-9)
    assert rq.loc["b", "kv_wait_steps"] == 2
    steps = res.steps[res.steps["replica"] == 1]
    waited = steps.iloc[:2]
    assert list(waited["scheduled_tokens"]) == [0, 0]  # the admission's step and the wait: no compute
    assert waited["duration"].sum() == pytest.approx(transfer, abs=1e-9)
    kv = res.summary["kv_store"]
    assert (kv["blocks_stored"], kv["blocks_loaded"], kv["load_bytes"]) == (4, 4, 4 * per_block)


def test_a_lookup_on_another_replicas_pending_write_polls_until_it_lands() -> None:
    """``a``'s 4 blocks take 0.839 s to write (0.01 GB/s), submitted at its second step's start (10 ms:
    vLLM's worker defers a step's stores to the next step); ``b`` arrives at 0.1 s on replica 1, whose
    lookup finds them still being written (HIT_PENDING: deferred). Replica 1 has nothing of its own
    in flight, so it polls -- empty 1 ms steps -- until replica 0's output reports the write, then
    loads the 4 blocks: its TTFT is the wait, the load and one 10 ms step."""
    res, per_block = _golden(2.0, 0.0, write_gb_s=0.01, b_arrival=0.1)
    rq = res.requests.set_index("request_id")
    assert rq.loc["b", "remote_hit_tokens"] == 64 and rq.loc["b", "replica"] == 1
    written = 0.01 + 4 * per_block / (0.01 * 1e9)
    load = 4 * per_block / (2.0 * 1e9)
    polls = res.steps[(res.steps["replica"] == 1) & (res.steps["start"] < written)]
    assert (polls["scheduled_tokens"] == 0).all() and (polls["duration"].round(9) == 0.001).sum() >= len(polls) - 1
    ttft: float = rq["ttft"].to_dict()["b"]
    assert written - 0.1 + load + 0.01 <= ttft + 1e-9 <= written - 0.1 + load + 0.01 + 0.001 + 1e-9


def test_fleet_attribution_adds_up_with_the_store_as_a_hit_source() -> None:
    cfg = _cfg({"replicas": 3, "router": "round_robin", "kv_store": {"capacity_blocks": 3000}},
               replay={"attribution": "full"})
    res = _run(cfg)
    rq = res.requests
    check_attribution(rq)  # every request: causes = prompt - GPU hit - remote hit
    hits = res.summary["miss_attribution_hits"]
    assert set(hits) == {"gpu_hit", "remote_hit"} and hits["remote_hit"] == int(rq["remote_hit_tokens"].sum()) > 0
    assert hits["gpu_hit"] == int(rq["hit_tokens"].sum())
    causes = res.blocks["cause"]
    assert (causes == "remote_hit").sum() * 16 == hits["remote_hit"] and not (causes == "cpu_hit").any()
    assert res.summary["miss_attribution"]["routed_away"] >= 0


def test_the_stores_events_name_its_medium() -> None:
    res = _run(_cfg({"replicas": 2, "router": "round_robin", "kv_store": {"capacity_blocks": 3000}},
                    replay={"record_events": True}))
    media = {getattr(e, "medium", None) for _, e in res.events}
    assert MEDIUM_STORE in media and "CPU" not in media
    stored = sum(len(e.block_hashes) for _, e in res.events if getattr(e, "medium", None) == MEDIUM_STORE
                 and type(e).__name__ == "BlockStored")
    assert stored == res.summary["kv_store"]["blocks_stored"]


BAD = [
    ({"kv_store": {"capacity_blocks": 0, "policy": "lru"}}, "cluster.kv_store: capacity_blocks: a store of 0 capacity"),
    ({"kv_store": {"capacity_gib": 0, "policy": "arc"}}, "cluster.kv_store: capacity_gib: a store of 0 capacity"),
    ({"kv_store": {"capacity_blocks": 10, "read_gb_s": 0}}, "cluster.kv_store.read_gb_s: Input should be greater"),
    ({"kv_store": {"capacity_blocks": 10, "write_gb_s": -1}}, "cluster.kv_store.write_gb_s: Input should be greater"),
    ({"kv_store": {"capacity_blocks": 10}, "faults": [{"replica": 1, "down_at": 1.0}]},
     "faults[0]: a fault with cluster.kv_store would cut the replica's link"),
    ({"router": {"kind": "mooncake", "scope": "global"}}, "router.scope: global routing prices store hits"),
    ({"kv_store": {"capacity_blocks": 10, "capacity_gib": 1}}, "set capacity_gib or capacity_blocks, not both"),
]


@pytest.mark.parametrize(("cluster", "message"), BAD)
def test_bad_store_input_is_one_line_naming_the_key(cluster: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg({"replicas": 2, **cluster})
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("engine", "message"), [
    ({"vllm_version": "0.25.1"}, "engine.vllm_version 0.25.1 has none"),
    ({"num_cpu_blocks": 100}, "a replica has its own CPU tier"),
    ({"enable_prefix_caching": False}, "a store needs prefix caching"),
])
def test_a_store_refuses_engines_it_cannot_serve(engine: dict[str, Any], message: str) -> None:
    cfg = _cfg({"replicas": 2, "kv_store": {"capacity_blocks": 10}}, engine)
    with pytest.raises(ConfigError) as err:
        build_store(cfg, [resolve(cfg)] * 2)
    assert message in str(err.value) and "cluster.kv_store" in str(err.value)


def test_a_store_of_gib_holds_whole_pages_of_blocks() -> None:
    cfg = _cfg({"replicas": 2, "kv_store": {"capacity_gib": 1.0}})
    store = build_store(cfg, [resolve(cfg)] * 2)
    assert store is not None
    per = -(-store.spec.kv_bytes_per_block // 4096) * 4096
    assert store.spec.num_blocks == 2**30 // per


def test_one_replica_with_an_empty_store_equals_the_single_engine_with_attribution_on() -> None:
    """``replicas: 1``, attribution ``full``: an empty store changes nothing, and the replica replays
    the single engine (its ``routed_away`` column and ``resident_on`` all empty)."""
    from sim.replay.attribution_records import FLEET_MISS_COLUMN

    single = _run(_cfg(None, replay={"attribution": "full"}))
    for router in ("round_robin", "mooncake"):
        fleet = {"replicas": 1, "router": router}
        plain = _run(_cfg(fleet, replay={"attribution": "full"}))
        one = _run(_cfg({**fleet, "kv_store": {"capacity_blocks": 0}}, replay={"attribution": "full"}))
        pd.testing.assert_frame_equal(plain.requests, one.requests)
        pd.testing.assert_frame_equal(plain.blocks, one.blocks)
        assert plain.summary == one.summary
        r0 = one.replicas[0]
        assert (r0.requests[FLEET_MISS_COLUMN] == 0).all() and r0.blocks["resident_on"].isna().all()
        pd.testing.assert_frame_equal(single.requests, r0.requests.drop(columns=[FLEET_MISS_COLUMN]))
        pd.testing.assert_frame_equal(single.blocks, r0.blocks.drop(columns=["resident_on"]))


def test_a_store_runs_summary_and_explain_name_the_remote_source(tmp_path: Any, capsys: Any) -> None:
    import json
    from pathlib import Path

    from sim.cli.main import main

    out = tmp_path / "run"
    root = Path(__file__).resolve().parents[1]
    assert main(["run", str(root / "configs/chat_synthetic.yaml"), "--set", "workload.limit=60", "--set",
                 "engine.vllm_version=0.33.0", "--set", "cluster.replicas=2", "--set",
                 "cluster.kv_store={capacity_blocks: 3000}", "--set", "replay.attribution=full", "--out", str(out),
                 "--no-bounds"]) == 0
    text = capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    assert "KV store (external_kv_transfer)" in text and "CPU tier" not in text
    assert f"kv store    {s['kv_store']['num_blocks']:,} blocks (LRU" in text
    rq = pd.read_parquet(out / "requests.parquet")
    rid = str(rq.loc[rq["remote_hit_tokens"] > 0, "request_id"].iloc[0])
    assert main(["explain", str(out), "--request", rid, "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    loaded = rq.loc[rq["request_id"] == rid, "remote_hit_tokens"].to_list()
    assert [e["remote_hit_tokens"]] == loaded and loaded[0] > 0
    assert any(b["cause"] == "remote_hit" for b in e["blocks"])


def test_fast_forward_equals_step_by_step_with_a_store() -> None:
    """Decode windows on a replica whose waiting request polls on another replica's write (``c``
    decodes 300 tokens on replica 1 while ``b`` waits there for ``a``'s blocks): the same tables with
    the decode fast-forward on and off."""
    def run(ff: bool) -> ClusterResult:
        return replay_polling_fleet(_cfg({"replicas": 2, "router": "round_robin", "kv_store": STORE},
                                         latency={"kind": "fixed", "step_time_s": 0.01},
                                         replay={"fast_forward": ff}))

    fast, plain = run(True), run(False)
    rq = fast.requests.set_index("request_id")
    assert rq.loc["b", "replica"] == 1 and rq.loc["b", "remote_hit_tokens"] == 64
    pd.testing.assert_frame_equal(fast.requests, plain.requests)
    pd.testing.assert_frame_equal(fast.steps, plain.steps)
    assert fast.summary == plain.summary
