"""The resolved engine (sim.experiment.engine_description): one description, read by the scheduler,
the sweep rows and their bounds; a sliding-window or hybrid sweep point reports its own scheduler
block size, capacity and bounds, never ``engine.block_size``'s."""

from __future__ import annotations

import math

import pytest

from sim.core.kv_cache_spec import KVGroupSpec
from sim.experiment.config import ConfigError, config_from_dict, config_to_dict
from sim.experiment.engine_description import resolve
from sim.experiment.run import build_scheduler
from sim.experiment.sweep_point import compute_point
from sim.experiment.workload import build_workload
from workloads.bounds import belady_hit_rate, block_references, infinite_cache_hit_bound, lru_hit_rate

FULL32 = {"kind": "full", "block_size": 32}
SWA16 = {"kind": "sliding_window", "block_size": 16, "sliding_window": 128}
SWA32 = {"kind": "sliding_window", "block_size": 32, "sliding_window": 96}


def _data(**engine: object) -> dict:
    return {
        "name": "ed",
        "latency": {"kind": "fixed", "step_time_s": 0.01},
        "engine": {"max_model_len": 1024, "max_num_batched_tokens": 512, **engine},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 30, "num_prefixes": 3, "prefix_tokens": 272,
                     "suffix_tokens": 40, "output_tokens": 8, "rate": 50.0},
    }


def _row(data: dict) -> dict:
    cfg = config_from_dict(data)
    row, _ = compute_point({"key": "k", "config": config_to_dict(cfg), "bounds": True})
    assert row["status"] == "ok", row.get("error")
    return row


def test_one_full_group_numbers_are_the_configs():
    e = resolve(config_from_dict(_data(block_size=64, num_gpu_blocks=300)))
    assert (e.block_size, e.hash_block_size, e.num_gpu_blocks, e.max_model_len) == (64, 64, 300, 1024)
    assert e.capacity_tokens == 299 * 64 and not e.hybrid and e.single_full_group
    assert e.kv_groups == (KVGroupSpec("full", 64),) and e.cache_config.kv_groups == ()
    assert e.kv_pool_gib == pytest.approx(300 * 64 * 131072 / 2**30)  # llama-3-8b: 128 KiB of KV per token
    s = build_scheduler(e)
    assert s.cache_config is e.cache_config and s.hasher.block_size == 64


def test_hybrid_resolves_to_the_group_sizes():
    """Full 32 + SWA 16: scheduler block 32 (LCM), hashes of 16 (GCD); a 32-token prefix costs one
    full block and two SWA blocks, so 299 usable blocks hold 99 prefixes of 32 tokens."""
    e = resolve(config_from_dict(_data(kv_cache_groups=[FULL32, SWA16], num_gpu_blocks=300)))
    assert (e.block_size, e.hash_block_size, e.capacity_tokens) == (32, 16, 99 * 32)
    assert e.hybrid and not e.single_full_group and math.isnan(e.kv_pool_gib)
    assert e.block_hasher().block_size == 16


def test_pool_too_small_message_names_the_scheduler_block_size():
    cfg = config_from_dict(_data(kv_cache_groups=[FULL32, SWA16], max_model_len=2048, num_gpu_blocks=40))
    with pytest.raises(ConfigError, match="a pool of 40 blocks of 32 tokens cannot hold one max_model_len=2048"):
        resolve(cfg)


@pytest.mark.parametrize("groups, block_size, capacity", [
    ([FULL32, SWA16], 32, 99 * 32),  # hybrid: full + sliding window
    ([SWA32], 32, 299 * 32),  # pure sliding window
], ids=["hybrid", "sliding-window"])
def test_sweep_row_of_a_grouped_model_reports_its_own_engine(groups, block_size, capacity):
    """``engine.block_size`` stays 16 here; the row must say 32 (the groups'), the capacity of the
    pool at 32, and the infinite-cache bound at 32, which the replay stays under; Belady and the
    sequential LRU (single-pool models) do not apply and stay NaN."""
    data = _data(kv_cache_groups=groups, num_gpu_blocks=300)
    cfg = config_from_dict(data)
    assert cfg.engine.block_size == 16
    row = _row(data)
    assert (row["block_size"], row["num_gpu_blocks"], row["capacity_tokens"]) == (block_size, 300, capacity)
    bound = infinite_cache_hit_bound(build_workload(cfg).requests, block_size)
    assert row["infinite_cache_hit_rate"] == bound
    assert bound != infinite_cache_hit_bound(build_workload(cfg).requests, 16)  # the old, wrong block size
    assert 0 < row["request_hit_rate"] <= bound + 1e-12
    assert math.isnan(row["belady_hit_rate"]) and math.isnan(row["lru_sequential_hit_rate"])
    assert math.isnan(row["kv_pool_gib"])


def test_sweep_row_of_one_explicit_full_group_has_every_bound():
    """``kv_cache_groups: [full 32]`` is the single-pool model: Belady and LRU apply at 299 blocks."""
    data = _data(kv_cache_groups=[FULL32], num_gpu_blocks=300)
    row = _row(data)
    refs = block_references(build_workload(config_from_dict(data)).requests, 32)
    assert (row["block_size"], row["capacity_tokens"]) == (32, 299 * 32)
    assert row["belady_hit_rate"] == belady_hit_rate(refs, 299)
    assert row["lru_sequential_hit_rate"] == lru_hit_rate(refs, 299)
