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
