"""The run-time choice of attention: probe each candidate against the reference, keep what passes.

Mirrors vLLM's attention-backend selection (``vllm/attention/selector.py``) in purpose -- pick the
fastest backend that works on this device -- but decides by measurement: each candidate runs once
on a small random paged batch (decodes incl. a first token and block boundaries, a cold prefill, a
prefix-hit chunk, an unaligned chunk, a shared block, garbage in unused slots) and must match
``reference`` in float32 within a dtype tolerance.

``auto`` on CUDA takes, for decode sequences, the first of ``triton``, ``flash_paged``,
``reference`` that passes, and for prefill sequences the first of ``flash_paged``,
``flash_gather``, ``reference``; the resulting name (e.g. ``decode=triton,prefill=flash_gather``)
and every probe's outcome are reported. ``auto`` on CPU is ``reference``.

Invariants: an explicitly requested path that fails its probe raises RuntimeError (never a silent
fallback); an unavailable candidate is reported, not raised. Imports torch; triton only when the
triton candidate is built.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from gpu_backend.attention.base import AttentionImpl, Subset, subset
from gpu_backend.attention.flash import (
    FlashGatherAttention,
    FlashPagedAttention,
    find_varlen_attn,
    paged_block_size_refusal,
    varlen_takes_block_table,
)
from gpu_backend.attention.reference import ReferenceAttention
from gpu_backend.attention.split import SplitAttention
from gpu_backend.attention.triton_paged import TritonDecodeAttention
from gpu_backend.layout.batch import SeqInput, build_batch

ATTENTION_CHOICES = ("auto", "reference", "triton", "flash_paged", "flash_gather")


def probe_attention(impl: AttentionImpl, which: Subset, *, device: str | torch.device, dtype: torch.dtype,
                    block_size: int, num_heads: int, num_kv_heads: int, head_dim: int, seed: int = 0) -> float:
    """Max abs error of ``impl`` on ``which`` sequences of a random paged batch against ``reference``
    in float32 (raises whatever the implementation raises)."""
    g = torch.Generator().manual_seed(seed)
    bs = block_size
    # (context_len, query_len): decodes (incl. a first token and block boundaries), a cold prefill,
    # a prefix-hit chunk, an unaligned chunk, a one-block prefill
    shapes = [(0, 1), (36, 1), (5 * bs - 1, 1), (4 * bs, 1), (0, 45), (2 * bs, 20), (37, 9), (0, bs), (3 * bs + 5, 2)]
    if which == "decode":
        shapes = [s for s in shapes if s[1] == 1]
    elif which == "prefill":
        shapes = [s for s in shapes if s[1] > 1]
    need = [-(-(c + n) // bs) for c, n in shapes]
    num_blocks = sum(need) + 3
    perm = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    shared = perm[0]  # every sequence's first block is the same (a shared prefix block)
    seqs: list[SeqInput] = []
    used = 1
    for (c, n), nb in zip(shapes, need):
        table = [shared] + perm[used : used + nb - 1]
        used += nb - 1
        seqs.append(SeqInput(f"p{len(seqs)}", torch.zeros(n, dtype=torch.long).numpy(), c, table))
    batch = build_batch(seqs, block_size=bs, vocab_size=2, device=device)
    shape = (num_blocks, bs, num_kv_heads, head_dim)
    # inputs rounded to ``dtype`` first, so that only the computation's error is measured
    kc = (torch.randn(shape, generator=g) * 2).to(device=device, dtype=dtype)
    vc = (torch.randn(shape, generator=g) * 2).to(device=device, dtype=dtype)
    q = torch.randn((batch.num_tokens, num_heads, head_dim), generator=g).to(device=device, dtype=dtype)
    scale = head_dim ** -0.5
    ref = torch.zeros(q.shape, dtype=torch.float32, device=device)
    ReferenceAttention().run(q.float(), kc.float(), vc.float(), batch, scale, which, ref)
    got = torch.zeros_like(q)
    batch.cache.clear()
    impl.run(q, kc, vc, batch, scale, which, got)
    rows = subset(batch, which).rows
    err = (got.float().index_select(0, rows) - ref.index_select(0, rows)).abs().max().item()
    return float(err) if err == err else float("inf")


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 5e-2


def _build(name: str) -> AttentionImpl:
    if name == "reference":
        return ReferenceAttention()
    if name == "reference_top_left":
        return ReferenceAttention("top_left")
    if name == "triton":
        return TritonDecodeAttention()
    if name == "flash_paged":
        return FlashPagedAttention()
    if name == "flash_gather":
        return FlashGatherAttention()
    raise ValueError(f"unknown attention implementation {name!r}")


def _unavailable(name: str, device: torch.device, block_size: int) -> str | None:
    """Why candidate ``name`` cannot run here, or None."""
    if name == "flash_paged":
        why = paged_block_size_refusal(block_size)
        if why is not None:
            return why
    if name in ("flash_paged", "flash_gather"):
        if device.type != "cuda":
            return "needs CUDA"
        if find_varlen_attn() is None:
            return f"torch {torch.__version__} has no varlen_attn"
        if name == "flash_paged" and not varlen_takes_block_table():
            return f"torch {torch.__version__}'s varlen_attn takes no block_table"
    if name == "triton":
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed"
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            return "needs CUDA (or TRITON_INTERPRET=1)"
    return None


def _orders(requested: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Candidates for decode and for prefill sequences, in order of preference."""
    if requested == "auto":
        return ("triton", "flash_paged"), ("flash_paged", "flash_gather")
    if requested == "triton":
        return ("triton",), ()
    if requested == "flash_gather":
        return (), ("flash_gather",)
    if requested == "flash_paged":
        return ("flash_paged",), ("flash_paged",)
    raise ValueError(f"unknown attention {requested!r}; choose one of {ATTENTION_CHOICES}")


