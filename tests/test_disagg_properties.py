"""Properties of a disaggregated replay (sim.cluster.disagg) over random streams, pool splits, pool
sizes, routers and links: an instantaneous link, when no read waits for decode blocks, leaves the
prefill pool a plain fleet of one-token requests on the same choices, and on any link every request
is served once, by one replica of each pool, in the order prefill -> read -> decode, its read taking
at least the link's time."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_disagg import BYTES_PER_BLOCK, _cfg, _Fixed, _pd

from sim.cluster.cluster import ClusterReplay
from sim.experiment.cluster_run import replica_specs
from sim.experiment.run import build_latency, simulated_executor
from workloads.trace_format import TraceRequest


@st.composite
def streams(draw: st.DrawFn) -> list[TraceRequest]:
    n = draw(st.integers(4, 30))
    groups = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    prefixes = [np.arange(g * 10_000, g * 10_000 + int(rng.integers(16, 300))) for g in range(groups)]
    t, reqs = 0.0, []
    for i in range(n):
        t += float(rng.exponential(0.02))
        tail = rng.integers(1_000_000, 2_000_000, size=int(rng.integers(1, 80)))
        reqs.append(TraceRequest(f"r{i}", t, np.concatenate([prefixes[int(rng.integers(groups))], tail]),
                                 int(rng.integers(1, 24))))
    return reqs


ROUTERS = st.sampled_from(["dynamo", "llm_d", "round_robin"])


@settings(max_examples=25, deadline=None)
@given(reqs=streams(), router=ROUTERS, prefill=st.integers(1, 3), decode=st.integers(1, 2),
       blocks=st.sampled_from([48, 80, 400]))
def test_instant_link_prefill_pool_is_a_plain_fleet_of_one_token_requests(
        reqs: list[TraceRequest], router: str, prefill: int, decode: int, blocks: int) -> None:
    reqs = [TraceRequest(r.id, r.arrival, r.tokens, 1) for r in reqs]  # (decode legs short: blocks free)
    pd = _pd(router, prefill, decode, reqs, link_gb_s=math.inf, num_gpu_blocks=blocks).requests
    # vLLM holds the prefill's blocks while the decode side waits for blocks (delay_free_blocks
    # from the prefill's finish): the prefill pool is a plain fleet's only when no read waited
    assume((pd["kv_wait_s"] == 0).all())
    table = dict(zip(pd["request_id"], pd["prefill_replica"].astype(int)))
    specs, _ = replica_specs(_cfg("round_robin", prefill, blocks), simulated_executor, build_latency)
    one = [TraceRequest(r.id, r.arrival, r.tokens, 1) for r in reqs]
    plain = ClusterReplay(specs, _Fixed(table), one, integrity_check=True).run().requests
    assert dict(zip(pd["request_id"], pd["hit_tokens"])) == dict(zip(plain["request_id"], plain["hit_tokens"]))


@settings(max_examples=25, deadline=None)
@given(reqs=streams(), router=ROUTERS, prefill=st.integers(1, 3), decode=st.integers(1, 3),
       link=st.sampled_from([0.05, 1.0, 50.0]), latency=st.sampled_from([0.0, 0.002]),
       blocks=st.sampled_from([80, 400]))
def test_every_request_goes_prefill_then_read_then_decode(
        reqs: list[TraceRequest], router: str, prefill: int, decode: int, link: float, latency: float,
        blocks: int) -> None:
    res = _pd(router, prefill, decode, reqs, link_gb_s=link, latency_s=latency, num_gpu_blocks=blocks)
    rq = res.requests
    assert sorted(rq["request_id"]) == sorted(r.id for r in reqs)  # each served once
    assert rq["prefill_replica"].between(0, prefill - 1).all()
    assert rq["decode_replica"].between(prefill, prefill + decode - 1).all()
    assert (rq["prefill_finish"] >= rq["arrival"]).all() and (rq["kv_wait_s"] >= 0).all()
    # the read takes at least its own time on an idle lane (more behind others on the link)
    own = latency + rq["transfer_bytes"] / (link * 1e9)
    assert (rq["transfer_s"] >= own - 1e-12).all()
    assert (rq["transfer_bytes"] % BYTES_PER_BLOCK == 0).all()
    assert (rq["first_token"] > rq["kv_arrival"]).all() and (rq["ttft"] >= rq["transfer_s"]).all()
    # the whole prompt is loaded (its partial last block too) and the decode recomputes its last token
    assert (rq["prompt_tokens"] - rq["decode_hit_tokens"] == 1).all()
    block = res.summary["cluster"]["disaggregation"]
    assert block["transfers"]["count"] == len(rq) and block["decode"]["output_tokens"] == int(rq["output_tokens"].sum())
