"""Paged attention: the reference path, the fast CUDA paths, and the run-time choice between them.

Every implementation computes, for each sequence ``i`` of a :class:`~gpu_backend.batch.StepBatch`,
the attention of its ``query_len`` new tokens (positions ``context_len .. seq_len - 1``) over keys
``0 .. seq_len - 1`` read from the paged pool through its block table, with the causal mask aligned
**bottom-right**: query ``j`` sees keys ``<= context_len + j``. (``scaled_dot_product_attention``'s
``is_causal=True`` aligns top-left -- query ``j`` sees keys ``<= j`` -- which is wrong whenever the
query is shorter than the keys: prefix hits, chunked prefill and decode. ``mask="top_left"`` keeps
that bug on purpose, as a negative control.)

Implementations (``name``: where it runs):

* ``reference`` (CPU, CUDA): per sequence, gather K/V through the block table, expand GQA heads,
  SDPA with an explicit boolean mask. The correctness oracle for everything else.
* ``flash_paged`` (CUDA, torch with ``varlen_attn(block_table=...)``): the whole mixed batch in one
  flash-attention call straight over the paged pool (``window_size=(-1, 0)`` is causal).
* ``flash_gather`` (CUDA, torch with ``varlen_attn``): prefill sequences only; gathers their K/V
  into packed buffers, then one varlen flash call.
* ``triton`` (CUDA with Triton; CPU under ``TRITON_INTERPRET=1``): decode sequences only, the
  paged flash-decoding kernel of :mod:`gpu_backend.triton_decode`.

:func:`select_attention` builds the backend for a device, dtype and block size. ``auto`` on CUDA
probes each candidate on a small random mixed batch (decodes, a cold prefill, a prefix-hit chunk,
an unaligned chunk, shared blocks, garbage in unused slots) against ``reference`` and takes, for
decode sequences, the first of ``triton``, ``flash_paged``, ``reference`` that passes, and for
prefill sequences the first of ``flash_paged``, ``flash_gather``, ``reference``; the resulting
name (e.g. ``decode=triton,prefill=flash_gather``) and every probe's outcome are reported.
``auto`` on CPU is ``reference``.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from gpu_backend.batch import StepBatch

Subset = Literal["all", "decode", "prefill"]


# ----------------------------------------------------------------------------- subsets of a batch


@dataclass
class _SubsetInfo:
    seqs: list[int]
    rows: torch.Tensor  # flat token rows of these sequences
    is_all: bool


def _subset(batch: StepBatch, which: Subset) -> _SubsetInfo:
    key = ("subset", which)
    info = batch.cache.get(key)
    if info is None:
        seqs = list(range(batch.num_seqs)) if which == "all" else (
            batch.decode_seqs if which == "decode" else batch.prefill_seqs
        )
        is_all = len(seqs) == batch.num_seqs
        if is_all:
            rows = torch.arange(batch.num_tokens, device=batch.input_ids.device)
        else:
            r: list[int] = []
            for i in seqs:
                s = batch.query_start(i)
                r.extend(range(s, s + batch.query_lens[i]))
            rows = torch.tensor(r, dtype=torch.long, device=batch.input_ids.device)
        info = batch.cache[key] = _SubsetInfo(list(seqs), rows, is_all)
    return info


# ----------------------------------------------------------------------------- implementations


class ReferenceAttention:
    """Gather + SDPA per sequence; ``mask="top_left"`` reproduces ``is_causal=True`` (a negative control)."""

    def __init__(self, mask: Literal["bottom_right", "top_left"] = "bottom_right") -> None:
        self.mask = mask
        self.name = "reference" if mask == "bottom_right" else "reference_top_left"

    def run(self, q, k_cache, v_cache, batch: StepBatch, scale: float, which: Subset, out) -> None:
        bs = batch.block_size
        num_heads, num_kv = q.shape[1], k_cache.shape[2]
        group = num_heads // num_kv
        for i in _subset(batch, which).seqs:
            n, ctx, seq_len = batch.query_lens[i], batch.context_lens[i], batch.seq_lens[i]
            start = batch.query_start(i)
            nb = -(-seq_len // bs)
            idx = batch.block_table[i, :nb].long()
            k = k_cache[idx].reshape(nb * bs, num_kv, -1)[:seq_len].transpose(0, 1)
            v = v_cache[idx].reshape(nb * bs, num_kv, -1)[:seq_len].transpose(0, 1)
            if group > 1:
                k = k.repeat_interleave(group, dim=0)
                v = v.repeat_interleave(group, dim=0)
            qi = q[start : start + n].transpose(0, 1)  # [H, n, D]
            # 4-D [1, H, len, D] so that CUDA may use a fused SDPA kernel
            if self.mask == "bottom_right":
                keys = torch.arange(seq_len, device=q.device)
                allowed = keys[None, :] <= (ctx + torch.arange(n, device=q.device))[:, None]
                o = F.scaled_dot_product_attention(qi[None], k[None], v[None], attn_mask=allowed, scale=scale)
            else:
                o = F.scaled_dot_product_attention(qi[None], k[None], v[None], is_causal=True, scale=scale)
            out[start : start + n] = o[0].transpose(0, 1)

    def __call__(self, q, k_cache, v_cache, batch: StepBatch, scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        self.run(q, k_cache, v_cache, batch, scale, "all", out)
        return out


def _varlen_attn() -> Callable | None:
    """torch's ``varlen_attn`` if this torch has it (2.9+), else None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception:  # pragma: no cover - depends on the torch build
        return None
    return varlen_attn


