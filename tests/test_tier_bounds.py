"""Two-tier offline references (workloads.tier_bounds): golden hand-built streams with exact hit
tokens by source under vLLM 0.33.0's CPU offload rules (lookup from the GPU boundary, the offer, LRU
ranks and ARC's lists), properties against the single-tier references, and the summary wiring."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sweep_bounds import _random_trace

from sim.core.config import OffloadConfig
from sim.experiment.bounds import reference_hit_rates
from sim.experiment.config import config_from_dict
from sim.experiment.engine_description import resolve
from workloads.bounds import BlockReferences, block_references, lru_hit_rate
from workloads.tier_bounds import TierHits, tier_references, two_tier_infinite, two_tier_sequential
from workloads.trace_format import TraceRequest


def _refs(prompts: list[list[int]], bs: int, *, outputs: dict[int, list[int]] | None = None,
          logprobs: frozenset[int] = frozenset()) -> BlockReferences:
    outs = outputs or {}
    return block_references([
        TraceRequest(id=f"r{i}", arrival=float(i), tokens=np.asarray(p, dtype=np.int64),
                     output_tokens=len(outs[i]) if i in outs else 1,
                     output_token_ids=np.asarray(outs[i], dtype=np.int64) if i in outs else None,
                     prompt_logprobs=i in logprobs)
        for i, p in enumerate(prompts)], bs)


def _by_source(h: TierHits) -> tuple[list[int], list[int]]:
    return h.gpu.tolist(), h.cpu.tolist()


def _seq(n: int, base: int) -> list[int]:
    return list(range(base, base + n))


A, B, S = _seq(17, 0), _seq(9, 100), _seq(5, 200)  # block 4: A has 4 full blocks, B 2, S 1


def test_repeated_32_token_prompt_gets_gpu_16_and_cpu_16():
    """vllm-033-offload.md 4.2 [run]: the GPU hit stops one token short (num_tokens - 1), the CPU
    lookup is capped at num_tokens, so the last block is loaded although it is in the GPU cache."""
    refs = _refs([_seq(32, 0), _seq(32, 0)], 16)
    assert _by_source(two_tier_infinite(refs)) == ([0, 16], [0, 16])
    assert _by_source(two_tier_sequential(refs, 10, 10)) == ([0, 16], [0, 16])
    assert two_tier_infinite(refs).rate() == 32 / 64


def test_a_scan_evicts_the_gpu_but_stays_in_cpu():
    refs = _refs([A, B, _seq(17, 300), A], 4)  # GPU of 4 blocks: the third request evicts A's
    h = two_tier_sequential(refs, 4, 20)
    assert _by_source(h) == ([0, 0, 0, 0], [0, 0, 0, 16])
    assert lru_hit_rate(refs, 4) == 0.0
    assert (h.stored, h.evicted, h.allocation_failures, h.reused) == (10, 0, 0, 4)


def test_lru_order_tail_first_and_loaded_chunks_kept_over_older_ones():
    """CPU of 5 chunks, no GPU: A's tail chunk goes first; A's reload lifts its loaded chunks above
    B's (request rank), so storing A's missing chunk evicts B's tail, not a chunk A just loaded."""
    refs = _refs([A, B, A, B], 4)
    h = two_tier_sequential(refs, 0, 5)
    assert _by_source(h) == ([0, 0, 0, 0], [0, 0, 12, 4])
    assert (h.stored, h.evicted, h.allocation_failures) == (8, 3, 0)


def test_arc_evicts_from_t1_and_promotes_reused_chunks():
    """The same stream under ARC: B's store evicts a3 to B1; A's reload hits the ghost (target_t1 =
    1), its store of a3 evicts T1's LRU a2 (a chunk it loaded), a0 and a1 move to T2; B keeps both."""
    refs = _refs([A, B, A, B], 4)
    h = two_tier_sequential(refs, 0, 5, policy="arc")
    assert _by_source(h) == ([0, 0, 0, 0], [0, 0, 12, 8])
    assert (h.stored, h.evicted, h.allocation_failures) == (7, 2, 0)
    # then C: T1 = [a3] >= int(target_t1) = 1 gives a3, then T2's LRU a1 (promoted by A's reload);
    # A finds a0 in T2 only; its offer of a1..a3 hits the ghosts (target_t1 1 -> 2 -> 3 -> 1) and
    # evicts c1, c0 from T1 and then a0, the chunk it loaded, from T2
    h = two_tier_sequential(_refs([A, B, A, B, _seq(9, 400), A], 4), 0, 5, policy="arc")
    assert _by_source(h) == ([0] * 6, [0, 0, 12, 8, 0, 4])
    assert (h.stored, h.evicted, h.allocation_failures) == (12, 7, 0)


