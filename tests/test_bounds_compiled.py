"""The compiled policy loops of the offline references (workloads.bounds_scan) against their oracle,
the Python loops of workloads.bounds: equal hit rates, next-lookup positions and dense block ids on
random streams and on the Mooncake stream the sweep benchmark replays, at several capacities; the
compiled reference pass (bounds_scan.stream_ids: keys made in C from token runs) equal to the
engine hasher's keys block for block, up to the numbering of ids; the one-pass policies equal to the
three loops; and a sweep worker's shared stream equal to a fresh build."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sweep_bounds import _random_trace

from workloads import bounds
from workloads.bounds import belady_hit_rate, block_references, infinite_hit_rate, lru_hit_rate

pytestmark = pytest.mark.skipif(bounds._scan is None, reason="workloads.bounds_scan is not built")


def _both(refs: bounds.BlockReferences, cap: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    fast = (infinite_hit_rate(refs), belady_hit_rate(refs, cap), lru_hit_rate(refs, cap))
    slow = (infinite_hit_rate(refs, compiled=False), belady_hit_rate(refs, cap, compiled=False),
            lru_hit_rate(refs, cap, compiled=False))
    return fast, slow


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 60), bs=st.integers(1, 4), cap=st.integers(0, 60),
       salts=st.booleans(), outputs=st.booleans())
def test_compiled_loops_equal_the_python_loops(seed, n, bs, cap, salts, outputs):
    refs = block_references(_random_trace(seed, n, salts=salts, outputs=outputs), bs)
    assert refs.next_lookup().tolist() == refs.next_lookup(compiled=False).tolist()
    fast, slow = _both(refs, cap)
    assert fast == slow  # exactly: the same hit counts


def _first_seen(ids: np.ndarray) -> list[int]:
    """``ids`` renumbered by first appearance (the numbering of the compiled pass)."""
    seen: dict[int, int] = {}
    return [seen.setdefault(int(b), len(seen)) for b in ids]


def _assert_same_references(requests, bs: int, include_outputs: bool = True) -> bounds.BlockReferences:
    fast = block_references(requests, bs, include_outputs=include_outputs)
    slow = block_references(requests, bs, include_outputs=include_outputs, compiled=False)
    assert fast.ids.tolist() == _first_seen(slow.ids)  # the same equality of blocks, position by position
    for name in ("start", "length", "lookup", "prompt_blocks", "reads_cache"):
        assert getattr(fast, name).tolist() == getattr(slow, name).tolist(), name
    assert fast.prompt_tokens == slow.prompt_tokens
    return fast


def _run_trace(seed: int, n: int, *, salts: bool, outputs: bool) -> list:
    """Requests whose prompts are RunTokens: shared runs of consecutive ids cut at random places,
    explicit ids in between, some continuing the run before them (consecutive across a cut)."""
    from workloads.tokens import RunTokens
    from workloads.trace_format import TraceRequest

    rng = np.random.default_rng(seed)
    pieces = [(int(rng.integers(0, 40)), int(rng.integers(1, 12))) for _ in range(5)]
    reqs = []
    for i in range(n):
        parts: list = []
        for _ in range(int(rng.integers(1, 5))):
            start, length = pieces[int(rng.integers(len(pieces)))]
            roll = rng.random()
            if roll < 0.5:
                parts.append((start, length))
            elif roll < 0.75:  # the same ids, written out
                parts.append(list(range(start, start + length)))
            else:  # a run continued by explicit ids, or random ids
                parts.append([start + length + k for k in range(int(rng.integers(1, 4)))] if rng.random() < 0.5
                             else rng.integers(0, 50, size=int(rng.integers(1, 6))).tolist())
        out_n = int(rng.integers(1, 6))
        tokens = RunTokens.of(*parts)
        if rng.random() < 0.5:  # the same ids as runs cut where the parts meet (RunTokens.of merges them)
            cut = [(p[0], p[1]) if isinstance(p, tuple) else (int(t), 1) for p in parts for t in
                   ([None] if isinstance(p, tuple) else p)]
            tokens = RunTokens(np.array([c[0] for c in cut]), np.array([c[1] for c in cut]))
        reqs.append(TraceRequest(
            id=f"r{i}", arrival=float(i), tokens=tokens, output_tokens=out_n,
            output_token_ids=(rng.integers(0, 50, size=out_n).astype(np.int64)
                              if outputs and rng.random() < 0.5 else None),
            salt=(f"s{int(rng.integers(2))}" if salts and rng.random() < 0.5 else None),
            lora=("a" if salts and rng.random() < 0.2 else None),
            prompt_logprobs=bool(rng.random() < 0.1),
        ))
    return reqs


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(0, 50), bs=st.integers(1, 8), cap=st.integers(0, 60),
       salts=st.booleans(), outputs=st.booleans(), runs=st.booleans(), include_outputs=st.booleans())
def test_compiled_reference_pass_equals_the_engine_hasher(seed, n, bs, cap, salts, outputs, runs, include_outputs):
    reqs = (_run_trace if runs else _random_trace)(seed, n, salts=salts, outputs=outputs)
    fast = _assert_same_references(reqs, bs, include_outputs)
    slow = block_references(reqs, bs, include_outputs=include_outputs, compiled=False)
    one_pass = bounds.offline_bounds(fast, cap)
    assert one_pass == {"infinite_cache_hit_rate": infinite_hit_rate(slow, compiled=False),
                        "belady_hit_rate": belady_hit_rate(slow, cap, compiled=False),
                        "lru_sequential_hit_rate": lru_hit_rate(slow, cap, compiled=False)}


def test_dense_ids_are_the_byte_order_ranks():
    """_dense_ids gives np.unique's inverse, also when keys share their first 8 bytes."""
    rng = np.random.default_rng(1)
    halves = rng.integers(0, 2**63, size=(500, 2), dtype=np.int64).astype(">u8")
    halves[250:, 0] = halves[:250, 0]  # 250 pairs with one first half, different second halves
    keys = np.frombuffer(halves.tobytes(), dtype="S16")
    raw = keys[rng.integers(0, keys.size, size=3000)]
    for sample in (raw, raw[np.isin(raw, keys[:250])]):  # both sort paths
        _, inverse = np.unique(sample, return_inverse=True)
        assert bounds._dense_ids(sample).tolist() == inverse.ravel().tolist()
    assert bounds._dense_ids(raw[:0]).size == 0


