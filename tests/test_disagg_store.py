"""A shared KV store in a disaggregated fleet (issue 34: ``cluster.kv_store`` with
``cluster.disaggregation``): ``writers`` picks the replicas that reach the store (``prefill``: the
prefill pool only; ``all``: the decode pool too), a prefill looks it up after its GPU cache as a
plain replica does while the read to the decode side stays the NIXL path, a store of 0 capacity is
no store, miss attribution adds up with the store as a hit source, and a config replays end to end
through ``apcsim run``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pd_same_routing import replay_pd, replay_same_routing, shared_prefix_stream

from sim.cluster.cluster import ClusterResult
from sim.cluster.kv_store import MEDIUM_STORE
from sim.experiment.cluster_store import store_replicas
from sim.experiment.config import ExperimentConfig, config_from_dict
from sim.experiment.run import replay_experiment
from sim.replay.attribution_records import check_attribution

ENGINE = {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048, "vllm_version": "0.33.0"}
STORE = {"capacity_blocks": 300, "read_gb_s": 5.0, "write_gb_s": 5.0, "latency_s": 0.0005}


def _data(store: dict[str, Any] | None, router: Any = "dynamo", **pd_keys: Any) -> dict[str, Any]:
    cluster: dict[str, Any] = {"replicas": 4, "router": router,
                               "disaggregation": {"prefill": 2, "decode": 2, "link_gb_s": 25.0, **pd_keys}}
    if store is not None:
        cluster["kv_store"] = store
    return {"name": "pd-store", "engine": ENGINE, "workload": {"kind": "chat", "sessions": 30}, "cluster": cluster}


def _run(data: dict[str, Any], **replay: Any) -> ClusterResult:
    res, _ = replay_experiment(config_from_dict({**data, "replay": replay} if replay else data), progress=False)
    assert isinstance(res, ClusterResult)
    return res


def _storage_publishers(res: ClusterResult) -> set[int]:
    return {r for r, (_, e) in zip(res.event_replicas, res.events, strict=True)
            if getattr(e, "medium", None) == MEDIUM_STORE and type(e).__name__ == "BlockStored"}


def test_writers_picks_the_replicas_that_reach_the_store() -> None:
    """``prefill``: only the prefill pool runs the store's connector -- only its replicas write, load
    and publish the store's BlockStored events; ``all``: the decode replicas write too (the prompts
    they received, which the store keeps once, and the prompts llm-d's decider has them serve
    alone), so their links carry stores and they publish STORAGE events."""
    llm_d = {"kind": "llm_d", "prefix": "approximate", "block_size": 16}
    runs = {w: _run(_data({**STORE, "writers": w}, llm_d, non_cached_tokens=200), record_events=True)
            for w in ("prefill", "all")}
    for writers, res in runs.items():
        rows = {r["replica"]: r for r in res.summary["cluster"]["replicas"]}
        decode_bytes = [rows[d].get("store_store_bytes", 0) for d in (2, 3)]
        assert res.summary["kv_store"]["writers"] == writers
        assert res.summary["cluster"]["disaggregation"]["decode"]["decode_only_requests"] > 0
        assert sum(rows[p].get("store_store_bytes", 0) for p in (0, 1)) > 0  # (a replica that ran nothing: none)
        if writers == "prefill":
            assert decode_bytes == [0, 0] and _storage_publishers(res) <= {0, 1}
            assert all("store_store_bytes" not in rows[d] for d in (2, 3))
        else:
            assert max(decode_bytes) > 0 and _storage_publishers(res) & {2, 3}
    stored = {w: r.summary["kv_store"]["blocks_stored"] for w, r in runs.items()}
    assert stored["all"] > stored["prefill"]  # the decode-only prompts reach the store only with all
    cfg = config_from_dict(_data({**STORE, "writers": "prefill"}))
    assert store_replicas(cfg) == range(2)
    plain = config_from_dict({**_data(None), "cluster": {"replicas": 4, "router": "dynamo",
                                                         "kv_store": {**STORE, "writers": "prefill"}}})
    assert store_replicas(plain) == range(4)  # without roles every replica prefills


@pytest.mark.parametrize("writers", ["prefill", "all"])
def test_a_store_of_zero_capacity_with_pd_is_pd_alone(writers: str) -> None:
    alone = _run(_data(None), attribution="summary")
    empty = _run(_data({"capacity_blocks": 0, "writers": writers}), attribution="summary")
    pd.testing.assert_frame_equal(alone.requests, empty.requests)
    pd.testing.assert_frame_equal(alone.steps, empty.steps)
    assert alone.summary == empty.summary


def test_attribution_adds_up_with_a_store_and_pd() -> None:
    """Each request's miss causes add up to its prompt less its prefill leg's GPU hit and its load
    from the store (the store is a hit source, not a miss), and the summary's causes are the table's."""
    res = _run(_data({**STORE, "capacity_blocks": 2000}), attribution="summary")
    rq = res.requests
    assert rq["remote_hit_tokens"].sum() > 0 and "miss_cpu_partial_chunk_tokens" in rq
    check_attribution(rq)
    ma = res.summary["miss_attribution"]
    for cause in ("cold", "evicted", "routed_away", "partial_block"):
        assert ma[cause] == int(rq[f"miss_{cause}_tokens"].sum())
    moved = rq[(rq["prefill_replica"] >= 0) & (rq["status"] != "rejected")]  # (prompts over max_model_len)
    assert (moved["remote_hit_tokens"] == moved["external_hit_tokens"]).all()
    assert (moved["prompt_tokens"] - moved["decode_hit_tokens"] == 1).all()  # the read is still the NIXL path


def _cfg(replicas: int, store: dict[str, Any], pd_pools: tuple[int, int] | None = None) -> ExperimentConfig:
    cluster: dict[str, Any] = {"replicas": replicas, "router": "dynamo", "kv_store": store}
    if pd_pools is not None:
        cluster["disaggregation"] = {"prefill": pd_pools[0], "decode": pd_pools[1], "link_gb_s": 25.0}
    return config_from_dict({"name": "t", "engine": {**ENGINE, "num_gpu_blocks": 60, "max_model_len": 512},
                             "workload": {"kind": "synthetic_shared_prefix", "num_requests": 10}, "cluster": cluster})


def test_instant_read_prefill_pool_is_a_plain_store_fleet_of_one_token_requests() -> None:
    """With ``writers: prefill`` and a read of no time, the prefill pool makes exactly the engine
    operations of a plain fleet of its replicas against the same store, every request sent where
    the P/D run prefilled it with one output token: same GPU hits, same loads from the store, same
    store counters -- the store sits behind the prefill's connector as behind a plain replica's."""
    reqs = shared_prefix_stream(90, groups=8)  # 8 prefixes of 20 blocks: more than a 60-block pool keeps
    store = {"capacity_blocks": 150, "read_gb_s": 2.0, "write_gb_s": 2.0, "writers": "prefill"}
    res = replay_pd(_cfg(4, store, (2, 2)), reqs)
    rq = res.requests.set_index("request_id")
    assert (rq["transfer_s"] == 0).all() and (rq["kv_wait_s"] == 0).all()
    plain = replay_same_routing(_cfg(2, store), res.requests, reqs)
    prq = plain.requests.set_index("request_id").loc[rq.index]
    assert rq["remote_hit_tokens"].sum() > 0 and plain.summary["kv_store"]["blocks_evicted"] > 0
    for col in ("hit_tokens", "remote_hit_tokens", "kv_wait_steps"):
        assert rq[col].to_dict() == prq[col].to_dict(), col
    keys = ("blocks_stored", "blocks_loaded", "blocks_evicted", "load_bytes", "store_bytes")
    assert {k: res.summary["kv_store"][k] for k in keys} == {k: plain.summary["kv_store"][k] for k in keys}


def test_apcsim_run_replays_a_pd_store_config(tmp_path: Path, capsys: Any) -> None:
    """End to end: ``apcsim run`` of a P/D + store config with full attribution, then ``apcsim
    explain`` of a request that loaded from the store, which names both of its replicas."""
    from sim.cli.main import main

    config = tmp_path / "pd_store.yaml"
    data = {**_data({**STORE, "capacity_blocks": 3000, "writers": "prefill"}), "replay": {"attribution": "full"}}
    data["engine"] = {**ENGINE, "num_gpu_blocks": 200, "max_model_len": 3200}  # (GPU evictions: store hits)
    config.write_text(json.dumps(data))  # (YAML is a superset of JSON)
    out = tmp_path / "run"
    assert main(["run", str(config), "--set", "workload.limit=60", "--out", str(out), "--no-bounds"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["kv_store"]["writers"] == "prefill" and s["kv_store"]["blocks_stored"] > 0
    assert s["cluster"]["disaggregation"]["transfers"]["count"] > 0
    rq = pd.read_parquet(out / "requests.parquet")
    assert {"remote_hit_tokens", "prefill_replica", "decode_replica", "transfer_bytes"} <= set(rq.columns)
    served = rq[rq["status"] != "rejected"]  # (prompts over max_model_len end at the prefill's intake)
    assert len(rq) == 60 and set(rq["prefill_replica"]) <= {0, 1} and set(served["decode_replica"]) <= {2, 3}
    row = served[served["remote_hit_tokens"] > 0].iloc[0]
    capsys.readouterr()
    assert main(["explain", str(out), "--request", str(row["request_id"])]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert (f"prefilled on replica {row['prefill_replica']}, decoded on {row['decode_replica']}" in head
            and f"{int(row['remote_hit_tokens'])} remote hit" in head)
