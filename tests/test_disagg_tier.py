"""Per-replica CPU offload tiers in a disaggregated fleet (issue 34 gap: ``engine.num_cpu_blocks`` /
``kv_offloading_size`` with ``cluster.disaggregation``): each replica's tier behaves as a plain
replica's -- a prefill looks its own tier up after its GPU cache and offers it the blocks it
computed, a decode replica's connector offers the prompt blocks it received -- and the read to the
decode side stays the NIXL path."""

from __future__ import annotations

from typing import Any

import pandas as pd
from pd_same_routing import replay_pd, replay_same_routing, shared_prefix_stream

from sim.experiment.config import ExperimentConfig, config_from_dict
from sim.experiment.run import replay_experiment
from sim.replay.attribution_records import check_attribution

ENGINE = {"block_size": 16, "num_gpu_blocks": 200, "max_model_len": 3200, "vllm_version": "0.33.0"}


def _data(engine: dict[str, Any]) -> dict[str, Any]:
    return {"name": "pd-tier", "engine": {**ENGINE, **engine}, "workload": {"kind": "chat", "sessions": 30},
            "cluster": {"replicas": 4, "router": "dynamo",
                        "disaggregation": {"prefill": 2, "decode": 2, "link_gb_s": 25.0}}}


def _run(data: dict[str, Any], **replay: Any) -> Any:
    res, _ = replay_experiment(config_from_dict({**data, "replay": replay} if replay else data), progress=False)
    return res


def test_an_inert_cpu_tier_on_every_replica_equals_pd_without_tiers() -> None:
    """vLLM refuses a tier of size 0, so the zero case is a tier that can neither store nor hit:
    its chunks (``kv_offloading_block_size`` 8,192 tokens) are longer than any prompt here, and the
    connector stores and loads whole chunks only. What remains is the connector's bookkeeping --
    the engine steps once more after a finish (vLLM's ``has_requests`` counts finished requests not
    yet reported), an empty step of no time. So every request's row is the untiered P/D fleet's,
    the steps that compute are the same, and the empty steps last as long in all."""
    plain = _run(_data({}))
    inert = _run(_data({"num_cpu_blocks": 4, "kv_offloading_block_size": 8192}))
    cpu = inert.summary["cpu_tier"]
    assert cpu["chunks_stored"] == 0 and cpu["chunks_loaded"] == 0 and inert.summary["num_requests"] > 50
    pd.testing.assert_frame_equal(plain.requests, inert.requests[list(plain.requests.columns)])

    def compute(steps: pd.DataFrame) -> pd.DataFrame:
        return steps[steps["scheduled_tokens"] > 0].drop(columns=["step"]).reset_index(drop=True)

    pd.testing.assert_frame_equal(compute(plain.steps), compute(inert.steps))
    empty = [s.loc[s["scheduled_tokens"] == 0, "duration"].sum() for s in (plain.steps, inert.steps)]
    assert empty[0] == empty[1] and len(inert.steps) > len(plain.steps)


def test_each_replica_has_its_own_tier_in_pd() -> None:
    """A real tier on every replica: the prefills load from theirs (a moved request's
    ``external_hit_tokens`` are its prefill leg's, and its miss causes add up to its prompt less
    both hits), the decode replicas' connectors store the prompts they received into theirs, and
    the decode side still reads the whole prompt over the link and computes one token."""
    res = _run(_data({"num_cpu_blocks": 3000, "offload_bandwidth_gb_s": 5.0}), attribution="summary")
    rq = res.requests
    check_attribution(rq)
    served = rq[rq["status"] != "rejected"]
    assert served["external_hit_tokens"].sum() > 0 and (served["prefill_replica"] >= 0).all()
    assert (served["prompt_tokens"] - served["decode_hit_tokens"] == 1).all()
    rows = {r["replica"]: r for r in res.summary["cluster"]["replicas"]}
    assert sum(rows[d].get("cpu_chunks_stored", 0) for d in (2, 3)) > 0
    assert all(rows[d].get("cpu_chunks_loaded", 0) == 0 for d in (2, 3))  # (a landed read is not looked up)
    assert res.summary["cpu_tier"]["chunks_loaded"] > 0


def _cfg(replicas: int, pd_pools: tuple[int, int] | None = None) -> ExperimentConfig:
    cluster: dict[str, Any] = {"replicas": replicas, "router": "dynamo"}
    if pd_pools is not None:
        cluster["disaggregation"] = {"prefill": pd_pools[0], "decode": pd_pools[1], "link_gb_s": 25.0}
    engine = {**ENGINE, "num_gpu_blocks": 60, "max_model_len": 512, "num_cpu_blocks": 150,
              "offload_bandwidth_gb_s": 2.0}
    return config_from_dict({"name": "t", "engine": engine, "workload": {"kind": "synthetic_shared_prefix"},
                             "cluster": cluster})


def test_instant_read_prefill_pool_is_a_plain_tiered_fleet_of_one_token_requests() -> None:
    """With a read of no time the prefill pool makes exactly the engine operations of a plain fleet
    of its tiered replicas, every request sent where the P/D run prefilled it with one output token:
    same GPU hits, same CPU hits and waits for them, same tier counters."""
    reqs = shared_prefix_stream(90, groups=8)  # 8 prefixes of 20 blocks: more than a 60-block pool keeps
    res = replay_pd(_cfg(4, (2, 2)), reqs)
    rq = res.requests.set_index("request_id")
    assert (rq["transfer_s"] == 0).all() and (rq["kv_wait_s"] == 0).all()
    plain = replay_same_routing(_cfg(2), res.requests, reqs)
    prq = plain.requests.set_index("request_id").loc[rq.index]
    assert rq["external_hit_tokens"].sum() > 0
    for col in ("hit_tokens", "external_hit_tokens", "kv_wait_steps"):
        assert rq[col].to_dict() == prq[col].to_dict(), col
    rows = res.summary["cluster"]["replicas"]
    for i in (0, 1):
        mine = {k: v for k, v in rows[i].items() if k.startswith("cpu_")}
        assert mine == {k: v for k, v in plain.summary["cluster"]["replicas"][i].items() if k.startswith("cpu_")}
