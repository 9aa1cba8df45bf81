"""llm-d precise against approximate (issue 34 item 5): the shipped precise profile's weights, the
precise scorer's speculative (in-flight) indexing, and the one-change-at-a-time sweep that isolates
the inversion (configs/sweeps/llm_d_inversion.yaml, docs/cluster.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from idle_fleet_view import BS, IdleFleetView

from sim.cluster.llm_d_router import LlmDRouter
from sim.cluster.router import RouterRequest
from sim.core.kv_events import BlockStored
from sim.experiment.cluster_config import LlmDRouterConfig
from sim.experiment.sweep_config import load_sweep
from workloads.trace_format import TraceRequest

ROOT = Path(__file__).resolve().parents[1]


def request(rid: str) -> RouterRequest:
    return RouterRequest(TraceRequest(rid, 0.0, np.arange(4 * BS + 1, dtype=np.int64), 4), 0)


@pytest.mark.parametrize(("router", "weights"), [
    ({"kind": "llm_d"}, (1.0, 1.0, 2.0)),  # epp-precise-prefix-cache-config.yaml: prefix 2, kv 1, queue 1
    ({"kind": "llm_d", "prefix": "precise"}, (1.0, 1.0, 2.0)),
    ({"kind": "llm_d", "prefix": "approximate"}, (2.0, 2.0, 3.0)),  # the well-lit path's 2 : 2 : 3
    ({"kind": "llm_d", "prefix": "none"}, (2.0, 2.0, 3.0)),
    ({"kind": "llm_d", "prefix": "precise", "weights": {"queue": 2, "kv_cache": 2, "prefix": 3}}, (2.0, 2.0, 3.0)),
    # weights given in part take the rest from their own mode's profile
    ({"kind": "llm_d", "weights": {"queue": 3}}, (3.0, 1.0, 2.0)),
    ({"kind": "llm_d", "prefix": "approximate", "weights": {"queue": 3}}, (3.0, 2.0, 3.0)),
])
def test_default_weights_follow_the_shipped_profile_of_each_mode(router: dict, weights: tuple) -> None:
    w = LlmDRouterConfig.model_validate(router).weights
    assert (w.queue, w.kv_cache, w.prefix) == weights


def test_without_in_flight_tracking_a_second_request_is_blind_until_the_events() -> None:
    r = LlmDRouter(0, prefix="precise")
    r.attach(IdleFleetView(2))
    r.route(request("a"))
    scores, _ = r._prefix_scores(request("b"), [0, 1])
    assert scores == {0: 0.0, 1: 0.0}  # no KV event yet: nothing known


def test_in_flight_tracking_indexes_the_pick_and_forgets_it_after_the_ttl() -> None:
    view = IdleFleetView(2)
    r = LlmDRouter(0, prefix="precise", speculative_ttl_s=30.0)
    r.attach(view)
    first = r.route(request("a")).replica
    other = 1 - first
    scores, believed = r._prefix_scores(request("b"), [0, 1])
    assert scores == {first: 1.0, other: 0.0} and believed[first] == 64  # 4 full blocks of 65 tokens
    assert r.route(request("b")).replica == first  # follows the in-flight request
    # confirmed events for the other replica; after the TTL the speculative entries leave
    r.on_kv_events(other, [BlockStored(request("x").hashes(r.events.group_of[0])[:2], None,
                                       list(range(2 * BS)), BS, None)])
    view.t = 30.0  # both speculative entries (a, b at t=0) expire before c is scored
    assert r.route(request("c")).replica == other  # only the confirmed 2 blocks remain: on `other`
    assert r.speculative.num_entries(first) == 0 and r.speculative.num_entries(other) == 4
    scores, _ = r._prefix_scores(request("d"), [0, 1])
    assert scores == {first: 0.0, other: 1.0}


def test_in_flight_tracking_is_ignored_by_the_approximate_producer() -> None:
    r = LlmDRouter(0, prefix="approximate", speculative_ttl_s=30.0)
    assert r.speculative_ttl_s is None


def flat(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


ROUTER = "cluster.router."
WEIGHTS = {ROUTER + "weights.queue", ROUTER + "weights.kv_cache", ROUTER + "weights.prefix"}
ONE_CHANGE = {
    "precise": set(),
    "precise_events_50ms": {"cluster.kv_events.delay_s"},
    "precise_block_64": {"engine.block_size", "engine.num_gpu_blocks"},
    "precise_weights_1_1_2": WEIGHTS,
    "precise_in_flight": {ROUTER + "speculative_ttl_s"},
    "approximate": {ROUTER + "prefix"},
    "approximate_block_16": {ROUTER + "prefix", ROUTER + "block_size", ROUTER + "max_prefix_blocks"},
    "approximate_weights_1_1_2": {ROUTER + "prefix"} | WEIGHTS,
}


def test_inversion_sweep_changes_one_thing_per_point() -> None:
    sw = load_sweep(ROOT / "configs" / "sweeps" / "llm_d_inversion.yaml")
    cfgs = {p.axes["cluster.router"]: flat(p.config.model_dump(mode="json")) for p in sw.points}
    assert set(cfgs) == set(ONE_CHANGE)
    base = cfgs["precise"]
    for label, cfg in cfgs.items():
        assert {k for k in base if cfg[k] != base[k]} == ONE_CHANGE[label], label


def test_spread_counts_requests_sent_away_and_those_sent_blind() -> None:
    import pandas as pd

    from tools.llm_d_spread import spread

    df = pd.DataFrame({
        "session": ["prefix-1/user-0", "prefix-1/user-1", "prefix-1/user-2", "prefix-2/user-0", "prefix-1/user-3"],
        "arrival": [0.0, 0.5, 2.0, 2.5, 3.0],
        "first_token": [1.0, 1.5, 2.2, 2.6, 3.1],
        "replica": [0, 1, 2, 0, 1],
    })
    # prefix-1: r0 at 0; r1 at 0.5 (away, blind: first token of r0 at 1.0); r2 at 2.0 (away, not
    # blind); r1 again at 3.0 (not away). prefix-2: one replica.
    assert spread(df) == {"replicas_per_group": (3 + 1) / 2, "sent_away": 2, "sent_away_blind": 1}
