"""One step's flattened batch, as vLLM v1's model runner prepares it.

Every scheduled request contributes ``query_len`` consecutive tokens starting at position
``context_len`` (its already-computed tokens: prefix-cache hits or earlier chunks). Prefill chunks
and decodes share one flat token dimension; per-sequence ``query_start_loc`` (cumulative query
lengths), ``seq_lens`` (``context_len + query_len``) and a padded ``block_table`` describe the
sequences; ``slot_mapping`` says where each new token's K/V goes:
``block_table[pos // block_size] * block_size + pos % block_size``.

Token ids are mapped to the embedding as ``token_id % vocab_size`` (see the package docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class SeqInput:
    """One sequence's share of a step: its new tokens after ``context_len`` computed ones."""

    request_id: str
    token_ids: np.ndarray  # the new tokens, int64 (any magnitude)
    context_len: int
    block_ids: list[int]  # the request's whole block table
    sample: bool = True  # the step ends its prefill: compute logits for the last token


@dataclass
class StepBatch:
    """Device tensors plus host-side copies of the per-sequence metadata."""

    request_ids: list[str]
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    slot_mapping: torch.Tensor  # [T] long
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens_t: torch.Tensor  # [B] int32
    block_table: torch.Tensor  # [B, max_blocks] int32, padded with 0 (the null block)
    query_lens: list[int]
    context_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    block_size: int
    sample_rows: torch.Tensor  # [S] long: flat index of each sampling sequence's last token
    sample_request_ids: list[str]
    sample_positions: list[int]
    decode_seqs: list[int] = field(default_factory=list)  # sequences with exactly one new token
    prefill_seqs: list[int] = field(default_factory=list)  # the others
    cache: dict[Any, Any] = field(default_factory=dict)  # per-step scratch for attention backends

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.request_ids)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens, default=0)

    def query_start(self, i: int) -> int:
        return int(self._qsl_host[i])

    def __post_init__(self) -> None:
        self._qsl_host = np.concatenate([[0], np.cumsum(self.query_lens, dtype=np.int64)])


def build_batch(
    seqs: list[SeqInput], *, block_size: int, vocab_size: int, device: str | torch.device
) -> StepBatch:
    """Flatten ``seqs`` into one batch on ``device`` (one host-to-device copy per tensor)."""
    if not seqs:
        raise ValueError("empty batch")
    ids, pos, slots = [], [], []
    qlens, ctx, slens, tables = [], [], [], []
    sample_rows, sample_rids, sample_pos = [], [], []
    decode: list[int] = []
    prefill: list[int] = []
    offset = 0
    for i, s in enumerate(seqs):
        n = len(s.token_ids)
        if n < 1:
            raise ValueError(f"{s.request_id}: no new tokens")
        end = s.context_len + n
        if end > len(s.block_ids) * block_size:
            raise ValueError(f"{s.request_id}: {end} tokens but only {len(s.block_ids)} blocks of {block_size}")
        if 0 in s.block_ids:
            raise ValueError(f"{s.request_id}: block table holds the null block")
        p = np.arange(s.context_len, end, dtype=np.int64)
        table = np.asarray(s.block_ids, dtype=np.int64)
        ids.append(np.asarray(s.token_ids, dtype=np.int64) % vocab_size)
        pos.append(p)
        slots.append(table[p // block_size] * block_size + p % block_size)
        qlens.append(n)
        ctx.append(s.context_len)
        slens.append(end)
        tables.append(list(s.block_ids))
        (decode if n == 1 else prefill).append(i)
        if s.sample:
            sample_rows.append(offset + n - 1)
            sample_rids.append(s.request_id)
            sample_pos.append(end - 1)
        offset += n
    max_blocks = max(-(-sl // block_size) for sl in slens)
    bt = np.zeros((len(seqs), max_blocks), dtype=np.int32)
    for i, t in enumerate(tables):
        used = -(-slens[i] // block_size)
        bt[i, :used] = t[:used]
    qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    dev = torch.device(device)

    def put(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev, non_blocking=False)

    return StepBatch(
        request_ids=[s.request_id for s in seqs],
        input_ids=put(np.concatenate(ids)),
        positions=put(np.concatenate(pos)),
        slot_mapping=put(np.concatenate(slots)),
        query_start_loc=put(qsl),
        seq_lens_t=put(np.asarray(slens, dtype=np.int32)),
        block_table=put(bt),
        query_lens=qlens,
        context_lens=ctx,
        seq_lens=slens,
        block_tables=tables,
        block_size=block_size,
        sample_rows=put(np.asarray(sample_rows, dtype=np.int64)),
        sample_request_ids=sample_rids,
        sample_positions=sample_pos,
        decode_seqs=decode,
        prefill_seqs=prefill,
    )
