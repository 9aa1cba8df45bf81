"""The Triton decode path: decode sequences through the paged flash-decoding kernel.

Plays the role of vLLM's Triton decode-attention kernels; the kernel itself is this project's own
(:mod:`gpu_backend.attention.triton_decode`). Runs on CUDA with Triton, or on CPU tensors under
``TRITON_INTERPRET=1``.

Invariants: takes decode sequences only (one new token each; anything else raises ValueError);
the block-table rows and sequence lengths of a subset are built once per step (``batch.cache``).
Imports torch; triton only when an instance is built.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_backend.attention.base import Subset, subset, write_rows
from gpu_backend.layout.batch import StepBatch


class TritonDecodeAttention:
    """Decode sequences (one new token): the Triton paged flash-decoding kernel."""

    name = "triton"

    def __init__(self, tile: int = 64, num_splits: int | None = None, num_warps: int = 4, num_stages: int = 2) -> None:
        from gpu_backend.attention.triton_decode import paged_decode_attention

        self._kernel = paged_decode_attention
        self.tile, self.num_splits, self.num_warps, self.num_stages = tile, num_splits, num_warps, num_stages

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch, scale: float,
            which: Subset, out: torch.Tensor) -> None:
        info = subset(batch, which)
        key = ("triton", which)
        meta: tuple[Any, ...] | None = batch.cache.get(key)
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
        write_rows(out, info, o)
