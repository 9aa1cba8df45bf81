"""Differential agreement with vLLM 0.25.1 on slices of the real public traces.

``tests/test_vllm_agreement.py`` holds hand-made traces; the cases here are the traffic users
bring: the WEKA coding-agent sessions (prompts of 10^4-10^5 tokens chunked over many steps,
salted tenants and LoRA adapters), RAGPulse (Zipf-popular passages, ``prompt_logprobs`` requests,
per-user salts) and Mooncake (conversation and synthetic). Each case's requests are built by
apcsim's own loader from ``../shared/traces/`` (the workload section and request limit in
``tests/fixtures/vllm_oracle/real/manifest.json``) and were replayed through vLLM 0.25.1's real
``Scheduler`` / ``AsyncScheduler`` + ``KVCacheManager`` by ``tools/vllm_oracle/real_traces.py
--fixtures`` on the same requests written as a canonical trace. Here apcsim replays them with the
same engine settings and a fixed step time, and every request's ``hit_tokens``,
``num_preemptions`` and ``readmit_hit_tokens``, the summed ``PrefixCacheStats`` and the step
count must equal vLLM's (async: apcsim may run one more step, its trailing flush).

A digest of the request stream is checked first, so a loader change that alters the requests
fails as such (regenerate the fixtures) rather than as an engine disagreement.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_oracle_check import assert_matches_vllm

from sim.core.request import token_array
from sim.experiment.config import config_from_dict
from sim.experiment.run import replay_experiment
from workloads.paths import shared_traces_dir
from workloads.registry import build_workload

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_oracle" / "real"
CONFIGS = Path(__file__).parents[1] / "configs"  # base folder of the workloads' relative paths
ENGINE_KEYS = (
    "block_size",
    "num_gpu_blocks",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "policy",
    "long_prefill_token_threshold",
    "enable_chunked_prefill",
    "watermark",
    "async_scheduling",
)
NO_FAST_FORWARD = {"ragpulse_bs16_async_tight", "mooncake_bs64_async_threshold_preempting"}

pytestmark = pytest.mark.skipif(not shared_traces_dir().is_dir(), reason="needs ../shared/traces")


def stream_digest(requests: Iterable[Any]) -> str:
    """sha256 over every request's id, arrival, prompt ids, output count and cache-relevant fields."""
    h = hashlib.sha256()
    for r in requests:
        outs = None if r.output_token_ids is None else np.asarray(r.output_token_ids, dtype=np.int64).tolist()
        h.update(
            json.dumps(
                [r.id, repr(r.arrival), r.output_tokens, outs, r.salt, r.lora, r.priority, r.prompt_logprobs]
            ).encode()
        )
        h.update(np.ascontiguousarray(token_array(r.tokens), dtype=np.int64).tobytes())
    return h.hexdigest()


def case_config(case: dict[str, Any], fast_forward: bool = True) -> Any:
    e = case["engine"]
    return config_from_dict(
        {
            "name": "vllm-agreement-real",
            "latency": {"kind": "fixed", "step_time_s": e["step_time"]},
            "engine": {k: e[k] for k in ENGINE_KEYS} | {"hash_algo": "fast", "hash_seed": 0, "vllm_version": "0.25.1"},
            "workload": {**case["workload"], "limit": case["limit"]},
            "replay": {"fast_forward": fast_forward},
        },
        base_dir=CONFIGS,
    )


def _manifest() -> dict[str, Any]:
    """The fixtures' manifest (read when the tests are collected, not when the generator imports
    this module's helpers)."""
    return json.loads((FIXTURES / "manifest.json").read_text())  # type: ignore[no-any-return]


def _params() -> Iterable[Any]:
    for name in _manifest()["cases"]:
        yield pytest.param(name, True, id=f"{name}-ff")
        if name in NO_FAST_FORWARD:
            yield pytest.param(name, False, id=f"{name}-noff")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # parametrized at collection (not at import: the fixture generator imports this module's helpers)
    if {"name", "fast_forward"} <= set(metafunc.fixturenames):
        metafunc.parametrize(("name", "fast_forward"), list(_params()))


def test_real_trace_matches_vllm(name: str, fast_forward: bool) -> None:
    case = _manifest()["cases"][name]
    cfg = case_config(case, fast_forward)
    if fast_forward:  # once per case: the stream is the one vLLM replayed
        wl = build_workload(cfg.workload, seed=cfg.seed, base_dir=CONFIGS)
        digest = stream_digest(itertools.islice(wl.requests, case["limit"]))
        assert digest == case["stream_sha256"], (
            f"{name}: the loader now builds other requests than the fixture's; regenerate it with "
            "tools/vllm_oracle/real_traces.py --fixtures"
        )
    res, _ = replay_experiment(cfg, progress=False)
    assert_matches_vllm(
        res, FIXTURES / f"{name}.csv", FIXTURES / f"{name}.stats.json", case["engine"]["async_scheduling"]
    )


def test_fixtures_cover_preemption_salts_and_async() -> None:
    """The real-trace cases exercise what the hand-made ones might miss at scale."""
    cases = _manifest()["cases"].values()
    assert {c["workload"]["kind"] for c in cases} >= {"agent_trace", "ragpulse", "mooncake"}
    assert any(c["engine"]["async_scheduling"] for c in cases) and not all(
        c["engine"]["async_scheduling"] for c in cases
    )
    assert sum(c["vllm"]["preemptions"] for c in cases) > 0
    assert any("tenants" in c["workload"] for c in cases)