@pytest.mark.parametrize("block_size", [16, 512])
def test_compiled_loops_on_the_benchmark_stream(block_size):
    """The first 300 requests of the Mooncake chat sweep's stream (per-tenant salts), several pool
    capacities from empty to larger than the stream."""
    from sim.experiment.sweep_config import load_sweep
    from sim.experiment.workload import build_workload
    from workloads.paths import shared_traces_dir

    if not (shared_traces_dir() / "mooncake" / "conversation_trace.jsonl").is_file():
        pytest.skip("the Mooncake trace is not in the shared traces folder")
    sweep = load_sweep("configs/sweeps/mooncake_chat.yaml", None, ["workload.limit=300"])
    point = next(p for p in sweep.points if p.axes["workload.tenants.salt"] == "per_tenant")
    refs = _assert_same_references(list(build_workload(point.config).requests), block_size)
    for cap in (0, 1, 97, 2_000, refs.num_distinct_blocks // 3, refs.num_distinct_blocks):
        fast, slow = _both(refs, cap)
        assert fast == slow, cap


def test_shared_workload_equals_a_fresh_build(tmp_path):
    """A worker's shared stream is the fresh stream, request for request, and is handed out again
    for a config that differs only in engine settings (with that engine's description)."""
    from sim.experiment.config import config_from_dict
    from sim.experiment.engine_description import resolve
    from sim.experiment.workload import build_workload, shared_workload

    def cfg(block_size: int):
        return config_from_dict({
            "name": "shared", "seed": 3, "model": "llama-3-8b", "gpu": "H100-SXM", "engine": {"block_size": block_size},
            "workload": {"kind": "synthetic_shared_prefix", "num_requests": 40, "num_prefixes": 3,
                         "prefix_tokens": 64, "suffix_tokens": 16, "output_tokens": 4, "rate": 5.0,
                         "tenants": {"num_tenants": 2, "salt": "per_tenant"}},
        })

    a, b = cfg(16), cfg(32)
    first = shared_workload(a, resolve(a), scope="t")
    again = shared_workload(b, resolve(b), scope="t")
    assert again.requests is first.requests  # built once
    fresh = list(build_workload(a).requests)
    assert [(r.id, r.arrival, r.salt, r.tenant, r.output_tokens, bounds.token_array(r.tokens).tolist())
            for r in first.requests] == [
            (r.id, r.arrival, r.salt, r.tenant, r.output_tokens, bounds.token_array(r.tokens).tolist())
            for r in fresh]
    assert again.description == build_workload(b).description
    other = shared_workload(a, resolve(a), scope="next run")  # a later run reads its input again
    assert other.requests is not first.requests