def _varlen_has_block_table() -> bool:
    fn = _varlen_attn()
    return fn is not None and "block_table" in inspect.signature(fn).parameters


class FlashPagedAttention:
    """One ``varlen_attn`` call over the paged pool (flash attention with a block table)."""

    name = "flash_paged"

    def run(self, q, k_cache, v_cache, batch: StepBatch, scale: float, which: Subset, out) -> None:
        varlen_attn = _varlen_attn()
        info = _subset(batch, which)
        key = ("flash_paged", which)
        meta = batch.cache.get(key)
        if meta is None:
            seqs = info.seqs
            dev = q.device
            qlens = torch.tensor([batch.query_lens[i] for i in seqs], dtype=torch.int32, device=dev)
            slens = torch.tensor([batch.seq_lens[i] for i in seqs], dtype=torch.int32, device=dev)
            zero = torch.zeros(1, dtype=torch.int32, device=dev)
            cu_q = torch.cat([zero, qlens.cumsum(0, dtype=torch.int32)])
            cu_k = torch.cat([zero, slens.cumsum(0, dtype=torch.int32)])
            sel = torch.tensor(seqs, dtype=torch.long, device=dev)
            bt = batch.block_table if info.is_all else batch.block_table.index_select(0, sel)
            meta = batch.cache[key] = (cu_q, cu_k, slens, bt.contiguous(),
                                       max(batch.query_lens[i] for i in seqs),
                                       max(batch.seq_lens[i] for i in seqs))
        cu_q, cu_k, slens, bt, max_q, max_k = meta
        qs = q if info.is_all else q.index_select(0, info.rows)
        o = varlen_attn(qs, k_cache, v_cache, cu_q, cu_k, max_q, max_k, scale=scale, window_size=(-1, 0),
                        enable_gqa=True, seqused_k=slens, block_table=bt)
        if info.is_all:
            out.copy_(o)
        else:
            out.index_copy_(0, info.rows, o)


