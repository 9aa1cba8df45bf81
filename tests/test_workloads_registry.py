"""Workload configs end to end: YAML -> stream -> replay; stats CLI; the published Mooncake facts."""

import json
from pathlib import Path

import numpy as np
import pytest

from sim.cli.main import main
from sim.core.request import token_array
from sim.experiment.config import ConfigError, config_from_dict, load_config
from sim.experiment.run import replay_experiment, run_experiment
from sim.experiment.workload import build_workload, workload_stats
from workloads.bounds import infinite_cache_hit_bound
from workloads.paths import shared_traces_dir

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
NEW_CONFIGS = ["chat_mooncake", "chat_synthetic", "rag_ragpulse", "rag_synthetic", "agent_trace",
               "agent_synthetic", "azure_code"]
TRACES = shared_traces_dir()
needs_traces = pytest.mark.skipif(not (TRACES / "mooncake").is_dir(), reason="shared traces not present")


def _cfg(workload, **engine):
    return config_from_dict({
        "name": "t", "seed": 3, "latency": {"kind": "fixed", "step_time_s": 0.001}, "workload": workload,
        "engine": {"block_size": 16, "num_gpu_blocks": 200000, "max_model_len": 65536, **engine},
    })


def _stream(cfg):
    return [(r.id, r.arrival, token_array(r.tokens).tolist(), r.salt, r.tenant) for r in build_workload(cfg).requests]


@needs_traces
@pytest.mark.parametrize("name", NEW_CONFIGS)
def test_every_config_builds(name):
    cfg = load_config(CONFIGS / f"{name}.yaml", ["workload.limit=25"])
    reqs = list(build_workload(cfg).requests)
    assert len(reqs) == 25
    assert all(a.arrival <= b.arrival for a, b in zip(reqs, reqs[1:]))
    assert all(len(r.tokens) <= (cfg.engine.max_model_len or 131072) for r in reqs)


CHAT = {"kind": "chat", "sessions": 25, "think_time": 1000, "max_context_tokens": 12000,
        "arrival": {"kind": "poisson", "rate": 0.01}}
RAG = {"kind": "rag", "requests": 250, "corpus_size": 80, "arrival": {"kind": "poisson", "rate": 1.0}}
AGENT = {"kind": "agent", "sessions": 3, "tool_tokens": 3000, "system_prompt_tokens": 1000,
         "initial_context_tokens": 2000, "steps": 8, "max_context_tokens": 30000, "summary_tokens": 1000,
         "subagent_probability": 0.3, "step_gap": 300, "arrival": {"kind": "poisson", "rate": 0.0001}}


@pytest.mark.parametrize("workload", [CHAT, RAG, AGENT, {**CHAT, "tenants": {
    "num_tenants": 3, "salt": "shared_system_prompt", "lora_adapters": 2, "prompt_logprobs_fraction": 0.2}}],
    ids=["chat", "rag", "agent", "chat-tenants"])
def test_replay_reaches_the_infinite_cache_bound(workload):
    """Salt 'none' (or any policy) with a pool that never evicts, at low load: the replay's hit
    tokens equal the bound exactly (answer blocks included, see workloads.bounds)."""
    cfg = _cfg(workload)
    bound = infinite_cache_hit_bound(build_workload(cfg).requests, 16)
    result, _ = replay_experiment(cfg)
    r = result.requests
    assert result.summary["num_preemptions"] == 0 and bound > 0.3
    assert r.hit_tokens.sum() / r.prompt_tokens.sum() == pytest.approx(bound, abs=1e-12)


def test_per_request_salt_gives_zero_hits():
    cfg = _cfg({**CHAT, "sessions": 10, "tenants": {"salt": "per_request"}})
    result, _ = replay_experiment(cfg)
    assert result.requests.hit_tokens.sum() == 0 and result.summary["token_hit_rate"] == 0.0


def test_under_load_the_bound_is_an_upper_bound():
    cfg = _cfg({**CHAT, "think_time": 0.05, "arrival": {"kind": "poisson", "rate": 50.0}})
    bound = infinite_cache_hit_bound(build_workload(cfg).requests, 16)
    result, _ = replay_experiment(cfg)
    achieved = result.requests.hit_tokens.sum() / result.requests.prompt_tokens.sum()
    assert 0 < achieved < bound


