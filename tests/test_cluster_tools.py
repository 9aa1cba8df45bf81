"""apcsim size (bisection over replica counts), cluster.compare and the cluster figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.experiment.config import ConfigError, config_from_dict
from sim.experiment.sizing import SLO, parse_slo, size_router, with_fleet

ROOT = Path(__file__).resolve().parents[1]


def _cfg(**cluster: object):
    return config_from_dict({
        "name": "t", "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 40, "rate": 40.0, "prefix_tokens": 256,
                     "suffix_tokens": 64, "output_tokens": 32},
        "cluster": {"replicas": 2, "router": "round_robin", **cluster},
    })


def test_parse_slo_units_and_errors() -> None:
    assert parse_slo("ttft_p99=2s") == SLO("ttft_p99_s", 2.0)
    assert parse_slo("ttft_p50<=500ms") == SLO("ttft_p50_s", 0.5)
    assert parse_slo("e2e_p90=30") == SLO("e2e_p90_s", 30.0)
    with pytest.raises(ConfigError, match="expected METRIC=LIMIT"):
        parse_slo("ttft=2s")


def test_bisection_finds_the_smallest_count_with_few_replays() -> None:
    calls: list[int] = []

    def replay(cfg):  # latency falls with replicas: 12 / n seconds
        n = cfg.cluster.replicas
        calls.append(n)
        return {"ttft_p99_s": 12.0 / n, "token_hit_rate": 0.0}

    s = size_router(_cfg(), "round_robin", SLO("ttft_p99_s", 2.0), max_replicas=64, replay=replay)
    assert s.replicas == 6 and len(calls) == len(set(calls)) <= 7
    assert [p["met"] for p in s.probes if p["replicas"] == 5] == [False]
    s = size_router(_cfg(), "dynamo", SLO("ttft_p99_s", 0.1), max_replicas=8, replay=replay)
    assert s.replicas is None and max(p["replicas"] for p in s.probes) == 8


def test_with_fleet_keeps_the_rest_of_the_cluster_section() -> None:
    cfg = with_fleet(_cfg(ttft_slo_s=1.5), 7, {"kind": "llm_d", "prefix": "approximate"})
    assert cfg.cluster.replicas == 7 and cfg.cluster.router.kind == "llm_d" and cfg.cluster.ttft_slo_s == 1.5


def test_size_cli_on_a_real_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli.main import main

    p = tmp_path / "c.yaml"
    p.write_text(json.dumps({
        "name": "sz", "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 60, "rate": 200.0, "prefix_tokens": 512,
                     "suffix_tokens": 512, "output_tokens": 64},
        "cluster": {"replicas": 1, "router": "round_robin"},
    }))
    assert main(["size", str(p), "--slo", "ttft_p90=0.15s", "--routers", "round_robin,least_loaded",
                 "--max-replicas", "16", "--out", str(tmp_path / "out")]) == 0
    out = json.loads((tmp_path / "out" / "sizing.json").read_text())
    for r in out["routers"]:
        assert r["replicas"] is not None and r["replicas"] > 1
        met = {p["replicas"]: p["met"] for p in r["probes"]}
        assert met[r["replicas"]] and not met.get(r["replicas"] - 1, False)
    assert out["meta"]["versions"]["simpy"]
    assert "smallest replica count" in capsys.readouterr().out


def test_compare_replays_other_routers_on_the_same_stream() -> None:
    from sim.experiment.run import replay_experiment

    res, _ = replay_experiment(_cfg(compare=["random", {"kind": "llm_d", "prefix": "approximate"}]), progress=False)
    rows = res.summary["cluster"]["comparison"]
    assert [r["router"] for r in rows] == ["round_robin", "random", "llm_d (approximate)"]
    assert rows[0]["token_hit_rate"] == res.summary["token_hit_rate"]


def _fake_sweep(tmp_path: Path) -> Path:
    rows = []
    for router in ("round_robin", "dynamo"):
        for n in (2, 4, 8):
            for scale in (1.0, 2.0):
                rows.append({"status": "ok", "cluster.router": router, "cluster.num_replicas": n,
                             "workload.time_scale": scale, "token_hit_rate": 0.1 * n / scale,
                             "ttft_p50_s": 1.0 / n, "ttft_p99_s": 5.0 / n, "workload_kind": "mooncake",
                             "block_size": 16})
    folder = tmp_path / "sw"
    folder.mkdir()
    pd.DataFrame(rows).to_parquet(folder / "table.parquet")
    (folder / "sweep.json").write_text(json.dumps({"name": "sw", "complete": True, "axes": [
        {"key": "cluster.router"}, {"key": "cluster.replicas"}, {"key": "workload.time_scale"}]}))
    return folder


def test_cluster_figures_from_a_sweep_table(tmp_path: Path) -> None:
    from sim.analysis.cluster_figures import cluster_vs_load, cluster_vs_replicas, replica_load_timeline
    from sim.analysis.figure_style import discard
    from sim.analysis.sweep_data import SweepData

    d = SweepData(_fake_sweep(tmp_path))
    for build in (cluster_vs_replicas, cluster_vs_load):
        fig = build(d)
        assert fig is not None and len(fig.axes) == 3
        labels = {t.get_text() for t in fig.legends[0].get_texts()}
        assert labels == {"round_robin", "dynamo"}
        discard(fig)
    steps = pd.DataFrame({"replica": [0, 0, 1], "start": [0.0, 1.0, 0.5], "duration": [0.5, 0.5, 1.0],
                          "running": [1, 2, 3], "scheduled_tokens": [60, 100, 1], "kv_usage": [0.3, 0.6, 0.15]})
    fig = replica_load_timeline(steps, "t", token_budget=100, bins=4)
    budget, pool = (np.asarray(ax.images[0].get_array()) for ax in fig.axes[:2])
    # bins of 0.375 s, each step's time in its start bin: replica 0 in bins 0 and 2, replica 1 in bin 1;
    # replica 1 runs one step of 1 token for 1 s: 1 % of the budget, not "busy 1.0" (clipped to 1)
    assert budget.shape == pool.shape == (2, 4)
    assert np.allclose(budget, [[0.6 * 0.5 / 0.375, 0, 1, 0], [0, 0.01 / 0.375, 0, 0]])
    assert np.allclose(pool, [[0.3 * 0.5 / 0.375, 0, 0.6 * 0.5 / 0.375, 0], [0, 0.15 / 0.375, 0, 0]])
    assert "token budget" in fig.axes[0].get_title() and "KV" in fig.axes[1].get_title()
    discard(fig)
