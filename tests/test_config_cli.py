"""Experiment config validation, `apcsim run`, result files and determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.cli.main import main
from sim.experiment.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "name": "t",
    "engine": {"block_size": 16, "num_gpu_blocks": 2000, "max_model_len": 8192},
    "latency": {"kind": "fixed", "step_time_s": 0.02},
    "workload": {"kind": "synthetic_shared_prefix", "num_requests": 40, "prefix_tokens": 256,
                 "suffix_tokens": 64, "output_tokens": 8, "rate": 50.0},
}


def _write(tmp_path: Path, data: dict, name: str = "exp.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def _err(tmp_path: Path, data: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(_write(tmp_path, data))
    return str(exc.value)


def test_unknown_key_names_file_and_key(tmp_path):
    msg = _err(tmp_path, {**SMALL, "engine": {**SMALL["engine"], "blok_size": 32}})
    assert "exp.yaml" in msg and "engine.blok_size: unknown key" in msg


def test_wrong_type_and_impossible_values(tmp_path):
    msg = _err(tmp_path, {**SMALL, "engine": {**SMALL["engine"], "block_size": "big"}})
    assert "engine.block_size" in msg
    msg = _err(tmp_path, {**SMALL, "engine": {**SMALL["engine"], "block_size": 0}})
    assert "engine.block_size" in msg and "greater than 0" in msg
    msg = _err(tmp_path, {**SMALL, "engine": {**SMALL["engine"], "kv_cache_gib": 10}})
    assert "num_gpu_blocks or kv_cache_gib" in msg
    msg = _err(tmp_path, {**SMALL, "workload": {"kind": "nope"}})
    assert "workload" in msg
    msg = _err(tmp_path, {k: v for k, v in SMALL.items() if k != "workload"})
    assert "workload: required key is missing" in msg


def test_invalid_yaml_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nengine: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+:\d+: invalid YAML"):
        load_config(p)


def test_pool_too_small_for_max_model_len_is_rejected(tmp_path, capsys):
    p = _write(tmp_path, {**SMALL, "engine": {"block_size": 16, "num_gpu_blocks": 100, "max_model_len": 8192}})
    assert main(["run", str(p), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "engine.num_gpu_blocks" in err and "max_model_len=8192" in err and "Traceback" not in err


def test_bad_trace_line_is_reported_with_file_and_line(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"id": "a", "arrival": 0, "tokens": [1, 2, 3], "output_tokens": 2}\n'
                     '{"id": "b", "arrival": 1, "tokens": [1, 2], "output_tokens": -1}\n')
    p = _write(tmp_path, {**SMALL, "workload": {"kind": "trace", "path": "t.jsonl"}})
    assert main(["run", str(p), "--no-progress", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:2" in err and "output_tokens" in err
    # skip_bad_lines: the run completes and meta.json reports the skipped line
    p = _write(tmp_path, {**SMALL, "workload": {"kind": "trace", "path": "t.jsonl", "skip_bad_lines": True}})
    assert main(["run", str(p), "--no-progress", "--out", str(tmp_path / "o2")]) == 0
    meta = json.loads((tmp_path / "o2" / "meta.json").read_text())
    assert meta["skipped_bad_lines"] == 1 and meta["skipped_line_numbers"] == [2]


def test_run_writes_every_result_file_and_is_deterministic(tmp_path):
    p = _write(tmp_path, SMALL)
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert main(["run", str(p), "--no-progress", "--csv", "--out", str(out)]) == 0
    for name in ("requests.parquet", "requests.csv", "steps.parquet", "steps.csv", "summary.json",
                 "config.resolved.yaml", "meta.json"):
        assert (outs[0] / name).is_file(), name
    for name in ("requests.parquet", "requests.csv", "steps.parquet", "steps.csv", "summary.json",
                 "config.resolved.yaml"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    summary = json.loads((outs[0] / "summary.json").read_text())
    req = pd.read_parquet(outs[0] / "requests.parquet")
    assert summary["num_requests"] == len(req) == 40
    assert 0 < summary["token_hit_rate"] < 1
    assert summary["prefix_cache"]["hits"] / summary["prefix_cache"]["queries"] == summary["token_hit_rate"]
    assert req["hit_tokens"].sum() > 0 and (req["hit_tokens"] % 16 == 0).all()
    meta = json.loads((outs[0] / "meta.json").read_text())
    assert meta["versions"]["simpy"] and "git_commit" in meta
    resolved = yaml.safe_load((outs[0] / "config.resolved.yaml").read_text())
    assert resolved["engine"]["hash_algo"] == "fast" and resolved["engine"]["policy"] == "fcfs"


def test_overrides_and_seed_change_results(tmp_path):
    p = _write(tmp_path, SMALL)
    assert main(["run", str(p), "--no-progress", "--out", str(tmp_path / "a"), "--set", "seed=1"]) == 0
    assert main(["run", str(p), "--no-progress", "--out", str(tmp_path / "b"), "--set", "seed=2"]) == 0
    assert (tmp_path / "a" / "requests.parquet").read_bytes() != (tmp_path / "b" / "requests.parquet").read_bytes()
    cfg = load_config(p, ["engine.block_size=64", "workload.num_requests=7"])
    assert cfg.engine.block_size == 64 and cfg.workload.num_requests == 7
    with pytest.raises(ConfigError, match="engine.bogus: unknown key"):
        load_config(p, ["engine.bogus=1"])


def test_quickstart_config_is_valid():
    cfg = load_config(ROOT / "configs" / "quickstart.yaml")
    assert cfg.workload.kind == "mooncake"
    assert cfg.resolve_path(cfg.workload.path).is_file()
