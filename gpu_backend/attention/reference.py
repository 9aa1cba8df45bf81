"""The reference paged attention: gather each sequence's K/V, expand GQA heads, SDPA with a mask.

Mirrors what every vLLM attention backend computes (bottom-right causal mask, see
``gpu_backend.attention.base``), in the plainest torch: the correctness oracle for the fast paths.
``mask="top_left"`` reproduces ``scaled_dot_product_attention(is_causal=True)``, which aligns the
mask top-left (query ``j`` sees keys ``<= j``) and is wrong whenever the query is shorter than the
keys (prefix hits, chunked prefill, decode): kept on purpose, as a negative control.

Invariants: one SDPA call per sequence, 4-D so that CUDA may pick a fused kernel; runs on CPU and
CUDA. Imports torch only.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from gpu_backend.attention.base import Subset, subset
from gpu_backend.layout.batch import StepBatch


class ReferenceAttention:
    """Gather + SDPA per sequence; ``mask="top_left"`` reproduces ``is_causal=True`` (a negative control)."""

    def __init__(self, mask: Literal["bottom_right", "top_left"] = "bottom_right") -> None:
        self.mask = mask
        self.name = "reference" if mask == "bottom_right" else "reference_top_left"

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch, scale: float,
            which: Subset, out: torch.Tensor) -> None:
        bs = batch.block_size
        num_heads, num_kv = q.shape[1], k_cache.shape[2]
        group = num_heads // num_kv
        for i in subset(batch, which).seqs:
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

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch,
                 scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        self.run(q, k_cache, v_cache, batch, scale, "all", out)
        return out
