"""Paged attention for the torch backend: the reference path, the fast CUDA paths, the choice.

Implementations (``name``: where it runs), one module each:

* ``reference`` (CPU, CUDA; :mod:`~gpu_backend.attention.reference`): per sequence, gather K/V
  through the block table, expand GQA heads, SDPA with an explicit bottom-right boolean mask. The
  correctness oracle for everything else;
* ``flash_paged`` / ``flash_gather`` (CUDA; :mod:`~gpu_backend.attention.flash`): torch's
  ``varlen_attn`` over the paged pool, or over gathered K/V of the prefill sequences;
* ``triton`` (CUDA with Triton, CPU under ``TRITON_INTERPRET=1``;
  :mod:`~gpu_backend.attention.triton_paged`): decode sequences, the kernel of
  :mod:`gpu_backend.attention.triton_decode`.

:class:`SplitAttention` (:mod:`~gpu_backend.attention.split`) sends decode and prefill sequences
to two implementations; :func:`select_attention` (:mod:`~gpu_backend.attention.select`) probes the
candidates and builds it. The contract every implementation keeps is in
:mod:`~gpu_backend.attention.base`.

This package's public names are re-exported here. Imports torch; never imported by ``sim``.
"""

from gpu_backend.attention.base import Attention, AttentionImpl, Subset
from gpu_backend.attention.flash import FlashGatherAttention, FlashPagedAttention
from gpu_backend.attention.reference import ReferenceAttention
from gpu_backend.attention.select import ATTENTION_CHOICES, probe_attention, select_attention
from gpu_backend.attention.split import SplitAttention
from gpu_backend.attention.triton_paged import TritonDecodeAttention

__all__ = [
    "ATTENTION_CHOICES", "Attention", "AttentionImpl", "FlashGatherAttention", "FlashPagedAttention",
    "ReferenceAttention", "SplitAttention", "Subset", "TritonDecodeAttention", "probe_attention", "select_attention",
]
