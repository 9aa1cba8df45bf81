"""The whole replay with a CPU tier on the clock equals vLLM 0.33.0 with a one-step stub worker.

Issue 33's "done when": with a link fast enough that every transfer lands within a step
(``engine.offload_bandwidth_gb_s`` very large), ``apcsim``'s replay -- the SimPy loop, a fixed step
time, the link worker of ``sim.replay.kv_transfer`` -- gives every request the GPU hit, CPU hit,
preemptions, re-admission hits and steps waiting for KV that vLLM 0.33.0's own Scheduler and
OffloadingConnector gave it when its stub worker reported each transfer one step after the step
that carried it (``tests/fixtures/vllm_oracle_033/offload``, recorded by ``tools/vllm_oracle``;
``test_offload_agreement.py`` checks the same fixtures through the core's step driver). The
cases whose stub reported transfers later than one step have no link equivalent and are left to
that test. vLLM is not needed to run this test.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from sim.experiment.config import config_from_dict
from sim.experiment.run import replay_experiment

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_oracle_033" / "offload"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text())
ONE_STEP = [name for name, c in MANIFEST["cases"].items()
            if c.get("offload") is not None and c["offload"]["transfer_delay_steps"] == 1]


def _config(case: dict[str, Any], fast_forward: bool) -> Any:
    e, o = case["engine"], case["offload"]
    w = case.get("workload") or {}
    workload = ({"kind": "trace", "path": case["trace"]} if "trace" in case else
                {"kind": "mooncake", "path": w["path"], "tokens_per_id": w["tokens_per_id"],
                 "time_scale": w["time_scale"]})
    return config_from_dict({
        "name": "offload-agreement",
        "latency": {"kind": "fixed", "step_time_s": e["step_time"]},
        "engine": {
            "block_size": e["block_size"], "num_gpu_blocks": e["num_gpu_blocks"],
            "max_num_batched_tokens": e["max_num_batched_tokens"], "max_num_seqs": e["max_num_seqs"],
            "max_model_len": e["max_model_len"], "policy": e["policy"],
            "long_prefill_token_threshold": e["long_prefill_token_threshold"],
            "enable_chunked_prefill": e["enable_chunked_prefill"], "watermark": e["watermark"],
            "async_scheduling": e["async_scheduling"], "vllm_version": "0.33.0",
            "num_cpu_blocks": o["num_cpu_chunks"], "kv_offloading_policy": o["policy"],
            "kv_offloading_block_size": o["blocks_per_chunk"] * e["block_size"],
            "offload_prompt_only": o["offload_prompt_only"], "store_threshold": o["store_threshold"],
            "offload_bandwidth_gb_s": 1e9,  # 1e18 bytes/s: every transfer lands within its step
        },
        "workload": workload,
        "replay": {"fast_forward": fast_forward},
    }, base_dir=FIXTURES)


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize("name", ONE_STEP)
def test_the_replay_on_a_fast_link_matches_vllm(name: str, fast_forward: bool) -> None:
    case = MANIFEST["cases"][name]
    result, _ = replay_experiment(_config(case, fast_forward), progress=False)
    df = result.requests
    got = {
        str(r.request_id): (int(r.hit_tokens), int(r.external_hit_tokens), int(r.num_preemptions),
                            str(r.readmit_hit_tokens or ""), str(r.readmit_external_hit_tokens or ""),
                            int(r.kv_wait_steps))
        for r in df.itertuples()
    }
    with open(FIXTURES / case["expected_csv"], newline="") as f:
        expected = {
            row["id"]: (int(row["hit_tokens"]), int(row["external_hit_tokens"]), int(row["num_preemptions"]),
                        row["readmit_hit_tokens"], row["readmit_external_hit_tokens"], int(row["steps_waiting_for_kv"]))
            for row in csv.DictReader(f)
        }
    assert set(got) == set(expected)
    bad = {rid: {"vllm": expected[rid], "apcsim": got[rid]} for rid in expected if got[rid] != expected[rid]}
    assert not bad, f"{len(bad)} requests differ: {dict(list(bad.items())[:5])}"
    stats = json.loads((FIXTURES / case["expected_stats"]).read_text())
    assert result.summary["prompt_tokens_by_source"] == stats["prompt_tokens_by_source"]
    cpu = result.summary["cpu_tier"]
    assert (cpu["chunks_stored"], cpu["chunks_loaded"], cpu["chunks_evicted"], cpu["allocation_failures"]) == (
        stats["cpu_tier"]["stored_chunks"], stats["cpu_tier"]["loaded_chunks"], stats["cpu_tier"]["evicted_chunks"],
        stats["cpu_tier"]["allocation_failures"])
