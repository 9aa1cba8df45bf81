"""Speed benchmark of the torch backend, per step type, against the device's limits.

* ``measure_ceilings``: a device-to-device copy (bytes read + written) and a large bf16 matmul,
  measured here; the device run reports every figure against these and against the GPU's nominal
  datasheet peaks (``sim/timing/specs/gpus.yaml``; H200: 4.8 TB/s, 989 dense bf16 TFLOP/s);
* ``bench_decode_attention``: the paged decode attention alone (one layer) at ``batch x context``
  (the target: batch 64 x 4k context, Llama-3-8B heads, >= 60 % of HBM bandwidth) for each decode
  implementation that works here; bytes = K and V of every context token read once;
* ``bench_model_steps``: whole forward passes (all layers + lm_head of the sampled rows) for a cold
  prefill, a prefill after a prefix hit, a pure decode step and a mixed step. Prefill figures are
  TFLOP/s (2 x non-embedding params x tokens + lm_head + 4 x layers x heads x head_dim x query-key
  pairs); decode figures are HBM TB/s (weights streamed + KV read).

Times are medians over ``iters`` runs after ``warmup`` runs: CUDA events on a GPU, perf_counter on
a CPU. Block tables are random permutations of the pool (scattered pages, as after a long run).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gpu_backend.attention import (
    Attention,
    AttentionImpl,
    FlashPagedAttention,
    ReferenceAttention,
    TritonDecodeAttention,
    probe_attention,
)
from gpu_backend.executor.model import LlamaModel
from gpu_backend.layout.batch import SeqInput, StepBatch, build_batch
from gpu_backend.layout.kv_cache import PagedKVCache

H200_HBM_TBPS = 4.8  # nominal (datasheet, sim/timing/specs/gpus.yaml); callers pass the spec's value
H200_BF16_TFLOPS = 989.0


def time_fn(fn: Callable[[], Any], device: torch.device, *, warmup: int = 3, iters: int = 10) -> float:
    """Median seconds of ``fn()``."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_ceilings(device: torch.device, *, quick: bool = False) -> dict[str, Any]:
    """Measured copy bandwidth (TB/s, read + write) and bf16 (fp32 on CPU) matmul TFLOP/s."""
    n_bytes = (1 << 24) if quick else (4 << 30)
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    t_copy = time_fn(lambda: dst.copy_(src), device, warmup=2, iters=5 if quick else 10)
    n = 512 if quick else 8192
    mdt = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=mdt)
    b = torch.randn(n, n, device=device, dtype=mdt)
    t_mm = time_fn(lambda: a @ b, device, warmup=2, iters=5 if quick else 10)
    return {"copy_tbps": 2 * n_bytes / t_copy / 1e12, "matmul_tflops": 2 * n ** 3 / t_mm / 1e12,
            "matmul_dtype": str(mdt).replace("torch.", "")}


def _random_tables(num_seqs: int, blocks_per_seq: int, gen: torch.Generator) -> list[list[int]]:
    perm = (torch.randperm(num_seqs * blocks_per_seq, generator=gen) + 1).tolist()
    return [perm[i * blocks_per_seq : (i + 1) * blocks_per_seq] for i in range(num_seqs)]


