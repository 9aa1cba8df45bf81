"""cluster.disaggregation from a config: bad input is one line naming the key, a run writes the
P/D columns and summary block, and a compared router is replayed disaggregated too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.experiment.config import ConfigError, config_from_dict
from sim.experiment.run import replay_experiment
from sim.replay.attribution_records import check_attribution

ROOT = Path(__file__).resolve().parents[1]


def _data(**cluster: Any) -> dict[str, Any]:
    return {
        "name": "pd", "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 40, "rate": 40.0, "prefix_tokens": 256,
                     "suffix_tokens": 64, "output_tokens": 16},
        "cluster": {"replicas": 4, "router": "dynamo",
                    "disaggregation": {"prefill": 2, "decode": 2, "link_gb_s": 25.0}, **cluster},
    }


def _pd(**keys: Any) -> dict[str, Any]:
    return {"disaggregation": {"prefill": 2, "decode": 2, "link_gb_s": 25.0, **keys}}


@pytest.mark.parametrize("cluster, message", [
    (_pd(prefill=0), "cluster.disaggregation.prefill: Input should be greater than or equal to 1"),
    (_pd(decode=0), "cluster.disaggregation.decode: Input should be greater than or equal to 1"),
    (_pd(link_gb_s=0), "cluster.disaggregation.link_gb_s: Input should be greater than 0"),
    (_pd(link_gb_s=-1.5), "cluster.disaggregation.link_gb_s: Input should be greater than 0"),
    (_pd(latency_s=-0.1), "cluster.disaggregation.latency_s: Input should be greater than or equal to 0"),
    (_pd(decode=3), "cluster: disaggregation: prefill + decode (2 + 3) must be the fleet's 4 replicas"),
    ({"router": "sglang"}, "cluster: router: router sglang cannot route prefill and decode separately"),
    ({"router": "mooncake"}, "cluster: router: router mooncake cannot route prefill and decode separately"),
    ({"compare": ["oracle"]}, "cluster: compare[0]: router oracle cannot route prefill and decode separately"),
    (_pd(non_cached_tokens=64), "cluster: disaggregation.non_cached_tokens: llm-d's decider only"),
    ({"faults": [{"replica": 1, "down_at": 1.0}]}, "cluster: faults: a disaggregated fleet is replayed without"),
])
def test_bad_disaggregation_is_one_line_naming_the_key(cluster: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(_data(**cluster))
    text = str(err.value)
    assert message in text and "\n" not in text.strip()


def test_attribution_covers_the_prefill_pool_and_is_refused_with_decode_only_serving() -> None:
    cfg = config_from_dict({**_data(), "replay": {"attribution": "summary"}})
    res, _ = replay_experiment(cfg, progress=False)
    rq = res.requests
    assert "miss_routed_away_tokens" in rq and "miss_attribution" in res.summary
    check_attribution(rq)  # each request's causes add up to its prompt less its prefill hit
    llm_d = _data(router={"kind": "llm_d", "prefix": "approximate", "block_size": 16}, **_pd(non_cached_tokens=64))
    cfg = config_from_dict({**llm_d, "replay": {"attribution": "summary"}})
    with pytest.raises(ConfigError, match=r"replay\.attribution: miss attribution covers the prefill pool"):
        replay_experiment(cfg, progress=False)


def test_config_run_has_pd_columns_and_block() -> None:
    res, _ = replay_experiment(config_from_dict(_data(compare=["round_robin"])), progress=False)
    rq = res.requests
    assert len(rq) == 40 and {"prefill_replica", "decode_replica", "transfer_s", "kv_wait_s",
                              "transfer_bytes"} <= set(rq.columns)
    assert set(rq["prefill_replica"]) <= {0, 1} and set(rq["decode_replica"]) <= {2, 3}
    cl = res.summary["cluster"]
    assert cl["router"]["disaggregation"]["link_gb_s"] == 25.0
    assert cl["disaggregation"]["transfers"]["count"] == 40
    # Llama-3-8B (the default model): 128 KiB of KV per token, 2 MiB per 16-token block
    assert (rq["transfer_bytes"] % (2 << 20) == 0).all() and (rq["transfer_bytes"] > 0).all()
    assert (rq["transfer_bytes"] <= -(-rq["prompt_tokens"] // 16) * (2 << 20)).all()
    assert [r["router"] for r in cl["comparison"]] == ["dynamo", "round_robin"]


def test_printed_summary_has_the_pools_line() -> None:
    from sim.cli.summary import render

    res, _ = replay_experiment(config_from_dict(_data()), progress=False)
    text = render(res.summary, name="pd", folder="out", wall_time_s=1.0)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("pools ")]
    tr = res.summary["cluster"]["disaggregation"]["transfers"]
    assert line.startswith("pools       2 prefill (compute ") and " + 2 decode (compute " in line
    assert f"; {tr['count']} KV reads, " in line


def test_replicas_default_to_the_two_pools() -> None:
    data = _data()
    del data["cluster"]["replicas"]
    cfg = config_from_dict(data)
    assert cfg.cluster is not None and cfg.cluster.replicas == 4
    data["cluster"]["replicas"] = 3  # given: it must match
    with pytest.raises(ConfigError, match=r"prefill \+ decode \(2 \+ 2\) must be the fleet's 3 replicas"):
        config_from_dict(data)


def test_slow_link_on_the_mooncake_sample_lands_every_read() -> None:
    """60 Mooncake requests over 0.2 GB/s links: reads of tens of seconds hold prefill blocks, and
    the engines poll for them. A landing scheduled an ulp after the float the link computed once
    left an engine polling forever at that float (the holds now wait for the clock's own instant)."""
    cfg = config_from_dict({
        "name": "slow", "model": "llama-3-8b", "gpu": "H100-SXM", "engine": {"block_size": 16},
        "workload": {"kind": "mooncake", "path": str(ROOT / "workloads/data/mooncake_conversation_sample.jsonl"),
                     "limit": 60},
        "cluster": {"router": "dynamo", "disaggregation": {"prefill": 4, "decode": 4, "link_gb_s": 0.2}},
    })
    res, _ = replay_experiment(cfg, progress=False)
    block = res.summary["cluster"]["disaggregation"]
    assert block["transfers"]["count"] == 60 and block["transfers"]["transfer_s_mean"] > 10
    assert block["prefill"]["busy_s"] > block["prefill"]["compute_s"]  # the polls for held blocks