def test_same_seed_same_stream_and_arrivals_do_not_change_content():
    a = _stream(_cfg({**CHAT, "tenants": {"num_tenants": 3, "salt": "per_user", "users_per_tenant": 4}}))
    b = _stream(_cfg({**CHAT, "tenants": {"num_tenants": 3, "salt": "per_user", "users_per_tenant": 4}}))
    assert a == b
    c = _stream(_cfg({**CHAT, "arrival": {"kind": "gamma", "rate": 0.5, "cv": 3.0}}))
    assert sorted(x[2] for x in a) == sorted(x[2] for x in c)  # same prompts, other times
    assert [x[1] for x in a] != [x[1] for x in c]
    d = _stream(_cfg({**CHAT, "seed": 99}))
    assert sorted(x[2] for x in a) != sorted(x[2] for x in d)


def test_arrival_rate_scale_and_azure():
    base = _stream(_cfg({**RAG, "arrival": {"kind": "poisson", "rate": 1.0}}))
    fast = _stream(_cfg({**RAG, "arrival": {"kind": "poisson", "rate": 1.0, "rate_scale": 4.0}}))
    assert [x[1] / 4 for x in base] == pytest.approx([x[1] for x in fast])
    if (TRACES / "azure_llm_2023").is_dir():
        az = _stream(_cfg({**RAG, "arrival": {"kind": "azure", "trace": "conv"}}))
        assert az[0][1] == 0.0 and all(x[1] <= y[1] for x, y in zip(az, az[1:]))


@pytest.mark.parametrize("workload, key", [
    ({**CHAT, "arrival": {"kind": "trace"}}, "workload.arrival.kind"),
    ({"kind": "agent_trace", "path": "/nonexistent"}, "workload.path"),
])
def test_config_errors_after_validation(workload, key):
    with pytest.raises(ConfigError, match=key):
        build_workload(_cfg(workload))


@pytest.mark.parametrize("workload, key", [
    ({**CHAT, "tenants": {"salt": "sometimes"}}, "workload.tenants.salt"),
    ({**CHAT, "turns": {"dist": "geometric", "mean": 0.2}}, "workload.turns"),
    ({**CHAT, "bogus": 1}, "workload.bogus: unknown key"),
    ({**RAG, "top_k": 500}, "workload"),
    ({**CHAT, "arrival": {"kind": "gamma", "rate": -1}}, "workload.arrival.rate"),
])
def test_config_errors_at_validation(workload, key):
    with pytest.raises(ConfigError, match=key):
        _cfg(workload)


@needs_traces
@pytest.mark.parametrize("fname, fact", [("conversation_trace.jsonl", 0.366), ("synthetic_trace.jsonl", 0.640)])
def test_mooncake_published_facts_through_config(fname, fact):
    cfg = _cfg({"kind": "mooncake", "path": str(TRACES / "mooncake" / fname), "limit": 50})
    s = workload_stats(cfg, [512])
    assert abs(s["source_facts"]["whole_file_id_level_block_hit_bound"] - fact) <= 0.0005
    assert any("lower bound" in n for n in s["notes"]) and s["requests"] == 50


def test_skipped_lines_reach_meta_json(tmp_path):
    row = {"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [0]}
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps(row) + "\n{broken\n" + json.dumps({**row, "timestamp": 5, "hash_ids": [1]}) + "\n")
    cfg = _cfg({"kind": "mooncake", "path": str(p), "skip_bad_lines": True})
    _, folder = run_experiment(cfg, out=tmp_path / "out", progress=False)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["skipped_bad_lines"] == 1 and meta["skipped_line_numbers"] == [2]
    assert "lower bound" in meta["workload"]


def test_stats_cli(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text((CONFIGS / "chat_synthetic.yaml").read_text())
    rc = main(["workloads", "stats", str(cfg), "--set", "workload.sessions=6", "--block-size", "16,64",
               "--block-size", "512"])
    out = capsys.readouterr().out
    assert rc == 0 and "infinite-cache hit bound  bs 16:" in out and "bs 512:" in out and "sessions" in out
    rc = main(["workloads", "stats", str(cfg), "--set", "workload.sessions=6", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["sessions"] == 6 and set(data["hit_bound"]) == {"16"}
    assert main(["workloads", "stats", str(cfg), "--set", "workload.arrival={kind: trace}"]) == 2
    assert "workload.arrival.kind" in capsys.readouterr().err


def test_synthetic_shared_prefix_still_works_with_tenants():
    cfg = _cfg({"kind": "synthetic_shared_prefix", "num_requests": 30, "tenants": {"num_tenants": 2,
                                                                                   "salt": "per_tenant"}})
    reqs = list(build_workload(cfg).requests)
    assert len(reqs) == 30 and {r.salt for r in reqs} <= {"t0", "t1"}
    assert np.all(np.diff([r.arrival for r in reqs]) >= 0)
