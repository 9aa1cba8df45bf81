"""The CPU tier's KV events in a replay: decode windows (``sim.replay.tier_window``) leave the
recorded stream -- both media, their steps and order -- as the step-by-step loop makes it."""

from __future__ import annotations

from typing import Any

import pytest

from sim.core.kv_events import MEDIUM_CPU, event_to_dict
from sim.experiment.config import config_from_dict
from sim.experiment.run import replay_experiment


def _cfg(fast_forward: bool, **engine: Any) -> Any:
    return config_from_dict({
        "name": "tier_events", "seed": 5, "model": "llama-3-8b", "gpu": "H100-SXM",
        "engine": {"block_size": 16, "num_gpu_blocks": 500, "max_model_len": 4096, "num_cpu_blocks": 800,
                   "max_num_batched_tokens": 2048, **engine},
        "latency": {"kind": "roofline"},
        "workload": {"kind": "chat", "sessions": 25, "turns": {"dist": "geometric", "mean": 4, "max": 8},
                     "system_prompt_tokens": 600, "max_context_tokens": 4000,
                     "user_tokens": {"dist": "lognormal", "median": 120, "sigma": 1.0, "min": 1, "max": 800},
                     "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "min": 1, "max": 300},
                     "think_time": {"dist": "exponential", "mean": 20},
                     "arrival": {"kind": "gamma", "rate": 2.0, "cv": 2.0}},
        "replay": {"fast_forward": fast_forward, "record_events": True},
    }, "tier_events.yaml")


def _stream(result: Any) -> list[dict[str, Any]]:
    out = []
    for step, ev in result.events:
        d = event_to_dict(ev)
        if "token_ids" in d:
            d["token_ids"] = list(d["token_ids"])
        out.append({"step": step, **d})
    return out


ARC_CHUNKS = {"kv_offloading_policy": "arc", "kv_offloading_block_size": 32, "num_cpu_blocks": 400}


@pytest.mark.parametrize("engine", [{}, ARC_CHUNKS])
def test_windows_keep_the_event_stream_of_the_plain_loop(engine: dict[str, Any]) -> None:
    plain, _ = replay_experiment(_cfg(False, **engine), progress=False)
    fast, _ = replay_experiment(_cfg(True, **engine), progress=False)
    stream = _stream(plain)
    kinds = {(d["type"], d.get("medium")) for d in stream}
    assert {("BlockStored", MEDIUM_CPU), ("BlockRemoved", MEDIUM_CPU)} <= kinds  # stores and evictions
    assert _stream(fast) == stream
