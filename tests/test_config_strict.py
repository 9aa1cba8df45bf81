"""Strict config input: duplicate YAML keys, non-finite numbers, non-UTF-8 files,
malformed ``--set`` values and vLLM 0.25.1's block-size rule each stop with one message naming the
file and line, or the key, or the override -- never a traceback, never a silently wrong run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.cli.main import main
from sim.experiment.config import ConfigError, load_config
from sim.experiment.sweep_config import load_sweep

SMALL = {
    "name": "t",
    "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 4096},
    "latency": {"kind": "fixed", "step_time_s": 0.02},
    "workload": {"kind": "synthetic_shared_prefix", "num_requests": 6, "prefix_tokens": 64,
                 "suffix_tokens": 16, "output_tokens": 2, "rate": 50.0},
}


def _yaml(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _small(tmp_path: Path) -> Path:
    return _yaml(tmp_path, yaml.safe_dump(SMALL, sort_keys=False))


def _load_error(path: Path, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(path, overrides)
    return str(exc.value)


# -- duplicate keys -----------------------------------------------------------------------------


def test_duplicate_yaml_key_names_file_line_and_key(tmp_path):
    p = _yaml(tmp_path, "name: t\nengine:\n  block_size: 16\n  num_gpu_blocks: 100\n  block_size: 64\n"
                        "workload: {kind: synthetic_shared_prefix}\n")
    assert _load_error(p) == f"{p}:5: duplicate key 'block_size' (first on line 3)"


def test_duplicate_top_level_and_flow_mapping_keys(tmp_path):
    p = _yaml(tmp_path, "name: a\nname: b\n")
    assert _load_error(p) == f"{p}:2: duplicate key 'name' (first on line 1)"
    p = _yaml(tmp_path, "name: t\nworkload: {kind: synthetic_shared_prefix, kind: chat}\n")
    assert _load_error(p) == f"{p}:2: duplicate key 'kind' (first on line 2)"


def test_yaml_merge_key_still_overrides(tmp_path):
    text = ("base: &b {block_size: 16, num_gpu_blocks: 400}\nname: t\nengine:\n  <<: *b\n  block_size: 32\n"
            "workload: {kind: synthetic_shared_prefix}\n")
    data = yaml.safe_load(text)
    data.pop("base")
    cfg = load_config(_yaml(tmp_path, yaml.safe_dump(data)))
    assert cfg.engine.block_size == 32
    from sim.experiment.strict_yaml import load_yaml_text

    assert load_yaml_text(text)["engine"] == {"block_size": 32, "num_gpu_blocks": 400}


def test_duplicate_key_in_a_sweep_file(tmp_path):
    p = _yaml(tmp_path, "name: s\nbase: {}\ngrid:\n  seed: [0, 1]\n  seed: [2]\n", "sweep.yaml")
    with pytest.raises(ConfigError, match=r"sweep\.yaml:5: duplicate key 'seed' \(first on line 4\)"):
        load_sweep(p)


def test_duplicate_key_inside_a_set_value_names_the_override(tmp_path):
    msg = _load_error(_small(tmp_path), ["engine={block_size: 16, block_size: 32}"])
    assert msg == "--set engine={block_size: 16, block_size: 32}: duplicate key 'block_size' (first on line 1)"


# -- non-finite numbers -------------------------------------------------------------------------


@pytest.mark.parametrize(("override", "key"), [
    ("latency.step_time_s=.inf", "latency.step_time_s"),
    ("latency.step_time_s=.nan", "latency.step_time_s"),
    ("engine.kv_cache_gib=.inf", "engine.kv_cache_gib"),
    ("workload.rate=.inf", "workload.rate"),
    ("engine.watermark=.nan", "engine.watermark"),
])
def test_non_finite_numbers_are_refused(tmp_path, override, key):
    data = {**SMALL, "engine": {"block_size": 16, "max_model_len": 4096}} if "kv_cache_gib" in key else SMALL
    p = _yaml(tmp_path, yaml.safe_dump(data))
    msg = _load_error(p, [override])
    assert msg.startswith(f"--set {override}: {key}: Input should be a finite number"), msg


@pytest.mark.parametrize(("workload", "key"), [
    ("{kind: mooncake, path: t.jsonl, time_scale: .inf}", "workload.time_scale"),
    ("{kind: trace, path: t.jsonl, arrival: {kind: poisson, rate: .inf}}", "workload.arrival.rate"),
    ("{kind: trace, path: t.jsonl, arrival: {kind: trace, rate_scale: .nan}}", "workload.arrival.rate_scale"),
])
def test_non_finite_workload_times_are_refused(tmp_path, workload, key):
    engine = "{block_size: 16, num_gpu_blocks: 400, max_model_len: 4096}"
    p = _yaml(tmp_path, f"name: t\nengine: {engine}\nworkload: {workload}\n")
    msg = _load_error(p)
    assert msg.startswith(f"{p}: {key}: Input should be a finite number (got "), msg


def test_step_time_inf_does_not_run(tmp_path, capsys):
    assert main(["run", str(_small(tmp_path)), "--no-progress", "--out", str(tmp_path / "o"),
                 "--set", "latency.step_time_s=.inf"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "apcsim: error: --set latency.step_time_s=.inf: latency.step_time_s: Input should be a finite number (got inf)"
    ]
    assert not (tmp_path / "o").exists()


# -- encoding -----------------------------------------------------------------------------------


def test_non_utf8_yaml_names_line_and_byte(tmp_path, capsys):
    p = tmp_path / "exp.yaml"
    p.write_bytes(b"name: t\nworkload:\n  kind: caf\xe9\n")
    assert _load_error(p) == f"{p}:3:12: not UTF-8 (byte 0xe9)"
    assert main(["run", str(p)]) == 2
    assert capsys.readouterr().err == f"apcsim: error: {p}:3:12: not UTF-8 (byte 0xe9)\n"


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    p = tmp_path / "exp.yaml"
    p.write_bytes(b"\xef\xbb\xbf" + yaml.safe_dump(SMALL).encode())
    assert load_config(p).name == "t"


# -- --set --------------------------------------------------------------------------------------


@pytest.mark.parametrize("override", ["engine.block_size=[", "engine.block_size={a: 1", "engine=: :", "x=\t"])
def test_malformed_set_value_is_one_message_naming_the_override(tmp_path, capsys, override):
    p = _small(tmp_path)
    shown = override if override.isprintable() else repr(override)  # a tab or a line break is quoted
    msg = _load_error(p, [override])
    assert msg.startswith(f"--set {shown}: invalid YAML: ") and str(p) not in msg, msg
    assert main(["run", str(p), "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"apcsim: error: --set {shown}: invalid YAML") and err.count("\n") == 1


def test_set_validation_errors_name_the_override_not_the_file(tmp_path):
    p = _small(tmp_path)
    assert _load_error(p, ["engine.block_size=0"]) == (
        "--set engine.block_size=0: engine.block_size: Input should be greater than 0 (got 0)")
    assert _load_error(p, ["engine.bogus=1"]) == "--set engine.bogus=1: engine.bogus: unknown key"
    assert _load_error(p, ["engine.block_size.x=1"]) == (
        "--set engine.block_size.x=1: engine.block_size is not a mapping")
    assert _load_error(p, ["oops"]) == "--set oops: an override must look like key.path=value"
    # a problem in the file itself still names the file
    bad = _yaml(tmp_path, yaml.safe_dump({**SMALL, "seed": "x"}), "bad.yaml")
    assert _load_error(bad, ["engine.block_size=32"]).startswith(f"{bad}: seed: ")


def test_sweep_set_errors_name_the_override(tmp_path):
    p = _yaml(tmp_path, yaml.safe_dump({"name": "s", "base": SMALL, "grid": {"seed": [0, 1]}}), "sweep.yaml")
    with pytest.raises(ConfigError) as exc:
        load_sweep(p, overrides=["engine.max_num_seqs=[1"])
    assert str(exc.value).startswith("--set engine.max_num_seqs=[1: invalid YAML")
    with pytest.raises(ConfigError) as exc:
        load_sweep(p, overrides=["engine.max_num_seqs=-1"])
    assert str(exc.value).startswith("--set engine.max_num_seqs=-1: engine.max_num_seqs: Input should be greater")


# -- block size (vLLM 0.25.1 attention backends) ------------------------------------------------


@pytest.mark.parametrize("bs", [1, 7, 8, 24, 100, 4088])
def test_block_size_vllm_has_no_attention_backend_for_is_refused(tmp_path, bs):
    msg = _load_error(_small(tmp_path), [f"engine.block_size={bs}"])
    assert msg.startswith(f"--set engine.block_size={bs}: engine.block_size: vLLM 0.25.1 has no attention backend "
                          f"for block size {bs}"), msg


@pytest.mark.parametrize("bs", [16, 32, 48, 272, 4096])
def test_block_size_multiple_of_16_is_accepted(tmp_path, bs):
    assert load_config(_small(tmp_path), [f"engine.block_size={bs}"]).engine.block_size == bs


def test_kv_cache_group_block_sizes_follow_the_rule_and_hash_block_size_may_be_finer(tmp_path):
    groups = "[{kind: full, block_size: 32}, {kind: sliding_window, block_size: 8, sliding_window: 64}]"
    msg = _load_error(_small(tmp_path), [f"engine.kv_cache_groups={groups}"])
    assert "engine.kv_cache_groups.1.block_size: vLLM 0.25.1 has no attention backend for block size 8" in msg
    ok = "[{kind: full, block_size: 32}, {kind: sliding_window, block_size: 16, sliding_window: 64}]"
    cfg = load_config(_small(tmp_path), [f"engine.kv_cache_groups={ok}", "engine.prefix_match_unit=8"])
    assert cfg.engine.prefix_match_unit == 8  # vLLM 0.33.0's name; 0.25.1 called it hash_block_size
    cfg = load_config(_small(tmp_path), [f"engine.kv_cache_groups={ok}", "engine.hash_block_size=8",
                                         "engine.vllm_version=0.25.1"])
    assert cfg.engine.hash_block_size == 8