class FlashGatherAttention:
    """Prefill sequences: gather their K/V into packed buffers, then one causal ``varlen_attn``."""

    name = "flash_gather"

    def run(self, q, k_cache, v_cache, batch: StepBatch, scale: float, which: Subset, out) -> None:
        varlen_attn = _varlen_attn()
        info = _subset(batch, which)
        key = ("flash_gather", which)
        meta = batch.cache.get(key)
        bs = batch.block_size
        if meta is None:
            slots, qlens, slens = [], [], []
            for i in info.seqs:
                table = batch.block_tables[i]
                sl = batch.seq_lens[i]
                pos = torch.arange(sl)
                tb = torch.tensor(table[: -(-sl // bs)], dtype=torch.long)
                slots.append(tb[pos // bs] * bs + pos % bs)
                qlens.append(batch.query_lens[i])
                slens.append(sl)
            dev = q.device
            cu = lambda xs: torch.tensor([0, *torch.tensor(xs).cumsum(0).tolist()], dtype=torch.int32, device=dev)  # noqa: E731
            meta = batch.cache[key] = (torch.cat(slots).to(dev), cu(qlens), cu(slens), max(qlens), max(slens))
        slots, cu_q, cu_k, max_q, max_k = meta
        num_kv, d = k_cache.shape[2], k_cache.shape[3]
        k = k_cache.view(-1, num_kv, d).index_select(0, slots)
        v = v_cache.view(-1, num_kv, d).index_select(0, slots)
        qs = q if info.is_all else q.index_select(0, info.rows)
        o = varlen_attn(qs, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=(-1, 0), enable_gqa=True)
        if info.is_all:
            out.copy_(o)
        else:
            out.index_copy_(0, info.rows, o)


class TritonDecodeAttention:
    """Decode sequences (one new token): the Triton paged flash-decoding kernel."""

    name = "triton"

    def __init__(self, tile: int = 64, num_splits: int | None = None, num_warps: int = 4, num_stages: int = 2) -> None:
        from gpu_backend.triton_decode import paged_decode_attention

        self._kernel = paged_decode_attention
        self.tile, self.num_splits, self.num_warps, self.num_stages = tile, num_splits, num_warps, num_stages

    def run(self, q, k_cache, v_cache, batch: StepBatch, scale: float, which: Subset, out) -> None:
        info = _subset(batch, which)
        key = ("triton", which)
        meta = batch.cache.get(key)
        if meta is None:
            if any(batch.query_lens[i] != 1 for i in info.seqs):
                raise ValueError("the triton path takes decode sequences (one new token) only")
            sel = torch.tensor(info.seqs, dtype=torch.long, device=q.device)
            bt = batch.block_table if info.is_all else batch.block_table.index_select(0, sel)
            sl = batch.seq_lens_t if info.is_all else batch.seq_lens_t.index_select(0, sel)
            meta = batch.cache[key] = (bt.contiguous(), sl.contiguous(), max(batch.seq_lens[i] for i in info.seqs))
        bt, sl, max_len = meta
        qs = q if info.is_all else q.index_select(0, info.rows)
        o = self._kernel(qs.contiguous(), k_cache, v_cache, bt, sl, scale, max_seq_len=max_len, tile=self.tile,
                         num_splits=self.num_splits, num_warps=self.num_warps, num_stages=self.num_stages)
        if info.is_all:
            out.copy_(o)
        else:
            out.index_copy_(0, info.rows, o)


class SplitAttention:
    """Decode sequences through one implementation, prefill sequences through another, one output."""

    def __init__(self, decode, prefill) -> None:
        self.decode, self.prefill = decode, prefill
        if decode.name == prefill.name:
            self.name = decode.name
        else:
            self.name = f"decode={decode.name},prefill={prefill.name}"

    def __call__(self, q, k_cache, v_cache, batch: StepBatch, scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        if self.decode is self.prefill:
            self.decode.run(q, k_cache, v_cache, batch, scale, "all", out)
            return out
        if batch.decode_seqs:
            which: Subset = "all" if not batch.prefill_seqs else "decode"
            self.decode.run(q, k_cache, v_cache, batch, scale, which, out)
        if batch.prefill_seqs:
            which = "all" if not batch.decode_seqs else "prefill"
            self.prefill.run(q, k_cache, v_cache, batch, scale, which, out)
        return out


# ----------------------------------------------------------------------------- probing and selection


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def probe_attention(impl, which: Subset, *, device, dtype, block_size: int, num_heads: int, num_kv_heads: int,
                    head_dim: int, seed: int = 0) -> float:
    """Max abs error of ``impl`` on ``which`` sequences of a random paged batch against ``reference``
    in float32 (raises whatever the implementation raises)."""
    from gpu_backend.batch import SeqInput, build_batch

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
    seqs, used = [], 1
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
    rows = _subset(batch, which).rows
    err = (got.float().index_select(0, rows) - ref.index_select(0, rows)).abs().max().item()
    return float(err) if err == err else float("inf")


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 5e-2


def _build(name: str):
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


ATTENTION_CHOICES = ("auto", "reference", "triton", "flash_paged", "flash_gather")


def select_attention(requested: str, *, device, dtype, block_size: int, num_heads: int, num_kv_heads: int,
                     head_dim: int) -> tuple[SplitAttention, dict]:
    """Build the attention backend; returns it and a report of every probe (``report["name"]`` is
    the choice). ``triton`` / ``flash_gather`` alone cover one kind of sequence, so they are paired
    with ``reference`` for the other kind; an explicitly requested path that fails its probe raises."""
    device = torch.device(device)
    dims = dict(device=device, dtype=dtype, block_size=block_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
                head_dim=head_dim)
    report: dict = {"requested": requested, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
                    "probes": {}}
    tol = _tolerance(dtype)

    def available(name: str) -> str | None:
        if name in ("flash_paged", "flash_gather"):
            if device.type != "cuda":
                return "needs CUDA"
            if _varlen_attn() is None:
                return f"torch {torch.__version__} has no varlen_attn"
            if name == "flash_paged" and not _varlen_has_block_table():
                return f"torch {torch.__version__}'s varlen_attn takes no block_table"
        if name == "triton":
            if not _triton_available():
                return "triton is not installed"
            if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
                return "needs CUDA (or TRITON_INTERPRET=1)"
        return None

    def probe(name: str, which: Subset):
        why = available(name)
        if why is not None:
            report["probes"][f"{name}/{which}"] = f"unavailable: {why}"
            return None
        try:
            impl = _build(name)
            err = probe_attention(impl, which, **dims)
        except Exception as exc:  # a kernel that cannot run here is a failed candidate, not a crash
            report["probes"][f"{name}/{which}"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return None
        ok = err <= tol
        report["probes"][f"{name}/{which}"] = f"{'ok' if ok else 'MISMATCH'} max_abs_err={err:.3g} (tol {tol:g})"
        return impl if ok else None

    ref = ReferenceAttention()
    if requested in ("reference", "reference_top_left"):
        impl = _build(requested)
        backend = SplitAttention(impl, impl)
    elif requested == "auto" and device.type != "cuda":
        backend = SplitAttention(ref, ref)
    else:
        if requested == "auto":
            decode_order, prefill_order = ("triton", "flash_paged"), ("flash_paged", "flash_gather")
        elif requested in ("triton",):
            decode_order, prefill_order = ("triton",), ()
        elif requested == "flash_gather":
            decode_order, prefill_order = (), ("flash_gather",)
        elif requested == "flash_paged":
            decode_order, prefill_order = ("flash_paged",), ("flash_paged",)
        else:
            raise ValueError(f"unknown attention {requested!r}; choose one of {ATTENTION_CHOICES}")
        chosen = {}
        for which, order in (("decode", decode_order), ("prefill", prefill_order)):
            chosen[which] = ref
            for name in order:
                impl = probe(name, which)
                if impl is not None:
                    chosen[which] = impl
                    break
            else:
                if requested != "auto" and order:
                    raise RuntimeError(f"attention {requested!r} is not usable here: {report['probes']}")
        d, p = chosen["decode"], chosen["prefill"]
        if d.name == p.name == "flash_paged" and probe("flash_paged", "all") is not None:
            p = d  # one call for the whole mixed batch
        backend = SplitAttention(d, p)
    report["name"] = backend.name
    return backend, report
