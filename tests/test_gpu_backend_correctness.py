"""Issue #5's correctness suite on CPU: logits with prefix-cache reuse equal a dense recompute.

Every case drives the real sim ``Scheduler`` + ``BlockPool`` with a ``TorchExecutor`` (tiny
Llama-style model, fp32, reference paged attention, NaN-poisoned KV pool), checks the executor's
block tables against the KV manager after every step, and compares every logit vector the executor
computed with a plain causal forward over the whole sequence without any cache (tolerance 1e-5).
Each case also asserts that its scenario really happened (the hit, the preemption, ...). Two
negative controls must make the comparison fail.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("torch_one_thread")  # the `model` fixture is in conftest.py

from gpu_backend.executor.model import LlamaModel  # noqa: E402
from gpu_backend.layout.shapes import TINY  # noqa: E402
from gpu_backend.validation import cases, cases_long  # noqa: E402


def _check(r: cases.CaseResult) -> None:
    assert r.facts["ok_scenario"], f"scenario did not happen: {r.facts}"
    assert r.num_compared > 0
    assert r.max_abs_diff <= cases.FP32_TOL, r.summary()


def test_cold_prefill(model):
    r = cases.case_cold_prefill(model)
    _check(r)
    assert r.facts["hits"] == {"cold": 0}


def test_prefix_hit_through_scheduler(model):
    r = cases.case_prefix_hit(model)
    _check(r)
    assert r.facts["hits"]["b"] == 48  # 3 blocks of a finished request
    assert r.facts["hits"]["d"] == 32  # 2 blocks computed in the very step that admits d


def test_fully_cached_prompt_multiple_of_block_size(model):
    r = cases.case_full_block_multiple(model)
    _check(r)
    assert r.facts["hits"]["b"] == 48  # 64-token prompt, all 4 blocks cached: hit is k-1 = 3 blocks


def test_chunked_prefill_then_decode(model):
    r = cases.case_chunked_prefill_decode(model)
    _check(r)
    assert r.facts["b_partial_chunks"] >= 2 and r.facts["mixed_steps"] >= 2


def test_hit_after_preemption_and_eviction(model):
    r = cases.case_preemption_eviction(model)
    _check(r)
    assert r.facts["preemptions"] >= 1 and r.facts["evictions"] >= 1
    assert all(h > 0 for h in r.facts["resumed_hits"])


def test_two_salts_identical_tokens(model):
    r = cases.case_salts(model)
    _check(r)
    assert r.facts["hits"] == {"alice-1": 0, "bob-1": 0, "alice-2": 48}
    assert r.facts["salted_logits_close"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_mix(model, seed):
    _check(cases.case_random_mix(model, seed=seed))


@pytest.mark.parametrize("name", list(cases.NEGATIVE_CASES))
def test_negative_controls_make_the_comparison_fail(model, name):
    r = cases.NEGATIVE_CASES[name](model)
    assert r.facts["ok_scenario"], r.facts
    assert not r.passes(torch.float32)
    assert r.max_abs_diff > 1e3 * cases.FP32_TOL, r.summary()


def test_bf16_same_top_token_and_small_kl():
    m = LlamaModel(TINY, dtype=torch.bfloat16, device="cpu", seed=0)
    for fn in (cases.case_prefix_hit, cases.case_chunked_prefill_decode, cases.case_preemption_eviction):
        r = fn(m)
        assert r.facts["ok_scenario"]
        assert r.passes(torch.bfloat16), r.summary()
        assert r.max_kl <= cases.BF16_KL_BOUND and r.top1_mismatches == 0
    neg = cases.case_top_left_mask(m)
    assert not neg.passes(torch.bfloat16)


def test_long_context_reuse_equals_recompute():
    """A 32k-token prompt (2,048 blocks of 16) prefilled in 16 chunks, then a request that hits all
    2,048 blocks and decodes over them: its logits (and the first request's) equal one dense
    recompute of the longer sequence, fp32 1e-5, block tables checked after every step. The
    costliest CPU test (two 32k-token causal attentions: one paged, one dense), so it uses torch's
    default thread count."""
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, min(2, torch.get_num_interop_threads(), __import__("os").cpu_count() or 1)))
    try:
        m = LlamaModel(TINY, dtype=torch.float32, device="cpu", seed=0)
        r = cases_long.case_long_context(m, context=32768)
    finally:
        torch.set_num_threads(old)
    _check(r)
    assert r.facts["hit_blocks"] == 2048 and r.facts["a_chunks"] == 16
    assert r.facts["hits"] == {"a": 0, "b": 32768}
