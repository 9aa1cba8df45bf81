"""Differential agreement with vLLM 0.33.0 itself: ``test_vllm_agreement``'s comparison under the
0.33.0 profile (``engine.vllm_version: 0.33.0``), against the same traces and engine settings
replayed through vLLM 0.33.0's own ``Scheduler`` / ``AsyncScheduler`` (``tools/vllm_oracle``,
``make_agreement_fixtures.py --vllm-version 0.33.0``; fixtures in ``tests/fixtures/vllm_oracle_033``,
no KV connector). Exact equality of every request's hit tokens, preemptions and re-admission hits,
of the summed ``PrefixCacheStats`` (recorded once per admission in 0.33) and of the step count.
vLLM is not needed to run this test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_vllm_agreement import VARIANTS, _replay
from vllm_oracle_check import assert_matches_vllm

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_oracle_033"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
assert MANIFEST["vllm_version"] == "0.33.0"


def _params():
    for name in MANIFEST["cases"]:
        for algo, ff in VARIANTS.get(name, [("fast", True)]):
            yield pytest.param(name, algo, ff, id=f"{name}-{algo}-{'ff' if ff else 'noff'}")


@pytest.mark.parametrize(("name", "algo", "fast_forward"), list(_params()))
def test_matches_vllm_033(name: str, algo: str, fast_forward: bool) -> None:
    case = dict(MANIFEST["cases"][name])
    # the manifest's trace paths are relative to its own folder; _replay resolves against the 0.25.1 one
    case["trace"] = str((FIXTURES / case["trace"]).resolve())
    res = _replay(case, algo, fast_forward, "0.33.0")
    assert_matches_vllm(
        res, FIXTURES / case["expected_csv"], FIXTURES / case["expected_stats"], case["engine"]["async_scheduling"]
    )


KNOBS = Path(__file__).parent / "fixtures" / "vllm_oracle_033_knobs"
KNOB_CASES = json.loads((KNOBS / "manifest.json").read_text())["cases"]


@pytest.mark.parametrize("fast_forward", [True, False], ids=["ff", "noff"])
@pytest.mark.parametrize("name", list(KNOB_CASES))
def test_matches_vllm_033_with_knobs(name: str, fast_forward: bool) -> None:
    """vLLM 0.33.0's ``max_num_active_seqs`` and ``prefill_schedule_interval`` (the admission cap and
    the local prefill cadence, sim.core.prefill_cadence), and EAGLE's lookahead block hashes
    (sim.core.lookahead_hashing), against its own scheduler run with them
    (tests/fixtures/vllm_oracle_033_knobs/README.md)."""
    knob_case = KNOB_CASES[name]
    case = dict(MANIFEST["cases"][knob_case["base"]])
    case["trace"] = str((FIXTURES / case["trace"]).resolve())
    case["engine"] = {**case["engine"], **knob_case["knobs"]}
    res = _replay(case, "fast", fast_forward, "0.33.0")
    assert_matches_vllm(res, KNOBS / f"{name}.csv", KNOBS / f"{name}.stats.json", case["engine"]["async_scheduling"])


@pytest.mark.parametrize("fast_forward", [True, False], ids=["ff", "noff"])
@pytest.mark.parametrize(("version", "tag"), [("0.33.0", "033"), ("0.25.1", "0251")])
def test_long_prefill_threshold_rule_follows_each_version(version: str, tag: str, fast_forward: bool) -> None:
    """0.33.0 ``schedule``: ``long_prefill_token_threshold`` is 0 while one request is present;
    0.25.1 always applies it. Each profile equals its own version's scheduler on requests that
    mostly arrive alone (tests/fixtures/vllm_oracle_033_knobs/README.md)."""
    case = {"trace": str(KNOBS / "alone.jsonl"), "engine": {
        "block_size": 16, "num_gpu_blocks": 200, "max_model_len": 1024, "max_num_batched_tokens": 256,
        "max_num_seqs": 16, "policy": "fcfs", "long_prefill_token_threshold": 48, "enable_chunked_prefill": True,
        "watermark": 0.0, "async_scheduling": False, "step_time": 0.01}}
    res = _replay(case, "sha256", fast_forward, version)
    assert_matches_vllm(res, KNOBS / f"alone_{tag}.csv", KNOBS / f"alone_{tag}.stats.json", False)
