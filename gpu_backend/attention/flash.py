"""The flash-attention paths over the paged pool, through torch's ``varlen_attn`` (CUDA only).

Mirrors vLLM's ``FlashAttentionBackend`` (``vllm/v1/attention/backends/flash_attn.py``): one
variable-length flash call per batch, ``cu_seqlens`` for queries and keys, causal as
``window_size=(-1, 0)`` (bottom-right aligned).

* ``flash_paged``: the whole mixed batch in one call straight over the paged pool (torch with
  ``varlen_attn(block_table=...)``); FlashAttention-2's paged mode takes pages of a multiple of
  256 tokens only, so any other block size is refused with a message naming that constraint
  (:func:`paged_block_size_refusal`) before the kernel is called;
* ``flash_gather``: prefill sequences; gathers their K/V into packed buffers first, then one call
  (any torch with ``varlen_attn``).

Invariants: per-step metadata (``cu_seqlens``, gathered slots, block-table rows) is built once per
step and subset and memoised in ``batch.cache``; ``find_varlen_attn`` is the only place that looks
the kernel up (tests replace it with an emulation). Imports torch only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from gpu_backend.attention.base import Subset, subset, write_rows
from gpu_backend.layout.batch import StepBatch


def find_varlen_attn() -> Callable[..., Any] | None:
    """torch's ``varlen_attn`` if this torch has it (2.9+), else None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception:  # pragma: no cover - depends on the torch build
        return None
    return varlen_attn


def varlen_takes_block_table() -> bool:
    """Whether this torch's ``varlen_attn`` reads a paged pool (``block_table=``)."""
    fn = find_varlen_attn()
    return fn is not None and "block_table" in inspect.signature(fn).parameters


#: FlashAttention-2's paged KV cache takes pages of a multiple of this many tokens: torch's
#: ``varlen_attn(block_table=...)`` runs FA2's ``mha_varlen_fwd``, which checks
#: ``page_block_size % 256 == 0`` ("Paged KV cache block size must be divisible by 256").
FLASH_PAGE_MULTIPLE = 256


def paged_block_size_refusal(block_size: int) -> str | None:
    """Why ``flash_paged`` cannot run at this KV block size (None if it can)."""
    if block_size % FLASH_PAGE_MULTIPLE == 0:
        return None
    return (f"flash_paged needs engine.block_size to be a multiple of {FLASH_PAGE_MULTIPLE} (FlashAttention-2's "
            f"paged KV cache, torch varlen_attn with block_table=), got {block_size}; use block_size "
            f"{FLASH_PAGE_MULTIPLE}, {2 * FLASH_PAGE_MULTIPLE}, ... or attention auto / flash_gather / triton")


def _kernel() -> Callable[..., Any]:
    fn = find_varlen_attn()
    if fn is None:
        raise RuntimeError(f"torch {torch.__version__} has no varlen_attn")
    return fn


def _cu_seqlens(lens: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


class FlashPagedAttention:
    """One ``varlen_attn`` call over the paged pool (flash attention with a block table)."""

    name = "flash_paged"

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch, scale: float,
            which: Subset, out: torch.Tensor) -> None:
        why = paged_block_size_refusal(batch.block_size)
        if why is not None:
            raise ValueError(why)
        varlen_attn = _kernel()
        info = subset(batch, which)
        key = ("flash_paged", which)
        meta: tuple[Any, ...] | None = batch.cache.get(key)
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
        write_rows(out, info, o)


class FlashGatherAttention:
    """Prefill sequences: gather their K/V into packed buffers, then one causal ``varlen_attn``."""

    name = "flash_gather"

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch, scale: float,
            which: Subset, out: torch.Tensor) -> None:
        varlen_attn = _kernel()
        info = subset(batch, which)
        key = ("flash_gather", which)
        meta: tuple[Any, ...] | None = batch.cache.get(key)
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
            meta = batch.cache[key] = (torch.cat(slots).to(dev), _cu_seqlens(qlens, dev), _cu_seqlens(slens, dev),
                                       max(qlens), max(slens))
        slot_ids, cu_q, cu_k, max_q, max_k = meta
        num_kv, d = k_cache.shape[2], k_cache.shape[3]
        k = k_cache.view(-1, num_kv, d).index_select(0, slot_ids)
        v = v_cache.view(-1, num_kv, d).index_select(0, slot_ids)
        qs = q if info.is_all else q.index_select(0, info.rows)
        o = varlen_attn(qs, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=(-1, 0), enable_gqa=True)
        write_rows(out, info, o)