def bench_decode_attention(
    impl_names: list[str], *, device: torch.device, dtype: torch.dtype, batch: int = 64, context: int = 4096,
    block_size: int = 16, num_heads: int = 32, num_kv_heads: int = 8, head_dim: int = 128, warmup: int = 3,
    iters: int = 10, triton_configs: list[dict[str, Any]] | None = None, peak_tbps: float = H200_HBM_TBPS,
) -> list[dict[str, Any]]:
    """One layer of decode attention: ``batch`` sequences, each ``context`` tokens of history."""
    gen = torch.Generator().manual_seed(0)
    nb = -(-context // block_size)
    num_blocks = batch * nb + 1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    kc = torch.empty(shape, dtype=dtype, device=device).normal_()
    vc = torch.empty(shape, dtype=dtype, device=device).normal_()
    seqs = [SeqInput(f"s{i}", np.zeros(1, dtype=np.int64), context - 1, t)
            for i, t in enumerate(_random_tables(batch, nb, gen))]
    b = build_batch(seqs, block_size=block_size, vocab_size=2, device=device)
    q = torch.randn((batch, num_heads, head_dim), dtype=dtype, device=device)
    elt = kc.element_size()
    bytes_moved = 2 * batch * context * num_kv_heads * head_dim * elt + 2 * q.numel() * elt
    rows = []
    for name in impl_names:
        configs: list[tuple[str, AttentionImpl]]
        if name == "triton":
            configs = [(_triton_label(c), TritonDecodeAttention(**c)) for c in (triton_configs or [{}])]
        elif name == "flash_paged":
            configs = [("flash_paged", FlashPagedAttention())]
        elif name == "reference":
            configs = [("reference", ReferenceAttention())]
        else:
            raise ValueError(name)
        for label, impl in configs:
            out = torch.empty_like(q)
            row: dict[str, Any] = {"impl": label, "batch": batch, "context": context, "block_size": block_size,
                                   "dtype": str(dtype).replace("torch.", "")}
            try:
                err = probe_attention(impl, "decode", device=device, dtype=dtype, block_size=block_size,
                                      num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)
                row["probe_max_abs_err"] = err
                t = time_fn(lambda: impl.run(q, kc, vc, b, head_dim ** -0.5, "all", out), device,
                            warmup=warmup, iters=iters)
            except Exception as exc:  # report, keep going
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                rows.append(row)
                continue
            tbps = bytes_moved / t / 1e12
            row.update(time_ms=t * 1e3, bytes=bytes_moved, tbps=tbps, pct_of_peak=100 * tbps / peak_tbps)
            rows.append(row)
    return rows


def _triton_label(c: dict[str, Any]) -> str:
    splits = f" splits={c['num_splits']}" if c.get("num_splits") else ""
    return f"triton tile={c.get('tile', 64)} warps={c.get('num_warps', 4)} stages={c.get('num_stages', 2)}{splits}"


def _step_flops(model: LlamaModel, batch: StepBatch) -> float:
    spec = model.spec
    pairs = sum(n * c + n * (n + 1) // 2 for n, c in zip(batch.query_lens, batch.context_lens))
    return (spec.dense_flops_per_token * batch.num_tokens + spec.lm_head_flops_per_token * len(batch.sample_request_ids)
            + spec.attention_flops_per_pair * pairs)


def _step_bytes(model: LlamaModel, batch: StepBatch, elt: int) -> float:
    spec = model.spec
    weights = (spec.non_embedding_params + spec.lm_head_params) * elt
    kv_per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * elt
    return weights + kv_per_token * sum(batch.seq_lens)


def bench_model_steps(
    model: LlamaModel, attention: Attention, *, scenarios: dict[str, list[tuple[int, int]]], block_size: int = 16,
    warmup: int = 2, iters: int = 5, peak_tbps: float = H200_HBM_TBPS, peak_tflops: float = H200_BF16_TFLOPS,
) -> list[dict[str, Any]]:
    """Whole forward passes; each scenario is a list of ``(context_len, query_len)`` sequences."""
    device = model.device
    gen = torch.Generator().manual_seed(1)
    need = max(sum(-(-(c + n) // block_size) for c, n in seqs) for seqs in scenarios.values())
    cache = PagedKVCache(model.spec.num_layers, need + 1, block_size, model.num_kv_heads, model.head_dim,
                         dtype=model.dtype, device=device)
    elt = cache.k[0].element_size()
    rows = []
    for name, shape in scenarios.items():
        blocks = [-(-(c + n) // block_size) for c, n in shape]
        perm = (torch.randperm(sum(blocks), generator=gen) + 1).tolist()
        seqs, used = [], 0
        rng = np.random.default_rng(0)
        for i, ((c, n), nb) in enumerate(zip(shape, blocks)):
            seqs.append(SeqInput(f"{name}{i}", rng.integers(0, 1 << 30, size=n), c, perm[used : used + nb]))
            used += nb
        batch = build_batch(seqs, block_size=block_size, vocab_size=model.vocab_size, device=device)

        def step() -> None:
            with torch.inference_mode():
                h = model.forward(batch, cache, attention)
                model.logits(h.index_select(0, batch.sample_rows))

        t = time_fn(step, device, warmup=warmup, iters=iters)
        flops, nbytes = _step_flops(model, batch), _step_bytes(model, batch, elt)
        kind = "decode" if all(n == 1 for _, n in shape) else ("prefill" if all(n > 1 for _, n in shape) else "mixed")
        rows.append({
            "scenario": name, "kind": kind, "seqs": len(shape), "tokens": batch.num_tokens,
            "context_tokens": sum(batch.context_lens), "time_ms": t * 1e3, "tflops": flops / t / 1e12,
            "pct_of_peak_flops": 100 * flops / t / 1e12 / peak_tflops, "tbps": nbytes / t / 1e12,
            "pct_of_peak_bw": 100 * nbytes / t / 1e12 / peak_tbps, "tokens_per_s": batch.num_tokens / t,
            "attention": getattr(attention, "name", "?"),
        })
    return rows