def test_arc_keeps_reused_chunks_through_a_scan_and_adapts_on_ghost_hits():
    """vllm-033-offload.md 6.3 scan_reuse: H reused once lives in T2 and survives a scan that LRU
    does not; a scan chunk offered again from B1 raises target_t1 to 2, so T2's LRU (h1) goes."""
    h, s1, s2, s3 = _seq(9, 500), _seq(9, 600), _seq(9, 700), _seq(9, 800)
    refs = _refs([h, h, s1, s2, s3, h], 4)
    assert two_tier_sequential(refs, 0, 4, policy="arc").cpu.tolist() == [0, 8, 0, 0, 0, 8]
    assert two_tier_sequential(refs, 0, 4, policy="lru").cpu.tolist() == [0, 8, 0, 0, 0, 0]
    refs = _refs([h, h, s1, s2, s3, s1, h], 4)
    assert two_tier_sequential(refs, 0, 4, policy="arc").cpu.tolist() == [0, 8, 0, 0, 0, 0, 4]


def test_chunks_of_two_blocks():
    # A: 4 blocks = 2 chunks. With a GPU of 1 block the reload hits block 0 on GPU, and the CPU run
    # starts at chunk 0 (re-covering it): 3 blocks from CPU
    refs = _refs([A, A], 4)
    assert _by_source(two_tier_sequential(refs, 1, 10, 2)) == ([0, 4], [0, 12])
    assert _by_source(two_tier_sequential(refs, 0, 10, 2)) == ([0, 0], [0, 16])
    # a 16-token prompt: GPU 3 blocks (num_tokens - 1), the CPU would add 1 block < one chunk: 0
    refs = _refs([_seq(16, 0), _seq(16, 0)], 4)
    assert _by_source(two_tier_infinite(refs, 2)) == ([0, 12], [0, 0])
    assert _by_source(two_tier_infinite(refs, 1)) == ([0, 12], [0, 4])
    # a GPU of 3 blocks: the reload hits 3 GPU blocks, the CPU run covers chunk 1 only (block 3):
    # 1 block past the GPU boundary is under one chunk, so 0
    refs = _refs([A, _seq(25, 0)], 4)
    assert _by_source(two_tier_sequential(refs, 3, 10, 2)) == ([0, 12], [0, 0])
    assert _by_source(two_tier_sequential(refs, 3, 10, 1)) == ([0, 12], [0, 4])
    # 5 blocks: the trailing block is no chunk and never stored
    refs = _refs([_seq(21, 0), _seq(21, 0)], 4)
    assert _by_source(two_tier_sequential(refs, 0, 10, 2)) == ([0, 0], [0, 16])


def test_cpu_tier_of_one_chunk():
    """A 2-chunk offer never fits one chunk (an allocation failure: nothing stored); a 1-chunk one does."""
    refs = _refs([A[:9], S, S, A[:9]], 4)
    h = two_tier_sequential(refs, 0, 1)
    assert _by_source(h) == ([0, 0, 0, 0], [0, 0, 4, 0])
    assert (h.stored, h.evicted, h.allocation_failures) == (1, 0, 2)


def test_gpu_hit_chunks_are_offered_without_a_cpu_hit():
    """A GPU of 6 blocks keeps A: its third request hits 4 GPU blocks and no CPU chunk, so all of A's
    chunks are offered again and become most recent; C's store then evicts B's chunks. A GPU of 4
    blocks keeps half of A: a CPU hit, so only the loaded chunks are touched, C evicts a0 and a1,
    and B's chunks survive."""
    refs = _refs([A, B, A, _seq(9, 400), B], 4)
    h = two_tier_sequential(refs, 6, 6)
    assert _by_source(h) == ([0, 0, 16, 0, 0], [0, 0, 0, 0, 0])
    assert h.reused == 4
    assert _by_source(two_tier_sequential(refs, 4, 6)) == ([0, 0, 8, 0, 0], [0, 0, 8, 0, 8])


