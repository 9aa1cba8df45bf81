"""The fleet's result from Tables (``sim.cluster.fleet_tables``) against the pandas path, its oracle:
the same request and step frames (dtypes and index included), per-replica frames and summaries,
and the same summary to the bit (compared as JSON, NaN included, key order too), for routers that
read KV events, gauges and pending tokens, with idle replicas and recorded events; the cases it
declines (faults, miss attribution, rejected requests) run the pandas path; and a fleet replay
that only summarises never imports pandas."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import sim.cluster.cluster as cluster_mod
from sim.cluster.fleet_tables import concat_tables
from sim.experiment.config import config_from_dict
from sim.experiment.run import replay_experiment
from sim.replay.table import Table


def _cfg(replicas: int, router: dict, *, n: int = 40, faults: tuple = (), record_events: bool = False,
         attribution: str = "off", max_model_len: int = 2048, prompt: int = 256):
    return config_from_dict({
        "name": "fleet_tables", "seed": 5, "model": "llama-3-8b", "gpu": "H100-SXM",
        "engine": {"block_size": 16, "num_gpu_blocks": 300, "max_model_len": max_model_len},
        "replay": {"record_events": record_events, "attribution": attribution},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": n, "num_prefixes": 3,
                     "prefix_tokens": prompt, "suffix_tokens": 40, "output_tokens": 30, "rate": 30.0},
        "cluster": {"replicas": replicas, "router": router, "faults": list(faults)},
    })


def _both(cfg, monkeypatch):
    fast, _ = replay_experiment(cfg, progress=False)
    with monkeypatch.context() as m:
        m.setattr(cluster_mod, "table_result", lambda *a: None)  # the pandas path
        plain, _ = replay_experiment(cfg, progress=False)
    return fast, plain


def _dump(summary: dict) -> str:
    return json.dumps(summary, default=str)


def _assert_equal(fast, plain) -> None:
    pd.testing.assert_frame_equal(fast.requests, plain.requests)
    pd.testing.assert_frame_equal(fast.steps, plain.steps)
    assert _dump(fast.summary) == _dump(plain.summary)
    assert fast.events == plain.events and fast.event_replicas == plain.event_replicas
    assert len(fast.replicas) == len(plain.replicas)
    for a, b in zip(fast.replicas, plain.replicas, strict=True):
        pd.testing.assert_frame_equal(a.requests, b.requests)
        pd.testing.assert_frame_equal(a.steps, b.steps)
        assert _dump(a.summary) == _dump(b.summary)


ROUTERS = [
    {"kind": "round_robin"},
    {"kind": "dynamo"},
    {"kind": "llm_d", "prefix": "precise"},
    {"kind": "llm_d", "prefix": "approximate"},
    {"kind": "sglang"},
    {"kind": "mooncake"},
    {"kind": "least_loaded"},
]


@pytest.mark.parametrize("router", ROUTERS, ids=lambda r: "-".join(map(str, r.values())))
def test_tables_equal_the_pandas_path(router, monkeypatch):
    fast, plain = _both(_cfg(4, router), monkeypatch)
    # the Table path ran, unless replica 0 got nothing (then the pandas path: its empty frames' dtypes)
    assert isinstance(fast.request_table, Table) == (fast.replicas[0].summary["num_requests"] > 0)
    assert isinstance(fast.step_table, Table) == isinstance(fast.request_table, Table)
    _assert_equal(fast, plain)


def test_idle_replicas_and_recorded_events(monkeypatch):
    # 12 replicas, 5 requests behind round robin: 7 replicas never get one (their empty tables)
    fast, plain = _both(_cfg(12, {"kind": "round_robin"}, n=5, record_events=True), monkeypatch)
    assert isinstance(fast.request_table, Table)
    assert sum(r.summary["num_requests"] == 0 for r in fast.replicas) == 7
    _assert_equal(fast, plain)


@pytest.mark.parametrize("case", ["fault", "attribution", "rejected"])
def test_declined_cases_take_the_pandas_path(case, monkeypatch):
    kwargs = {"fault": {"faults": ({"replica": 1, "down_at": 0.3, "up_at": 0.9},)},
              "attribution": {"attribution": "summary"},
              "rejected": {"max_model_len": 300, "prompt": 400}}[case]
    fast, plain = _both(_cfg(3, {"kind": "dynamo"}, **kwargs), monkeypatch)
    assert not isinstance(fast.request_table, Table)
    _assert_equal(fast, plain)


def test_concat_declines_parts_that_pandas_would_type_together():
    ints = Table({"a": np.array([1, 2], dtype=np.int64), "s": ["x", None]})
    floats = Table({"a": np.array([1.5, 2.5], dtype=np.float64), "s": ["y", None]})
    none_only = Table({"a": np.array([3], dtype=np.int64), "s": [None]})
    assert concat_tables([ints, floats]) is None  # int64 beside float64
    assert concat_tables([ints, none_only]) is None  # strings beside None alone
    more = Table({"a": np.array([7], dtype=np.int64), "s": [None, "z"][1:]})  # str alone: other types
    assert concat_tables([ints, more]) is None
    same = Table({"a": np.array([7, 8], dtype=np.int64), "s": [None, "z"]})
    both = concat_tables([ints, same])
    assert both is not None
    assert both["a"].tolist() == [1, 2, 7, 8] and both["s"] == ["x", None, None, "z"]

def test_a_fleet_that_only_summarises_never_imports_pandas(tmp_path):
    code = (
        "import sys\n"
        "from sim.experiment.config import config_from_dict\n"
        "from sim.experiment.run import replay_experiment\n"
        "cfg = config_from_dict({'name': 'x',\n"
        "    'engine': {'block_size': 16, 'num_gpu_blocks': 300, 'max_model_len': 2048},\n"
        "    'workload': {'kind': 'synthetic_shared_prefix', 'num_requests': 30, 'num_prefixes': 6,\n"
        "                 'prefix_tokens': 128, 'suffix_tokens': 16, 'output_tokens': 8, 'rate': 20.0},\n"
        "    'cluster': {'replicas': 3, 'router': {'kind': 'dynamo'}}})\n"
        "res, _ = replay_experiment(cfg, progress=False)\n"
        "assert res.summary['num_requests'] == 30, res.summary['num_requests']\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_an_empty_request_table_stays_a_table_with_the_frame_pandas_makes():
    from sim.replay.metrics import REQUEST_COLUMNS, RecordTable, finalize_requests

    empty = RecordTable(REQUEST_COLUMNS).to_table()
    table = finalize_requests(empty)
    assert isinstance(table, Table)
    pd.testing.assert_frame_equal(table.to_frame(), finalize_requests(empty.to_frame()))
