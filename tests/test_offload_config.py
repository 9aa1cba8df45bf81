"""The CPU offload tier's engine keys (``sim.experiment.offload_tier``), as an executable spec:
vLLM 0.33.0's chunk count from GiB, the link bandwidth, and one clear line for every bad input."""

from __future__ import annotations

import pytest

from sim.core.config import OffloadConfig
from sim.experiment.config import ConfigError, config_from_dict
from sim.experiment.engine_description import resolve
from sim.experiment.offload_tier import PAGE_ALIGNMENT, num_cpu_chunks, round_up


def _cfg(**engine: object) -> dict[str, object]:
    return {"name": "t", "model": "llama-3-8b", "gpu": "H100-SXM",
            "engine": {"block_size": 16, "num_gpu_blocks": 9000, "max_model_len": 4096, **engine},
            "latency": {"kind": "fixed"},
            "workload": {"kind": "chat"}}


def _resolve(**engine: object):  # type: ignore[no-untyped-def]
    return resolve(config_from_dict(_cfg(**engine), "t.yaml"))


def test_no_tier_keys_means_no_tier_and_an_unchanged_resolved_config() -> None:
    d = _resolve()
    assert d.offload is None and d.cache_config.offload is None
    dumped = config_from_dict(_cfg(), "t.yaml").model_dump(mode="json")["engine"]
    assert not {"kv_offloading_size", "num_cpu_blocks", "kv_offloading_policy", "store_threshold"} & set(dumped)


def test_gib_to_chunks_follows_vllm_cpu_offloading_spec() -> None:
    # Llama-3-8B bf16, 16-token blocks: 32 layers * 2 * 16 * 8 heads * 128 * 2 B = 2 MiB per block,
    # so 80 GiB hold 40,960 chunks (vllm-033-offload.md 2.2's example)
    d = _resolve(kv_offloading_size=80)
    assert d.kv_bytes_per_block == 2 * 2**20
    assert d.offload == OffloadConfig(num_cpu_chunks=40960)
    # four blocks per chunk: a quarter of the chunks
    assert _resolve(kv_offloading_size=80, kv_offloading_block_size=64).offload == OffloadConfig(10240, 4)


def test_chunk_bytes_are_rounded_up_to_the_page() -> None:
    # a chunk of 5000 bytes occupies 8192 (round_up to 4096, SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT)
    assert round_up(5000, PAGE_ALIGNMENT) == 8192
    assert num_cpu_chunks(1.0, 5000, 1) == 2**30 // 8192
    assert num_cpu_chunks(1.0, 4096, 1) == 2**30 // 4096


def test_direct_chunk_count_and_policy_knobs() -> None:
    d = _resolve(num_cpu_blocks=40000, kv_offloading_policy="arc", offload_prompt_only=False, store_threshold=2)
    assert d.offload == OffloadConfig(40000, 1, "arc", False, 2)


def test_link_bandwidth_defaults_to_the_gpu_spec_and_can_be_overridden() -> None:
    assert _resolve(num_cpu_blocks=10).offload_bandwidth_gb_s == 55.0  # H100 SXM: PCIe Gen5 x16
    assert _resolve(num_cpu_blocks=10, offload_bandwidth_gb_s=1e6).offload_bandwidth_gb_s == 1e6


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"kv_offloading_size": 0}, "engine.kv_offloading_size: 0.0 GiB: vLLM rejects a CPU offload size"),
        ({"kv_offloading_size": -1}, "engine.kv_offloading_size: -1.0 GiB: vLLM rejects"),
        ({"kv_offloading_size": 10, "num_cpu_blocks": 5}, "set kv_offloading_size (GiB) or num_cpu_blocks"),
        ({"num_cpu_blocks": 5, "kv_offloading_policy": "fifo"}, "engine.kv_offloading_policy: Input should be"),
        ({"num_cpu_blocks": 5, "kv_offloading_block_size": 24}, "24 tokens is not a multiple of the block size 16"),
        ({"num_cpu_blocks": 5, "enable_prefix_caching": False}, "CPU offload needs prefix caching"),
        ({"store_threshold": 2}, "store_threshold needs a CPU offload tier"),
        ({"num_cpu_blocks": 0}, "engine.num_cpu_blocks: Input should be greater than 0"),
        ({"num_cpu_blocks": 5, "vllm_version": "0.25.1"}, "engine.vllm_version 0.25.1 has none (use 0.33.0)"),
    ],
)
def test_bad_tier_keys_are_one_clear_line(engine: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(_cfg(**engine), "t.yaml")
    text = str(err.value)
    assert message in text and text.startswith("t.yaml: ") and "\n" not in text


def test_a_tier_smaller_than_one_chunk_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"engine.kv_offloading_size: 0.001 GiB holds no chunk of 16 tokens"):
        _resolve(kv_offloading_size=0.001)