def test_prompt_logprobs_reads_neither_tier_but_stores():
    refs = _refs([A, A, A], 4, logprobs=frozenset({0, 1}))
    assert _by_source(two_tier_sequential(refs, 0, 10)) == ([0, 0, 0], [0, 0, 16])
    assert _by_source(two_tier_infinite(refs)) == ([0, 0, 16], [0, 0, 0])


def test_store_threshold_stores_on_the_second_offer():
    refs = _refs([A, A, A], 4)
    h = two_tier_sequential(refs, 0, 10, store_threshold=2)
    assert h.cpu.tolist() == [0, 0, 16] and h.stored == 4


def test_offload_prompt_only_off_stores_output_chunks_the_trace_gives():
    # A: prompt 8 tokens, outputs 5 given: blocks cached = prompt + 4 outputs = 3 blocks
    prompt, outs = _seq(8, 0), _seq(5, 50)
    refs = _refs([prompt, prompt + outs[:4] + [7]], 4, outputs={0: outs})
    assert two_tier_sequential(refs, 0, 10).cpu.tolist() == [0, 8]
    assert two_tier_sequential(refs, 0, 10, prompt_only=False).cpu.tolist() == [0, 12]
    assert two_tier_infinite(refs, prompt_only=False).gpu.tolist() == [0, 12]


def test_bad_arguments():
    refs = _refs([A], 4)
    with pytest.raises(ValueError, match="at least one chunk"):
        two_tier_sequential(refs, 4, 0)
    with pytest.raises(ValueError, match="blocks_per_chunk"):
        two_tier_infinite(refs, 0)
    with pytest.raises(ValueError, match="block_references"):
        two_tier_infinite(BlockReferences(4, refs.ids, refs.start, refs.length, refs.lookup, 17))


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), bs=st.integers(1, 4), cap=st.integers(0, 40),
       cpu=st.integers(1, 40), bpc=st.integers(1, 3), policy=st.sampled_from(["lru", "arc"]),
       outputs=st.booleans(), prompt_only=st.booleans())
def test_gpu_part_is_the_single_tier_lru_and_the_total_is_at_least_it(seed, n, bs, cap, cpu, bpc, policy, outputs,
                                                                     prompt_only):
    refs = block_references(_random_trace(seed, n, salts=True, outputs=outputs), bs)
    h = two_tier_sequential(refs, cap, cpu, bpc, policy=policy, prompt_only=prompt_only)
    assert h.rate("gpu") == lru_hit_rate(refs, cap) == lru_hit_rate(refs, cap, compiled=False)
    assert h.rate() >= lru_hit_rate(refs, cap)
    prompts = np.asarray([t.tokens.size for t in _random_trace(seed, n, salts=True, outputs=outputs)])
    assert (h.gpu + h.cpu <= prompts).all()


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), bs=st.integers(1, 4), cap=st.integers(0, 40),
       cpu=st.integers(1, 40), policy=st.sampled_from(["lru", "arc"]), outputs=st.booleans(),
       threshold=st.sampled_from([0, 2]))
def test_one_block_chunks_stay_under_the_infinite_two_tier(seed, n, bs, cap, cpu, policy, outputs, threshold):
    refs = block_references(_random_trace(seed, n, salts=True, outputs=outputs), bs)
    inf = two_tier_infinite(refs)
    h = two_tier_sequential(refs, cap, cpu, policy=policy, store_threshold=threshold)
    assert (h.gpu + h.cpu <= inf.gpu + inf.cpu).all()  # request by request
    assert (h.gpu <= inf.gpu).all()
    one = two_tier_sequential(refs, cap, 1, policy=policy)  # one chunk: at most one block per request
    assert (one.cpu <= bs).all() and one.rate() <= lru_hit_rate(refs, cap) + refs.num_requests * bs / refs.prompt_tokens


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), bs=st.integers(1, 4), outputs=st.booleans(),
       policy=st.sampled_from(["lru", "arc"]))
