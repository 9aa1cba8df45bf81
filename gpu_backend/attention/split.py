"""A whole-batch attention backend made of two implementations: one for decodes, one for prefills.

Mirrors vLLM's split of a mixed batch into decode and prefill parts (the attention metadata
builders' ``split_decodes_and_prefills``): each part goes to the implementation that suits it, and
both write one shared output.

Invariants: every row of the output is written exactly once (decode rows by ``decode``, the others
by ``prefill``); when both parts use the same implementation object, it runs once over the whole
batch; ``name`` is ``decode=X,prefill=Y`` (or ``X`` when they agree). Imports torch only.
"""

from __future__ import annotations

import torch

from gpu_backend.attention.base import AttentionImpl, Subset
from gpu_backend.layout.batch import StepBatch


class SplitAttention:
    """Decode sequences through one implementation, prefill sequences through another, one output."""

    def __init__(self, decode: AttentionImpl, prefill: AttentionImpl) -> None:
        self.decode, self.prefill = decode, prefill
        if decode.name == prefill.name:
            self.name = decode.name
        else:
            self.name = f"decode={decode.name},prefill={prefill.name}"

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch,
                 scale: float) -> torch.Tensor:
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
