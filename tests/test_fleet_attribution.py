"""Fleet miss attribution (sim.cluster.fleet_attribution, sim.replay.attribution_fleet): the causes
add up on every request of a cluster run, a hand-built two-replica round-robin case has exact
``routed_away`` counts, one replica equals the single engine with attribution on, and ``apcsim
explain`` reads a cluster run and a compared router's replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fleet_of_one import replica_summary

from sim.cluster.cluster import ClusterReplay
from sim.experiment.cluster_run import build_router, replica_specs
from sim.experiment.config import config_from_dict, load_config
from sim.experiment.run import build_latency, replay_experiment, simulated_executor
from sim.replay.attribution_records import FLEET_MISS_COLUMN, check_attribution
from workloads.trace_format import TraceRequest

ROOT = Path(__file__).resolve().parents[1]


def _fleet(replicas: int, router: str = "round_robin"):
    return config_from_dict({
        "name": "t", "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 10},
        "cluster": {"replicas": replicas, "router": router},
    })


def _replay(cfg, requests, attribution: str = "full"):
    specs, _ = replica_specs(cfg, simulated_executor, build_latency)
    router, info = build_router(cfg)
    return ClusterReplay(specs, router, requests, router_info=info, integrity_check=True,
                         attribution=attribution).run()


def _tokens(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)


def test_two_replica_round_robin_golden_routed_away() -> None:
    """Round robin alternates replicas 0, 1, 0, 1, 0; each request arrives after the last finished.
    A = 4 blocks, C = 3 blocks; tails of 8 tokens never fill a block."""
    a, c = _tokens(1000, 64), _tokens(5000, 48)
    reqs = [
        TraceRequest("r0", 0.0, np.concatenate([a, _tokens(90_000, 8)]), 4),            # replica 0: A cold
        TraceRequest("r1", 1.0, np.concatenate([a, _tokens(91_000, 8)]), 4),            # replica 1: A was on 0
        TraceRequest("r2", 2.0, np.concatenate([a, _tokens(92_000, 8)]), 4),            # replica 0: A hits
        TraceRequest("r3", 3.0, np.concatenate([a[:32], c, _tokens(93_000, 8)]), 4),    # replica 1: C cold
        TraceRequest("r4", 4.0, np.concatenate([a[:32], c, _tokens(93_000, 8)]), 4),    # replica 0: C was on 1
    ]
    res = _replay(_fleet(2), reqs)
    got = res.requests.set_index("request_id")
    want = {  # replica, hit, routed_away, cold, partial_block
        "r0": (0, 0, 0, 64, 8), "r1": (1, 0, 64, 0, 8), "r2": (0, 64, 0, 0, 8),
        "r3": (1, 32, 0, 48, 8), "r4": (0, 32, 48, 0, 8),
    }
    for rid, (replica, hit, away, cold, partial) in want.items():
        row = got.loc[rid]
        assert (row["replica"], row["hit_tokens"], row[FLEET_MISS_COLUMN], row["miss_cold_tokens"],
                row["miss_partial_block_tokens"]) == (replica, hit, away, cold, partial), rid
    assert res.summary["miss_attribution"]["routed_away"] == 112
    blocks = res.blocks
    away = blocks[blocks["cause"] == "routed_away"]
    assert away.groupby("request_id")["block"].apply(list).to_dict() == {"r1": [0, 1, 2, 3], "r4": [2, 3, 4]}
    assert away.set_index("request_id")["resident_on"].groupby(level=0).unique().map(list).to_dict() == {
        "r1": [0], "r4": [1]}
    # the compiled/summary level counts what the full level classifies, block for block
    summ = _replay(_fleet(2), reqs, attribution="summary").requests
    pd.testing.assert_frame_equal(summ, res.requests)


def test_routed_away_needs_the_same_extra_keys() -> None:
    """A token-equal prefix under another salt on the other replica is not routed away: the keys differ."""
    a = _tokens(1000, 64)
    reqs = [TraceRequest("r0", 0.0, np.concatenate([a, _tokens(90_000, 8)]), 4, salt="x"),
            TraceRequest("r1", 1.0, np.concatenate([a, _tokens(91_000, 8)]), 4, salt="y"),
            TraceRequest("r2", 2.0, np.concatenate([a, _tokens(92_000, 8)]), 4, salt="y")]
    res = _replay(_fleet(2), reqs).requests.set_index("request_id")
    # replica 1 never saw salt x's tokens either (isolation is a replica's own history): cold
    assert res.loc["r1", FLEET_MISS_COLUMN] == 0 and res.loc["r1", "miss_cold_tokens"] == 64
    assert res.loc["r2", FLEET_MISS_COLUMN] == 64  # replica 0 lacks salt y's blocks, replica 1 has them


@pytest.mark.parametrize("router", ["round_robin", "sglang", "dynamo", "random"])
def test_fleet_causes_add_up_on_every_request(router: str) -> None:
    from sim.experiment.config import config_to_dict

    base = load_config(ROOT / "configs/chat_synthetic.yaml",
                       ["workload.limit=150", "engine.num_gpu_blocks=1200", "engine.max_model_len=8192"])

    data = config_to_dict(base)
    data["cluster"] = {"replicas": 3, "router": router}
    data["replay"] = {**data["replay"], "attribution": "summary"}
    res, _ = replay_experiment(config_from_dict(data, base.source, base.base_dir), progress=False)
    check_attribution(res.requests)  # raises naming the first request whose causes do not add up
    s = res.summary["miss_attribution"]
    assert sum(s.values()) == int((res.requests["prompt_tokens"] - res.requests["hit_tokens"]).sum())
    if router in ("round_robin", "random"):
        assert s["routed_away"] > 0  # conversations' turns land away from their prefix


def test_one_replica_equals_single_engine_with_attribution() -> None:
    over = ["workload.limit=120", "replay.attribution=full"]
    cfg = ROOT / "configs/mooncake_sample.yaml"
    single, _ = replay_experiment(load_config(cfg, over), progress=False)
    for router in ("round_robin", "sglang"):
        cl, _ = replay_experiment(load_config(cfg, [*over, "cluster.replicas=1", f"cluster.router={router}"]),
                                  progress=False)
        r0 = cl.replicas[0]
        assert (r0.requests[FLEET_MISS_COLUMN] == 0).all()
        pd.testing.assert_frame_equal(single.requests, r0.requests.drop(columns=[FLEET_MISS_COLUMN]))
        pd.testing.assert_frame_equal(single.blocks, r0.blocks.drop(columns=["resident_on"]))
        assert r0.blocks["resident_on"].isna().all()
        summary = dict(r0.summary)
        assert summary["miss_attribution"].pop("routed_away") == 0
        assert summary == replica_summary(single.summary)
        fleet = {k: v for k, v in cl.summary.items() if k != "cluster"}
        fleet["miss_attribution"] = {k: v for k, v in fleet["miss_attribution"].items() if k != "routed_away"}
        assert fleet == single.summary, router


def test_explain_a_cluster_run_and_a_compared_router(tmp_path: Path, capsys) -> None:
    from sim.cli.main import main

    out = tmp_path / "q"
    assert main(["run", str(ROOT / "configs/quickstart.yaml"), "--set", "workload.limit=60", "--set",
                 "cluster.replicas=3", "--set", "replay.attribution=full", "--out", str(out), "--no-bounds"]) == 0
    printed = capsys.readouterr().out
    assert "lost to routing" in printed
    rr = pd.read_parquet(out / "compared_requests.parquet")
    assert set(rr["router"]) == {"round_robin"}
    rid = str(rr.sort_values(FLEET_MISS_COLUMN).iloc[-1]["request_id"])  # round robin's most routed-away request
    assert main(["explain", str(out), "--request", rid, "--router", "round_robin", "--json"]) == 0
    import json

    e = json.loads(capsys.readouterr().out)
    assert e["router"] == "round_robin"
    assert e["miss_tokens"].get("routed_away", 0) == int(rr.set_index("request_id").loc[rid, FLEET_MISS_COLUMN])
    if e["miss_tokens"].get("routed_away"):
        away = [b for b in e["blocks"] if b["cause"] == "routed_away"]
        assert away and all("resident_on" in b for b in away)
    assert main(["explain", str(out), "--request", rid]) == 0  # the primary router (sglang)
    assert "request " + rid in capsys.readouterr().out
    assert main(["explain", str(out), "--top", "3", "--router", "round_robin"]) == 0
    assert main(["explain", str(out), "--request", rid, "--router", "llm_d"]) == 2
    assert "no replay of router 'llm_d'" in capsys.readouterr().err


def _drop_attribution(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if not k.startswith("miss_attribution")}


@pytest.mark.parametrize("faults", [False, True])
def test_attribution_changes_no_decision_of_a_fleet(faults: bool) -> None:
    """Off and on, the same tables (the miss columns aside) and summary; with a fault (its requests
    re-routed and classified again where they land) the causes still add up on every request."""
    from sim.cluster.cluster import Fault

    rng = np.random.default_rng(0)
    prefixes = [_tokens(g * 10_000, 320) for g in range(4)]  # 4 groups on 3 replicas
    stream = [TraceRequest(f"r{i}", i * 0.03, np.concatenate([prefixes[i % 4], rng.integers(10**6, 2 * 10**6, 40)]),
                           24) for i in range(60)]
    cfg = _fleet(3)
    kw = {"faults": [Fault(1, 0.4, 0.9)]} if faults else {}
    runs = {}
    for level in ("off", "summary", "full"):
        specs, _ = replica_specs(cfg, simulated_executor, build_latency)
        router, info = build_router(cfg)
        runs[level] = ClusterReplay(specs, router, stream, router_info=info, integrity_check=True,
                                    attribution=level, **kw).run()
    off = runs["off"]
    if faults:
        assert off.requests["reroutes"].sum() > 0
    for level in ("summary", "full"):
        on = runs[level]
        pd.testing.assert_frame_equal(off.requests, on.requests[list(off.requests.columns)])
        pd.testing.assert_frame_equal(off.steps, on.steps)
        assert _drop_attribution(on.summary) == off.summary
        check_attribution(on.requests)
        assert on.summary["miss_attribution"]["routed_away"] > 0  # round robin: a group moves between replicas
    pd.testing.assert_frame_equal(runs["summary"].requests, runs["full"].requests)


TIERED = ("workload.limit=150", "engine.max_model_len=8192", "engine.num_gpu_blocks=600", "engine.num_cpu_blocks=1000")


def test_a_tiered_fleet_attributes_and_one_tiered_replica_equals_the_single_engine() -> None:
    """With vLLM 0.33.0's CPU tier the CPU hit is a hit source and the tier's causes come before
    routed_away; the causes add up to prompt - GPU hit - CPU hit on every request."""
    cfg = ROOT / "configs/chat_synthetic.yaml"
    fleet = {lvl: replay_experiment(load_config(cfg, [*TIERED, "cluster.replicas=3", "cluster.router=round_robin",
                                                      f"replay.attribution={lvl}"]), progress=False)[0]
             for lvl in ("summary", "full")}
    rq = fleet["full"].requests
    check_attribution(rq)
    assert {"miss_cpu_partial_chunk_tokens", FLEET_MISS_COLUMN} <= set(rq.columns)
    assert rq["external_hit_tokens"].sum() > 0 and rq[FLEET_MISS_COLUMN].sum() > 0
    pd.testing.assert_frame_equal(fleet["summary"].requests, rq)
    hits = fleet["full"].summary["miss_attribution_hits"]
    assert hits["cpu_hit"] == int(rq["external_hit_tokens"].sum()) and hits["gpu_hit"] == int(rq["hit_tokens"].sum())
    single, _ = replay_experiment(load_config(cfg, [*TIERED, "replay.attribution=summary"]), progress=False)
    one, _ = replay_experiment(load_config(cfg, [*TIERED, "cluster.replicas=1", "replay.attribution=summary"]),
                               progress=False)
    pd.testing.assert_frame_equal(single.requests, one.replicas[0].requests.drop(columns=[FLEET_MISS_COLUMN]))


def test_miss_cause_bars_of_a_fleet_stack_to_one() -> None:
    from sim.analysis.miss_figures import HIT, fractions

    res, _ = replay_experiment(load_config(ROOT / "configs/quickstart.yaml", [
        "workload.limit=200", "cluster.replicas=3", "cluster.router=round_robin", "cluster.compare=[]",
        "replay.attribution=summary"]), progress=False)
    s = res.summary
    assert s["miss_attribution"]["routed_away"] > 0
    row = pd.DataFrame([{"prompt_tokens": s["prompt_tokens"], HIT: s[HIT],
                         **{f"miss_attribution.{k}": v for k, v in s["miss_attribution"].items()}}])
    parts = fractions(row)
    assert "routed_away" in parts and sum(float(v[0]) for v in parts.values()) == pytest.approx(1.0, abs=1e-12)


def test_a_hybrid_fleet_routes_away_by_the_other_replicas_lookup() -> None:
    """Full attention + a 32-token sliding window: the other replica's lookup (every group's rule)
    decides how far the chain was resident; r1's four blocks were all on replica 0."""
    cfg = config_from_dict({
        "name": "t", "engine": {"max_model_len": 2048, "num_gpu_blocks": 400, "kv_cache_groups": [
            {"kind": "full", "block_size": 16}, {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}]},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 10},
        "cluster": {"replicas": 2, "router": "round_robin"},
    })
    a = _tokens(1000, 64)
    reqs = [TraceRequest(f"r{i}", float(i), np.concatenate([a, _tokens(90_000 + 100 * i, 8)]), 4) for i in range(3)]
    for level in ("summary", "full"):
        res = _replay(cfg, reqs, attribution=level).requests.set_index("request_id")
        assert res.loc["r1", FLEET_MISS_COLUMN] == 64 and res.loc["r1", "replica"] == 1
        assert res.loc["r2", "hit_tokens"] == 64 and res.loc["r2", FLEET_MISS_COLUMN] == 0