def test_unbounded_tiers_equal_the_infinite_two_tier(seed, n, bs, outputs, policy):
    refs = block_references(_random_trace(seed, n, salts=True, outputs=outputs), bs)
    big = two_tier_sequential(refs, refs.num_references + 1, refs.num_references + 1, policy=policy)
    assert _by_source(big) == _by_source(two_tier_infinite(refs))


def _cfg(**engine: object) -> dict[str, object]:
    return {"name": "t", "model": "llama-3-8b", "gpu": "H100-SXM",
            "engine": {"block_size": 16, "num_gpu_blocks": 600, "max_model_len": 4096, **engine},
            "latency": {"kind": "fixed"}, "workload": {"kind": "chat", "limit": 40}}


def test_summary_keys_only_with_a_tier():
    plain = reference_hit_rates(*_resolved())
    assert not any(k.startswith("two_tier") for k in plain)
    tiered = reference_hit_rates(*_resolved(num_cpu_blocks=200))
    assert {k: plain[k] for k in plain} == {k: tiered[k] for k in plain}
    assert set(tiered) - set(plain) == {f"two_tier_{m}{p}_hit_rate" for m in ("infinite", "lru_sequential")
                                        for p in ("", "_gpu", "_cpu")}
    assert tiered["two_tier_lru_sequential_gpu_hit_rate"] == plain["lru_sequential_hit_rate"]
    assert tiered["two_tier_infinite_gpu_hit_rate"] == plain["infinite_cache_hit_rate"]
    arc = reference_hit_rates(*_resolved(num_cpu_blocks=200, kv_offloading_policy="arc"))
    assert "two_tier_arc_sequential_cpu_hit_rate" in arc


def _resolved(**engine: object):  # type: ignore[no-untyped-def]
    cfg = config_from_dict(_cfg(**engine), "t.yaml")
    return cfg, resolve(cfg)


def test_tier_references_nan_without_a_pool_model():
    refs = _refs([A, A], 4)
    out = tier_references(refs, None, OffloadConfig(num_cpu_chunks=4))
    assert math.isnan(out["two_tier_lru_sequential_hit_rate"]) and out["two_tier_infinite_cpu_hit_rate"] == 0.0


_VENV033 = Path(__file__).resolve().parents[1] / "tools" / "vllm_oracle" / "venv033" / "bin" / "python"


@pytest.mark.skipif(not _VENV033.exists(), reason="the vLLM 0.33.0 oracle venv is not set up")
def test_cpu_hits_and_store_counts_equal_vllm_cpu_offloading_manager(tmp_path):
    """60 random streams and tiers (both policies, chunks of 1-3 blocks, thresholds, prompt-only
    on and off) replayed on vLLM 0.33.0's own CPUOffloadingManager give the same CPU hits per
    request and the same stored, evicted, failed and reused counts."""
    rng = np.random.default_rng(7)
    cases, expected = {}, {}
    for i in range(60):
        refs = block_references(_random_trace(int(rng.integers(10_000)), int(rng.integers(1, 60)), salts=True,
                                              outputs=bool(rng.random() < 0.5)), int(rng.integers(1, 5)))
        kw = {"gpu_capacity": int(rng.integers(0, 30)), "cpu_chunks": int(rng.integers(1, 30)),
              "blocks_per_chunk": int(rng.integers(1, 4)), "policy": str(rng.choice(["lru", "arc"])),
              "prompt_only": bool(rng.random() < 0.7), "store_threshold": int(rng.choice([0, 0, 2, 3]))}
        h = two_tier_sequential(refs, **kw)
        cases[f"c{i}"] = {"kw": kw, "bs": refs.block_size}
        expected[f"c{i}"] = {"cpu": h.cpu.tolist(), "counts": [h.stored, h.evicted, h.allocation_failures, h.reused]}
        np.savez(tmp_path / f"c{i}.npz", ids=refs.ids, start=refs.start, length=refs.length,
                 pb=refs.prompt_blocks, reads=refs.reads_cache, gpu=h.gpu)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    driver = Path(__file__).with_name("tier_bounds_vllm_driver.py")
    out = subprocess.run([str(_VENV033), str(driver), str(tmp_path)], capture_output=True, text=True, check=True,
                         timeout=600)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == expected