def select_attention(requested: str, *, device: str | torch.device, dtype: torch.dtype, block_size: int,
                     num_heads: int, num_kv_heads: int, head_dim: int) -> tuple[SplitAttention, dict[str, Any]]:
    """Build the attention backend; returns it and a report of every probe (``report["name"]`` is
    the choice). ``triton`` / ``flash_gather`` alone cover one kind of sequence, so they are paired
    with ``reference`` for the other kind; an explicitly requested path that fails its probe raises."""
    dev = torch.device(device)
    probes: dict[str, str] = {}
    report: dict[str, Any] = {"requested": requested, "device": str(dev), "dtype": str(dtype).replace("torch.", ""),
                              "probes": probes}
    tol = _tolerance(dtype)

    def probe(name: str, which: Subset) -> AttentionImpl | None:
        why = _unavailable(name, dev, block_size)
        if why is not None:
            probes[f"{name}/{which}"] = f"unavailable: {why}"
            return None
        try:
            impl = _build(name)
            err = probe_attention(impl, which, device=dev, dtype=dtype, block_size=block_size, num_heads=num_heads,
                                  num_kv_heads=num_kv_heads, head_dim=head_dim)
        except Exception as exc:  # a kernel that cannot run here is a failed candidate, not a crash
            probes[f"{name}/{which}"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return None
        ok = err <= tol
        probes[f"{name}/{which}"] = f"{'ok' if ok else 'MISMATCH'} max_abs_err={err:.3g} (tol {tol:g})"
        return impl if ok else None

    ref = ReferenceAttention()
    if requested in ("reference", "reference_top_left"):
        impl = _build(requested)
        backend = SplitAttention(impl, impl)
    elif requested == "auto" and dev.type != "cuda":
        backend = SplitAttention(ref, ref)
    else:
        decode_order, prefill_order = _orders(requested)
        chosen: dict[Subset, AttentionImpl] = {}
        kinds: tuple[tuple[Subset, tuple[str, ...]], ...] = (("decode", decode_order), ("prefill", prefill_order))
        for which, order in kinds:
            chosen[which] = ref
            for name in order:
                found = probe(name, which)
                if found is not None:
                    chosen[which] = found
                    break
            else:
                if requested != "auto" and order:
                    if requested == "flash_paged" and paged_block_size_refusal(block_size):
                        raise RuntimeError(paged_block_size_refusal(block_size))
                    raise RuntimeError(f"attention {requested!r} is not usable here: {report['probes']}")
        d, p = chosen["decode"], chosen["prefill"]
        if d.name == p.name == "flash_paged" and probe("flash_paged", "all") is not None:
            p = d  # one call for the whole mixed batch
        backend = SplitAttention(d, p)
    report["name"] = backend.name
    return backend, report
