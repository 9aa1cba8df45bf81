"""The apcsim engine of one vLLM 0.33.0 offload oracle fixture (``tests/fixtures/vllm_oracle_033``):
the fixture's ``engine`` knobs as a :class:`SchedulerConfig` under the 0.33.0 profile, and its
``offload`` section (absent: no tier) as the CPU tier's :class:`OffloadConfig`."""

from __future__ import annotations

from typing import Any

from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
from sim.core.hashing import BlockHasher
from sim.core.scheduler import Scheduler
from sim.core.version_profile import V0_33_0


def fixture_scheduler(case: dict[str, Any], hasher: BlockHasher, *, self_describing: bool = False) -> Scheduler:
    e, o = case["engine"], case.get("offload")
    offload = None if o is None else OffloadConfig(
        o["num_cpu_chunks"], o["blocks_per_chunk"], o["policy"], o["offload_prompt_only"], o["store_threshold"],
        self_describing_kv_events=self_describing,
    )
    return Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=e["max_num_batched_tokens"], max_num_seqs=e["max_num_seqs"],
            max_model_len=e["max_model_len"], enable_chunked_prefill=e["enable_chunked_prefill"],
            long_prefill_token_threshold=e["long_prefill_token_threshold"], policy=e["policy"],
            watermark=e["watermark"], async_scheduling=e["async_scheduling"], profile=V0_33_0,
        ),
        CacheConfig(block_size=e["block_size"], num_gpu_blocks=e["num_gpu_blocks"], offload=offload),
        hasher,
    )
