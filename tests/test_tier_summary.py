"""The human summary of a run with a CPU offload tier: a hit-rate line per tier (vLLM 0.33.0's
prompt_tokens_by_source), the two-tier references, and the tier's counters; nothing without one."""

from __future__ import annotations

from sim.cli.summary import render

BASE = {"num_requests": 10, "prompt_tokens": 10_000, "output_tokens": 500, "first_admission_token_hit_rate": 0.3,
        "prefix_cache_hit_rate": 0.3, "prefix_cache": {"queries": 10_000, "preempted_queries": 0},
        "vllm_version": "0.33.0"}
TIER = {
    "hit_rate_by_source": {"gpu": 0.3, "cpu": 0.2},
    "prompt_tokens_by_source": {"local_cache_hit": 3000, "external_kv_transfer": 2000, "local_compute": 5000},
    "external_prefix_cache": {"queries": 7000, "hits": 2000, "hit_rate": 2000 / 7000},
    "cpu_tier": {"num_chunks": 100, "chunks_stored": 400, "chunks_loaded": 125, "chunks_evicted": 300,
                 "allocation_failures": 2},
    "engine": {"num_gpu_blocks": 65, "block_size": 16, "capacity_tokens": 1024, "kv_pool_gib": 0.125,
               "model": "llama-3-8b", "gpu": "H100-SXM", "max_model_len": 4096,
               "cpu_tier": {"num_chunks": 100, "gib": 0.195, "policy": "arc", "link_gb_s": 55.0}},
    "two_tier_infinite_hit_rate": 0.6, "two_tier_infinite_gpu_hit_rate": 0.55, "two_tier_infinite_cpu_hit_rate": 0.05,
}


def _lines(s: dict) -> list[str]:
    return render(s, name="t", folder="out", wall_time_s=1.0).splitlines()


def test_a_tiered_run_has_a_line_per_tier_and_the_tier_counters() -> None:
    lines = _lines({**BASE, **TIER})
    gpu = next(line for line in lines if "GPU prefix cache (local_cache_hit)" in line)
    cpu = next(line for line in lines if "CPU tier (external_kv_transfer)" in line)
    assert "0.300 " in gpu and "3,000 tokens" in gpu
    assert "0.200 " in cpu and "2,000 tokens loaded" in cpu and "0.286 of the 7,000 tokens the GPU missed" in cpu
    ref = next(line for line in lines if "two tiers, infinite" in line)
    assert "0.600 " in ref and "GPU 0.550 + CPU 0.0500" in ref
    tier = next(line for line in lines if line.startswith("cpu tier"))
    assert tier == ("cpu tier    100 chunks (0.195 GiB, ARC, link 55.0 GB/s per direction): 400 stored, 125 loaded, "
                    "300 evicted, 2 allocation failures")
    # engine.offload_link_duplex: false -- one lane that loads and stores share
    shared = {**TIER, "engine": {**TIER["engine"], "cpu_tier": {**TIER["engine"]["cpu_tier"], "link_duplex": False}}}
    tier = next(line for line in _lines({**BASE, **shared}) if line.startswith("cpu tier"))
    assert "(0.195 GiB, ARC, link 55.0 GB/s shared by loads and stores): 400 stored" in tier


def test_an_untiered_run_has_no_tier_lines() -> None:
    text = "\n".join(_lines(BASE))
    assert "by tier" not in text and "cpu tier" not in text
