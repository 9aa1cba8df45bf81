"""Hypothesis properties of the fleet miss attribution (sim.cluster.fleet_attribution): on random
small fleets, routers and streams (shared prefix pieces, salts, a pool small enough to evict) the
causes add up to the missed prompt tokens on every request, attribution changes no decision, and
one replica never has a request routed away."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cluster.cluster import ClusterReplay
from sim.experiment.cluster_run import build_router, replica_specs
from sim.experiment.config import config_from_dict
from sim.experiment.run import build_latency, simulated_executor
from sim.replay.attribution_records import FLEET_MISS_COLUMN, check_attribution
from workloads.trace_format import TraceRequest

PIECES = [np.arange(p * 1000, p * 1000 + 40 + 24 * p, dtype=np.int64) for p in range(5)]  # 40..136 tokens

request = st.tuples(
    st.lists(st.integers(0, 4), min_size=1, max_size=4),  # the prefix pieces of its prompt, in order
    st.integers(1, 30),                                   # unique tail tokens
    st.sampled_from([None, "a"]),                         # salt
    st.floats(0.0, 0.2),                                  # gap to the previous arrival (s)
    st.integers(1, 40),                                   # output tokens
)


def _stream(spec: list[tuple[list[int], int, str | None, float, int]]) -> list[TraceRequest]:
    out, t = [], 0.0
    for i, (pieces, tail, salt, gap, n_out) in enumerate(spec):
        t += gap
        tokens = np.concatenate([*(PIECES[p] for p in pieces), np.arange(10**6 + 100 * i, 10**6 + 100 * i + tail)])
        out.append(TraceRequest(f"r{i}", t, tokens.astype(np.int64), n_out, salt=salt))
    return out


def _run(replicas: int, router: str, stream: list[TraceRequest], attribution: str):
    cfg = config_from_dict({
        "name": "p", "engine": {"block_size": 16, "num_gpu_blocks": 48, "max_model_len": 640,
                                "max_num_batched_tokens": 256},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 1},
        "cluster": {"replicas": replicas, "router": router},
    })
    specs, _ = replica_specs(cfg, simulated_executor, build_latency)
    r, info = build_router(cfg)
    return ClusterReplay(specs, r, stream, router_info=info, integrity_check=True, attribution=attribution).run()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request, min_size=1, max_size=25), st.integers(1, 4),
       st.sampled_from(["round_robin", "random", "least_loaded", "sglang", "dynamo"]))
def test_fleet_causes_add_up_and_change_nothing(spec, replicas: int, router: str) -> None:
    stream = _stream(spec)
    off = _run(replicas, router, stream, "off")
    on = _run(replicas, router, stream, "summary")  # integrity_check: check_attribution on the fleet table
    check_attribution(on.requests)
    pd.testing.assert_frame_equal(off.requests, on.requests[list(off.requests.columns)])
    pd.testing.assert_frame_equal(off.steps, on.steps)
    if replicas == 1:
        assert (on.requests[FLEET_MISS_COLUMN] == 0).all()
    full = _run(replicas, router, stream, "full")
    pd.testing.assert_frame_equal(on.requests, full.requests)  # the set-based count == the per-block rule
    if full.blocks is not None and len(full.blocks):
        away = full.blocks[full.blocks["cause"] == "routed_away"]
        assert (away["resident_on"] != away["replica"]).all()
