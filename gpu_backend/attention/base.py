"""What every paged-attention implementation shares: the call contract and the batch subsets.

Mirrors vLLM v1's attention-backend contract (``vllm/v1/attention/backends``): for each sequence
``i`` of a :class:`~gpu_backend.layout.batch.StepBatch`, the attention of its ``query_len`` new tokens
(positions ``context_len .. seq_len - 1``) over keys ``0 .. seq_len - 1`` read from the paged pool
through its block table, with the causal mask aligned **bottom-right**: query ``j`` sees keys
``<= context_len + j``.

Invariants: an implementation writes exactly the flat token rows of the sequences it is asked for
(``which``: ``all``, ``decode`` -- one new token -- or ``prefill`` -- the others) into ``out`` and
touches no other row; per-step metadata is memoised in ``batch.cache`` (keyed by implementation
and subset), so several layers of one step share it.

Imports torch only (no triton, no sim).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from gpu_backend.layout.batch import StepBatch

Subset = Literal["all", "decode", "prefill"]


class AttentionImpl(Protocol):
    """One implementation over one subset of a batch's sequences."""

    name: str

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch, scale: float,
            which: Subset, out: torch.Tensor) -> None:
        """Write the attention output of the ``which`` sequences' rows of ``q`` ``[T, Hq, D]`` into
        ``out`` (same shape); caches are ``[num_blocks, block_size, Hkv, D]``. Changes ``out`` and
        ``batch.cache`` only."""
        ...


class Attention(Protocol):
    """A whole-batch backend, as the model calls it once per layer."""

    name: str

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch,
                 scale: float) -> torch.Tensor: ...


@dataclass
class SubsetInfo:
    """The sequences of one subset and their flat token rows."""

    seqs: list[int]
    rows: torch.Tensor  # flat token rows of these sequences
    is_all: bool


def subset(batch: StepBatch, which: Subset) -> SubsetInfo:
    """The ``which`` sequences of ``batch`` (memoised in ``batch.cache``)."""
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
        info = batch.cache[key] = SubsetInfo(list(seqs), rows, is_all)
    return info


def write_rows(out: torch.Tensor, info: SubsetInfo, o: torch.Tensor) -> None:
    """Put a subset's packed output ``o`` into its rows of ``out``."""
    if info.is_all:
        out.copy_(o)
    else:
        out.index_copy_(0, info.rows, o)
