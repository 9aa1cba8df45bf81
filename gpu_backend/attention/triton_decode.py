"""A Triton paged-attention kernel for decode queries (one new token per sequence).

Flash-decoding over the paged pool, written for this project: program ``(seq, kv_head, split)``
loads the ``GROUP`` query heads that share ``kv_head`` (GQA) once, walks its share of the
sequence's tokens in tiles of ``TILE`` tokens -- each token's K/V row found through the block table
(``block_table[tok // PAGE]``) -- and keeps an online softmax (running max ``m``, sum ``l``,
unnormalised accumulator). Splits of one sequence are merged afterwards with their ``m``/``l``
(log-sum-exp rescaling). Each K/V row is read exactly once per step, so the kernel is
memory-bound by design; the benchmark reports its HBM bandwidth.

A decode query is the last token of its sequence, so no causal mask is needed: it attends to all
``seq_len`` keys. fp32 inputs use IEEE dot products (``input_precision="ieee"``), not TF32; bf16
inputs use bf16 dot products with fp32 accumulation (under the interpreter, whose bf16 ``tl.dot`` is
broken in Triton 3.6, operands are upcast to fp32 instead).

Import only where ``triton`` is installed. ``TRITON_INTERPRET=1`` (set before importing this
module) runs the kernel on CPU tensors with Triton's interpreter, which is how it is tested
without a GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _tile(  # type: ignore[no-untyped-def]  # typed by triton
    K, V, BT, q, m_i, l_i, acc, start, t_end, b, kvh, scale, d, dmask,
    stride_kb, stride_kt, stride_kh, stride_btb,
    PAGE: tl.constexpr, TILE: tl.constexpr, IEEE: tl.constexpr,
):
    """One tile of ``TILE`` tokens from ``start``: scores, online-softmax update, weighted values."""
    tok = start + tl.arange(0, TILE)
    valid = tok < t_end
    page = tl.load(BT + b * stride_btb + tok // PAGE, mask=valid, other=0)
    row = page.to(tl.int64) * stride_kb + (tok % PAGE).to(tl.int64) * stride_kt + kvh * stride_kh
    kv_mask = valid[:, None] & dmask[None, :]
    k = tl.load(K + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if IEEE:  # fp32 operands (fp32 caches, or the CPU interpreter, whose bf16 dot is broken)
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(valid[None, :], s * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a fully masked tile before any key: p = alpha = 0
    p = tl.exp(s - m_ref[:, None])
    alpha = tl.exp(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if IEEE:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _paged_decode_partial(  # type: ignore[no-untyped-def]  # typed by triton (pointers, tl.constexpr)
    Q, K, V, BT, SEQ_LENS, ACC, M, L,
    scale,
    num_splits,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_btb,
    stride_ab, stride_ah, stride_as,
    stride_mb, stride_mh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    TILE: tl.constexpr,
    IEEE: tl.constexpr,
    HOST_LOOP: tl.constexpr,
    LOOP_TILES: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    seq_len = tl.load(SEQ_LENS + b)
    num_tiles = tl.cdiv(seq_len, TILE)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    t_begin = sp * tiles_per_split * TILE
    t_end = tl.minimum(t_begin + tiles_per_split * TILE, seq_len)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D_PAD)
    gmask = g < GROUP
    dmask = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=gmask[:, None] & dmask[None, :],
        other=0.0,
    )
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    if HOST_LOOP:
        # the interpreter cannot bound a range() by loaded values or scalar arguments (numpy >= 2.3
        # refuses to turn a 1-element array into an int): loop a host-computed tile count (a
        # constexpr, 0 and unused on a GPU, so it never forces a recompile there), masked past t_end
        for it in range(0, LOOP_TILES):
            m_i, l_i, acc = _tile(K, V, BT, q, m_i, l_i, acc, t_begin + it * TILE, t_end, b, kvh, scale, d, dmask,
                                  stride_kb, stride_kt, stride_kh, stride_btb, PAGE, TILE, IEEE)
    else:
        for start in range(t_begin, t_end, TILE):
            m_i, l_i, acc = _tile(K, V, BT, q, m_i, l_i, acc, start, t_end, b, kvh, scale, d, dmask,
                                  stride_kb, stride_kt, stride_kh, stride_btb, PAGE, TILE, IEEE)
    out_mask = gmask[:, None] & dmask[None, :]
    tl.store(ACC + b * stride_ab + heads[:, None] * stride_ah + sp * stride_as + d[None, :], acc, mask=out_mask)
    tl.store(M + b * stride_mb + heads * stride_mh + sp, m_i, mask=gmask)
    tl.store(L + b * stride_mb + heads * stride_mh + sp, l_i, mask=gmask)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def default_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, tile: int, device: torch.device) -> int:
    """Enough programs for a few waves over the GPU's multiprocessors, never more splits than tiles."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        want = -(-4 * sms // max(1, num_seqs * num_kv_heads))
    else:
        want = 2  # interpreter: exercise the split merge without many programs
    return max(1, min(want, -(-max_seq_len // tile)))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_seq_len: int,
    tile: int = 64,
    num_splits: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged history.

    ``q``: ``[B, Hq, D]``; caches ``[num_blocks, page, Hkv, D]``; ``block_table``: ``[B, max_blocks]``
    int32; ``seq_lens``: ``[B]`` int32 (history including the query token, whose K/V is already
    written). Returns ``[B, Hq, D]`` in ``q``'s dtype.
    """
    bsz, num_heads, head_dim = q.shape
    _, page, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    if k_cache.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError("the head dimension must be contiguous")
    splits = num_splits or default_num_splits(bsz, num_kv_heads, max_seq_len, tile, q.device)
    acc = torch.empty((bsz, num_heads, splits, head_dim), dtype=torch.float32, device=q.device)
    m = torch.empty((bsz, num_heads, splits), dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    sl = seq_lens if seq_lens.dtype == torch.int32 else seq_lens.to(torch.int32)
    _paged_decode_partial[(bsz, num_kv_heads, splits)](
        q, k_cache, v_cache, bt, sl, acc, m, l_sum,
        float(scale),
        splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        bt.stride(0),
        acc.stride(0), acc.stride(1), acc.stride(2),
        m.stride(0), m.stride(1),
        GROUP=group,
        GROUP_PAD=max(16, _next_pow2(group)),
        HEAD_DIM=head_dim,
        D_PAD=max(16, _next_pow2(head_dim)),
        PAGE=page,
        TILE=tile,
        IEEE=q.dtype == torch.float32 or _INTERPRET,
        HOST_LOOP=_INTERPRET,
        LOOP_TILES=-(-(-(-max_seq_len // tile)) // splits) if _INTERPRET else 0,  # tiles per split, longest seq
        num_warps=num_warps,
        num_stages=num_stages,
    )
    # merge the splits: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s
    m_max = m.amax(dim=-1, keepdim=True)
    w = torch.exp(m - m_max)  # empty splits have m = -inf -> weight 0
    denom = (l_sum * w).sum(-1)
    out = (acc * w.unsqueeze(-1)).sum(-2) / denom.unsqueeze(-1)
    return out.to(q.dtype)
