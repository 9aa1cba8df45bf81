"""``engine.vllm_version`` at the config level: the keys of one version only, the rename of
``hash_block_size``, the NONE_HASH seed, EAGLE's resolution, the sliding-window in-flight cap,
and the version named in results (``sim.experiment.version_keys``, ``engine_description``)."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any

import pytest

from sim.cli.summary import render
from sim.core.hashing import ExactBlockHasher
from sim.experiment.config import ConfigError, config_from_dict
from sim.experiment.engine_description import resolve
from sim.experiment.run import build_scheduler

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = {"kind": "trace", "path": "workloads/data/mooncake_conversation_sample.jsonl"}
GROUPS = [{"kind": "full", "block_size": 16}, {"kind": "sliding_window", "block_size": 16, "sliding_window": 128}]


def _cfg(**engine: Any) -> Any:
    return config_from_dict({"name": "v", "workload": WORKLOAD,
                             "engine": {"num_gpu_blocks": 4096, "max_model_len": 4096, **engine}}, "f.yaml")


def _error(**engine: Any) -> str:
    with pytest.raises(ConfigError) as exc:
        resolve(_cfg(**engine))
    return str(exc.value)


def test_default_version_is_033() -> None:
    assert resolve(_cfg()).profile.version == "0.33.0"


def test_unknown_version_is_one_line_listing_the_supported_ones() -> None:
    assert _error(vllm_version="0.30.0") == (
        "f.yaml: engine.vllm_version: unknown vLLM version '0.30.0'; supported: 0.33.0, 0.25.1")


@pytest.mark.parametrize("key", ["max_num_active_seqs", "prefill_schedule_interval"])
def test_033_knobs_refused_under_0251(key: str) -> None:
    assert _error(vllm_version="0.25.1", **{key: 2}) == (
        f"f.yaml: engine.{key}: a vLLM 0.33.0 knob; engine.vllm_version 0.25.1 has no {key}")


def test_033_knobs_resolve_into_the_scheduler_config() -> None:
    sc = resolve(_cfg(max_num_active_seqs=8, prefill_schedule_interval=4)).scheduler_config
    assert (sc.max_num_active_reqs, sc.max_num_seqs, sc.prefill_schedule_interval) == (8, 256, 4)
    assert "cannot be greater than max_num_seqs (256)" in _error(max_num_active_seqs=300)


def test_hash_block_size_is_prefix_match_unit_under_033() -> None:
    assert _error(hash_block_size=16).startswith(
        "f.yaml: engine.hash_block_size: engine.vllm_version 0.33.0 names this key prefix_match_unit")
    assert _error(vllm_version="0.25.1", prefix_match_unit=16).startswith(
        "f.yaml: engine.prefix_match_unit: engine.vllm_version 0.25.1 names this key hash_block_size")
    # resolve_kv_cache_block_sizes: one KV-cache group -> only the block size itself
    assert "with a single KV cache group, prefix-cache hits land on the block size (16)" in _error(prefix_match_unit=8)
    assert resolve(_cfg(prefix_match_unit=16)).hash_block_size == 16
    # several groups: the hash block size, as hash_block_size was in 0.25.1
    groups = [{"kind": "full", "block_size": 32}, {"kind": "sliding_window", "block_size": 16, "sliding_window": 64}]
    new = resolve(_cfg(kv_cache_groups=groups, prefix_match_unit=16))
    old = resolve(_cfg(kv_cache_groups=groups, hash_block_size=16, vllm_version="0.25.1"))
    assert (new.block_size, new.hash_block_size) == (old.block_size, old.hash_block_size) == (32, 16)


def test_none_hash_seed_fixed_for_cryptographic_hashes_under_033() -> None:
    """0.33 ``resolve_none_hash_seed``: ``"vllm-none-hash"`` for sha256 / sha256_cbor without
    PYTHONHASHSEED; an explicit seed (PYTHONHASHSEED) wins; 0.25.1 keeps this project's 0."""
    assert resolve(_cfg(hash_algo="sha256")).hash_seed == "vllm-none-hash"
    assert resolve(_cfg(hash_algo="sha256", hash_seed=7)).hash_seed == 7
    assert resolve(_cfg(hash_algo="sha256", vllm_version="0.25.1")).hash_seed == 0
    assert resolve(_cfg(hash_algo="xxhash")).hash_seed == 0  # vLLM: random per process
    h = resolve(_cfg(hash_algo="sha256")).block_hasher()
    assert isinstance(h, ExactBlockHasher)
    assert h.none_hash == hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()


