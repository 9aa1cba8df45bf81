"""Prefill/decode disaggregation (sim.cluster.disagg): the prefill pool equals a plain fleet of
one-token requests on the same prefill choices when the transfer takes no time, a transfer's time on
the clock is the link's, the request table names both legs, and the routers' P/D rules hold."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.cluster.cluster import ClusterReplay, ClusterResult
from sim.cluster.disagg import DisaggSpec, PDClusterReplay
from sim.cluster.disagg_router import PD_ORDER, PDRouter
from sim.cluster.router import Decision, Router, RouterRequest
from sim.experiment.cluster_run import build_router, replica_specs
from sim.experiment.config import ExperimentConfig, config_from_dict
from sim.experiment.disagg_config import PD_ROUTERS
from sim.experiment.run import build_latency, simulated_executor
from workloads.trace_format import TraceRequest

BYTES_PER_BLOCK = 131_072  # any size: the link's arithmetic is what these tests check


def _cfg(router: str | dict, replicas: int, num_gpu_blocks: int = 400) -> ExperimentConfig:
    return config_from_dict({
        "name": "t", "engine": {"block_size": 16, "num_gpu_blocks": num_gpu_blocks, "max_model_len": 512},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 10},
        "cluster": {"replicas": replicas, "router": router},
    })


def _stream(n: int, groups: int = 3, gap: float = 0.02, out: int = 12) -> list[TraceRequest]:
    rng = np.random.default_rng(1)
    prefixes = [np.arange(g * 10_000, g * 10_000 + 320) for g in range(groups)]
    reqs = []
    for i in range(n):
        tail = rng.integers(1_000_000, 2_000_000, size=int(rng.integers(8, 60)))
        reqs.append(TraceRequest(f"r{i}", i * gap, np.concatenate([prefixes[i % groups], tail]), out))
    return reqs


def _pd(router: str | dict, prefill: int, decode: int, requests: list[TraceRequest], *, link_gb_s: float,
        latency_s: float = 0.0, num_gpu_blocks: int = 400, non_cached_tokens: int = 0,
        attribution: str = "off") -> ClusterResult:
    cfg = _cfg(router, prefill + decode, num_gpu_blocks)
    specs, _ = replica_specs(cfg, simulated_executor, build_latency)
    p, info = build_router(cfg)
    d, _ = build_router(cfg)
    pd = PDRouter(p.name, p, d, range(prefill), range(prefill, prefill + decode), non_cached_tokens)
    spec = DisaggSpec(prefill, decode, link_gb_s, latency_s, (BYTES_PER_BLOCK,) * (prefill + decode))
    return PDClusterReplay(specs, pd, requests, disagg=spec, router_info=info, integrity_check=True,
                           attribution=attribution).run()


class _Fixed(Router):
    """Routes each request to the replica a table names (a replay of another run's choices)."""

    name = "fixed"

    def __init__(self, table: dict[str, int]) -> None:
        super().__init__(0)
        self.table = table

    def route(self, request: RouterRequest) -> Decision:
        return Decision(self.table[request.request_id])


@pytest.mark.parametrize("router", ["dynamo", "llm_d", "round_robin"])
def test_infinite_bandwidth_hits_equal_plain_fleet_on_same_routing(router: str) -> None:
    """'Same routing': a plain fleet of the prefill pool's replicas (same ids, same engines), every
    request sent to the replica the P/D run prefilled it on, with one output token (the prefill
    leg's max_tokens = 1). With a transfer of no time and decode blocks free at once the prefill pool
    makes exactly that fleet's engine operations, so every request's hit tokens are equal -- on a
    pool small enough to evict. (vLLM's prefill holds its blocks from its finish while the decode
    side waits for blocks -- ``request_finished``'s delay_free_blocks -- so a read that waits makes
    the prefill pool differ: the decode legs here are short enough that none waits.)"""
    reqs = _stream(90, out=2)
    pd = _pd(router, 2, 2, reqs, link_gb_s=math.inf, num_gpu_blocks=60)
    rq = pd.requests.set_index("request_id")
    assert (rq["transfer_s"] == 0).all() and (rq["prefill_replica"] < 2).all() and (rq["kv_wait_s"] == 0).all()
    plain_cfg = _cfg("round_robin", 2, num_gpu_blocks=60)
    specs, _ = replica_specs(plain_cfg, simulated_executor, build_latency)
    one_token = [TraceRequest(r.id, r.arrival, r.tokens, 1) for r in reqs]
    table = {rid: int(p) for rid, p in rq["prefill_replica"].items()}
    plain = ClusterReplay(specs, _Fixed(table), one_token, integrity_check=True).run()
    hits = plain.requests.set_index("request_id")["hit_tokens"]
    assert rq["hit_tokens"].sum() > 0 and plain.summary["num_evictions"] > 0
    assert rq["hit_tokens"].to_dict() == hits.to_dict()


@pytest.mark.parametrize("router", ["dynamo", "round_robin"])
def test_miss_attribution_is_the_prefill_pools_and_equals_the_plain_fleets(router: str) -> None:
    """Miss attribution observes the prefill pool, where the prefix hit happens: each request's
    causes are its prefill leg's (adding up to its prompt less its prefill hit, checked by the
    replay), and with an instantaneous link and no wait for decode blocks they equal those of the
    plain fleet of one-token requests on the same choices (routed_away looks at the prefill pool)."""
    reqs = _stream(90, out=2)
    pd = _pd(router, 2, 2, reqs, link_gb_s=math.inf, num_gpu_blocks=60, attribution="summary")
    rq = pd.requests.set_index("request_id")
    assert (rq["kv_wait_s"] == 0).all()
    specs, _ = replica_specs(_cfg("round_robin", 2, num_gpu_blocks=60), simulated_executor, build_latency)
    table = {rid: int(p) for rid, p in rq["prefill_replica"].items()}
    one_token = [TraceRequest(r.id, r.arrival, r.tokens, 1) for r in reqs]
    plain = ClusterReplay(specs, _Fixed(table), one_token, integrity_check=True, attribution="summary").run()
    prq = plain.requests.set_index("request_id")
    miss = [c for c in prq.columns if c.startswith("miss_")]
    assert miss and rq[miss].sum().sum() > 0
    assert rq[miss].to_dict() == prq.loc[rq.index, miss].to_dict()
    assert pd.summary["miss_attribution"] == plain.summary["miss_attribution"]
    slow = _pd(router, 2, 2, reqs, link_gb_s=0.5, num_gpu_blocks=60, attribution="full")
    assert (slow.requests["transfer_s"] > 0).all() and slow.summary["miss_attribution"]  # (checked by the replay)


def test_finite_link_holds_prefill_blocks_and_differs_from_plain() -> None:
    """The same run over a slow link: each transfer takes time, the prefill keeps its blocks until
    the read lands (delay_free_blocks), and TTFT grows by at least the transfer."""
    reqs = _stream(60)
    fast = _pd("dynamo", 2, 2, reqs, link_gb_s=math.inf).requests.set_index("request_id")
    slow = _pd("dynamo", 2, 2, reqs, link_gb_s=0.5).requests.set_index("request_id")
    assert (slow["transfer_s"] > 0).all()
    assert (slow["ttft"] >= slow["transfer_s"] + (slow["prefill_finish"] - slow["arrival"]) - 1e-12).all()
    assert slow["ttft"].mean() > fast["ttft"].mean()


def test_transfer_time_on_the_clock_golden() -> None:
    """Two prompts prefilled in one step on the one prefill replica go to the one decode replica:
    the first read takes latency + bytes / bandwidth from the prefill's finish, the second queues
    behind it on the link (FIFO) and lands one transfer later; each request is admitted by the
    decode replica at its landing (its decode leg's arrival)."""
    a = TraceRequest("a", 0.0, np.arange(100), 5)  # 7 blocks of 16
    b = TraceRequest("b", 0.0, np.arange(1000, 1040), 5)  # 3 blocks
    res = _pd("round_robin", 1, 1, [a, b], link_gb_s=1.0, latency_s=0.001)
    rq = res.requests.set_index("request_id")
    finish = rq.loc["a", "prefill_finish"]
    assert rq.loc["b", "prefill_finish"] == finish
    # the link's rule, in its own float order: start + latency + bytes / (GB/s * 1e9)
    end_a = finish + 0.001 + 7 * BYTES_PER_BLOCK / 1e9
    end_b = end_a + 0.001 + 3 * BYTES_PER_BLOCK / 1e9
    assert rq.loc["a", "transfer_bytes"] == 7 * BYTES_PER_BLOCK and rq.loc["b", "transfer_bytes"] == 3 * BYTES_PER_BLOCK
    assert rq.loc["a", "kv_arrival"] == end_a and rq.loc["b", "kv_arrival"] == end_b
    assert rq.loc["a", "transfer_s"] == end_a - finish and rq.loc["b", "transfer_s"] == end_b - finish
    assert end_a - finish == pytest.approx(0.001 + 7 * 131_072 / 1e9, rel=1e-9)  # 1.917504 ms
    assert (rq["first_token"] > rq["kv_arrival"]).all()
    assert (rq["ttft"] == rq["first_token"] - rq["arrival"]).all()


def test_decode_loads_the_partial_last_block_and_recomputes_one_token_golden() -> None:
    """vLLM 0.33.0's decode side (NixlPullConnectorScheduler.get_num_new_matched_tokens): the remote
    tokens are the prompt less the local hit (``len(prompt) - num_computed_tokens``), their blocks
    -- the partial last one included -- are allocated and read; at landing the full blocks are
    cached and ``_update_waiting_for_remote_kv`` sets ``num_computed_tokens`` to the prompt, less the
    one token a full prompt hit recomputes. ``a`` (100 tokens: 6 full blocks + 4 tokens) reads 7
    blocks; ``c`` (64 tokens of ``a``'s prefix, then 40 new: 104 tokens) arrives once ``a`` is
    cached on the decode replica: its 4 local blocks are not read, its 3 others are."""
    a = TraceRequest("a", 0.0, np.arange(100), 3)
    c = TraceRequest("c", 1.0, np.concatenate([np.arange(64), np.arange(9000, 9040)]), 3)
    res = _pd("round_robin", 1, 1, [a, c], link_gb_s=1.0)
    rq = res.requests.set_index("request_id")
    assert rq.loc["a", "transfer_bytes"] == 7 * BYTES_PER_BLOCK and rq.loc["c", "transfer_bytes"] == 3 * BYTES_PER_BLOCK
    assert rq.loc["a", "decode_hit_tokens"] == 99 and rq.loc["c", "decode_hit_tokens"] == 103
    assert rq.loc["c", "hit_tokens"] == 64  # the prefill leg's own hit (a's freed blocks stay cached there)
    steps = res.steps[res.steps["replica"] == 1]
    # the decode replica computes one token per step: the admission's last prompt token, then the
    # outputs (3 output tokens each: the admission samples the first)
    assert (steps["scheduled_tokens"] <= 1).all() and int(steps["scheduled_tokens"].sum()) == 2 * 3


def test_request_columns_name_both_legs() -> None:
    res = _pd("dynamo", 2, 3, _stream(40), link_gb_s=25.0)
    rq = res.requests
    assert len(rq) == 40 and list(rq["request_id"]) == [f"r{i}" for i in range(40)]
    assert set(rq["prefill_replica"]) <= {0, 1} and set(rq["decode_replica"]) <= {2, 3, 4}
    assert (rq["replica"] == rq["decode_replica"]).all()
    assert (rq["output_tokens"] == 12).all()  # the decode leg's, not the prefill leg's one token
    # the whole prompt is loaded, its partial last block too: the decode recomputes its last token
    assert (rq["prompt_tokens"] - rq["decode_hit_tokens"] == 1).all()
    block = res.summary["cluster"]["disaggregation"]
    assert block["prefill"]["requests"] == block["decode"]["requests"] == 40
    assert block["transfers"]["bytes"] == int(rq["transfer_bytes"].sum())
    assert block["prefill"]["computed_tokens"] == int((rq["prompt_tokens"] - rq["hit_tokens"]).sum())
    roles = [r["role"] for r in res.summary["cluster"]["replicas"]]
    assert roles == ["prefill"] * 2 + ["decode"] * 3
    steps = res.steps
    for role, ids in (("prefill", [0, 1]), ("decode", [2, 3, 4])):
        mine = steps[steps["replica"].isin(ids)]
        assert block[role]["busy_s"] == pytest.approx(float(mine["duration"].sum()))
        worked = mine.loc[mine["scheduled_tokens"] > 0, "duration"]
        assert block[role]["compute_s"] == pytest.approx(float(worked.sum()))


def test_decode_waits_for_blocks_first_come_first_served() -> None:
    """A decode pool too small for two prompts at once reads the second only after the first
    request finished and freed its blocks (the waiting queue's head blocks admission)."""
    a = TraceRequest("a", 0.0, np.arange(480), 30)  # 30 blocks each; the pool has 59
    b = TraceRequest("b", 0.0, np.arange(5000, 5480), 30)
    res = _pd("round_robin", 1, 1, [a, b], link_gb_s=10.0, num_gpu_blocks=60)
    rq = res.requests.set_index("request_id")
    assert rq.loc["a", "kv_wait_s"] == 0.0
    assert rq.loc["b", "kv_wait_s"] > 0
    assert rq.loc["b", "prefill_finish"] + rq.loc["b", "kv_wait_s"] >= rq.loc["a", "finish"] - 1e-12


def test_prefill_holds_its_blocks_while_the_decode_waits_for_blocks() -> None:
    """vLLM 0.33.0: ``request_finished`` returns delay_free_blocks at the prefill's finish and the
    blocks stay held until the decode side's read completes (the lease, 30 s, renewed by the decode
    side's heartbeats while it has the request). ``b`` waits for decode blocks until ``a`` finishes;
    ``c`` (30 new blocks) reaches the prefill replica meanwhile: its pool of 59 has 29 free beside
    ``b``'s 30 held blocks, so ``c`` is prefilled only once ``b``'s read has landed -- its engine
    waiting for that landing, not stalling."""
    a = TraceRequest("a", 0.0, np.arange(480), 30)  # 30 blocks each; each pool has 59
    b = TraceRequest("b", 0.0, np.arange(5000, 5480), 30)
    first = _pd("round_robin", 1, 1, [a, b], link_gb_s=10.0, num_gpu_blocks=60).requests.set_index("request_id")
    t_c = float(first.loc["b", "prefill_finish"]) + 0.001
    assert t_c < first.loc["b", "kv_arrival"]
    c = TraceRequest("c", t_c, np.arange(9000, 9480), 2)
    rq = _pd("round_robin", 1, 1, [a, b, c], link_gb_s=10.0, num_gpu_blocks=60).requests.set_index("request_id")
    assert rq.loc["b", "kv_wait_s"] > 0
    landed = rq.loc["b", "kv_arrival"]
    assert rq.loc["c", "prefill_finish"] > landed  # admitted at the landing at the earliest
    assert rq.loc["c", "prefill_finish"] - landed < 0.2  # (and then: its engine woke for it)


def test_landed_reads_go_ahead_of_a_waiting_request_that_needs_their_blocks() -> None:
    """One prefill + one decode replica of 39 blocks, an instantaneous link, reads waiting for decode
    blocks: a read landing between two decode steps is in the engine's kv_holding_waiting at once,
    ahead of a preempted request that needs the blocks the loaded ones hold (vLLM's schedule takes
    kv_holding_waiting first). Queued behind it, the decode engine stalled (found at t=3.07 s)."""
    rng = np.random.default_rng(28)
    prefixes = [np.arange(g * 10_000, g * 10_000 + int(rng.integers(16, 300))) for g in range(int(rng.integers(1, 4)))]
    t, reqs = 0.0, []
    for i in range(int(rng.integers(10, 40))):
        t += float(rng.exponential(0.01))
        tail = rng.integers(1_000_000, 2_000_000, size=int(rng.integers(1, 200)))
        reqs.append(TraceRequest(f"r{i}", t, np.concatenate([prefixes[int(rng.integers(len(prefixes)))], tail]),
                                 int(rng.integers(1, 40))))
    rq = _pd("dynamo", 1, 1, reqs, link_gb_s=math.inf, num_gpu_blocks=40).requests
    assert len(rq) == len(reqs) and (rq["kv_wait_s"] > 0).sum() > 5 and (rq["transfer_s"] == 0).all()


def test_llm_d_decider_serves_cached_prompts_on_decode_alone() -> None:
    """llm-d's prefix-based-pd-decider: a prompt whose uncached part on its decode endpoint is
    under nonCachedTokens is served by that endpoint alone (no prefill leg, no transfer)."""
    reqs = _stream(30)
    router = {"kind": "llm_d", "prefix": "approximate", "block_size": 16}
    res = _pd(router, 1, 2, reqs, link_gb_s=25.0, non_cached_tokens=100)
    rq = res.requests
    alone = rq[rq["prefill_replica"] < 0]
    assert len(alone) and (alone["transfer_bytes"] == 0).all() and (alone["decode_replica"] >= 1).all()
    assert res.summary["cluster"]["disaggregation"]["decode"]["decode_only_requests"] == len(alone)
    always = _pd(router, 1, 2, reqs, link_gb_s=25.0).requests
    assert (always["prefill_replica"] == 0).all()


def test_pd_router_kinds_match_config() -> None:
    assert set(PD_ORDER) == set(PD_ROUTERS)


@pytest.mark.parametrize("until, next_instant, now, expected", [
    ({"a": 5.0}, 3.0, 1.0, 3.0),  # a request may arrive first: the engine polls then
    ({"a": 5.0, "b": 4.0}, math.inf, 1.0, 4.0),  # the first landing
    ({"a": 5.0}, math.inf, 5.0, 5.0),  # landing now: a step of no time (the landing runs first)
    ({}, math.inf, 2.0, 2.0),
])
def test_hold_worker_waits_for_the_first_landing_or_routing_instant(
        until: dict[str, float], next_instant: float, now: float, expected: float) -> None:
    from sim.cluster.disagg_hold import HoldWorker

    w = HoldWorker(lambda: next_instant)
    w.until.update(until)
    assert w.has_pending() == bool(until)
    assert w.idle_until(0, now) == expected and w.start_step(0, now, None) == 0.0
    assert w.finish_step(0, now).is_empty()