def test_eagle_resolves_to_lookahead_hashes_under_033_only() -> None:
    new, old = resolve(_cfg(use_eagle=True)), resolve(_cfg(use_eagle=True, vllm_version="0.25.1"))
    assert (new.num_hash_lookahead_tokens, new.cache_config.use_eagle, new.block_hasher().num_lookahead_tokens) == (
        1, False, 1)
    assert (old.num_hash_lookahead_tokens, old.cache_config.use_eagle) == (0, True)
    # VllmConfig.num_hash_lookahead_tokens is 0 without prefix caching: the block drop stays
    off = resolve(_cfg(use_eagle=True, enable_prefix_caching=False))
    assert (off.num_hash_lookahead_tokens, off.cache_config.use_eagle) == (0, True)
    assert "lookahead block hashes over kv_cache_groups are not modelled" in _error(use_eagle=True,
                                                                                   kv_cache_groups=GROUPS)


@pytest.mark.parametrize(("version", "cap"), [("0.25.1", 25), ("0.33.0", 41)])
def test_sliding_window_admission_cap_reserves_in_flight_tokens(version: str, cap: int) -> None:
    """0.33 ``SlidingWindowSpec.max_admission_blocks_per_request(max_in_flight_tokens)``: with async
    scheduling 2 x 256 tokens in flight: cdiv(127 + 512, 16) + 1 = 41 blocks; 0.25.1: cdiv(127 +
    256, 16) + 1 = 25."""
    cfg = _cfg(kv_cache_groups=GROUPS, max_num_batched_tokens=256, async_scheduling=True, vllm_version=version)
    swa = build_scheduler(cfg).kv_cache_manager.coordinator.single_type_managers[1]  # type: ignore[attr-defined]
    assert swa.max_admission_blocks == cap


def test_summary_line_follows_the_versions_semantics() -> None:
    s = {"num_requests": 2, "prompt_tokens": 100, "prefix_cache_hit_rate": 0.5, "vllm_version": "0.33.0",
         "prefix_cache": {"queries": 100, "preempted_queries": 40}}
    text = render(s, name="n", folder="f", wall_time_s=1.0)
    assert "vLLM 0.33.0 prefix_cache_hit_rate" in text
    assert "each admission: 100 prompt tokens of first admissions, 40 of re-admissions (preempted_*)" in text
    text = render({**s, "vllm_version": "0.25.1", "prefix_cache": {"queries": 300}}, name="n", folder="f",
                  wall_time_s=1.0)
    assert "vLLM 0.25.1 prefix_cache_hit_rate" in text and "every lookup: 300 tokens looked up for 100" in text


@pytest.mark.parametrize("extra", [
    {},  # the decode windows' refused lookups record nothing under 0.33 (repeat_lookup)
    {"num_gpu_blocks": 2600, "max_model_len": 40000},  # preemptions: re-admissions under preempted_*
    {"long_prefill_token_threshold": 256},  # 0.33's lone-request rule, read once per window
    {"use_eagle": True, "num_gpu_blocks": 2600, "max_model_len": 40000},  # lookahead hashes: plain steps
], ids=["plain", "preempting", "threshold", "eagle"])
def test_fast_forward_equals_plain_steps_under_033(extra: dict[str, Any]) -> None:
    from sim.experiment.run import replay_experiment

    results = []
    for ff in (True, False):
        cfg = config_from_dict({"name": "v", "workload": {"kind": "mooncake", "limit": 60,
                                                          "path": "workloads/data/mooncake_conversation_sample.jsonl"},
                                "engine": {"max_num_batched_tokens": 8192, **extra},
                                "replay": {"fast_forward": ff}}, base_dir=ROOT)
        results.append(replay_experiment(cfg, progress=False)[0])
    assert results[0].summary == results[1].summary
    assert results[0].summary["vllm_version"] == "0.33.0"


def test_long_prefill_threshold_above_max_model_len_refused_under_033_only() -> None:
    # vLLM 0.33.0 SchedulerConfig.verify_max_model_len raises for any threshold above max_model_len;
    # 0.25.1 only with max_num_partial_prefills > 1 (found by fuzz.py against both oracles)
    assert _error(long_prefill_token_threshold=5000) == (
        "f.yaml: engine.long_prefill_token_threshold: 5000 is greater than max_model_len 4096; "
        "vLLM 0.33.0 rejects this")
    assert resolve(_cfg(long_prefill_token_threshold=5000, vllm_version="0.25.1")).max_model_len == 4096
    assert resolve(_cfg(long_prefill_token_threshold=4096)).scheduler_config.long_prefill_token_threshold == 4096
