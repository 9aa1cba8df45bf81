"""A Llama-style decoder with seeded random weights: RMSNorm, RoPE, GQA attention, SwiGLU MLP.

Weights are drawn on the target device from ``torch.Generator(device).manual_seed(seed)`` (normal,
std ``1/sqrt(fan_in)``; norms are ones), so Llama-3-8B shapes are built directly on a GPU without
materialising anything on the CPU. The same seed gives the same weights on the same device type
(CPU and CUDA generators differ). Trained weights are not needed: timing depends on shapes, and the
property under test -- cached KV equals recomputed KV -- holds for any weights.

Two forward passes share every piece but attention:

* :meth:`LlamaModel.forward` runs a flattened step batch over the paged KV cache: per layer it
  writes the batch's new K/V through the slot mapping *before* attention reads any history, so a
  request may hit blocks another request of the same step is computing (as in vLLM);
* :meth:`LlamaModel.dense_logits` is the oracle: a plain causal forward over one whole sequence,
  no cache, no paging, returning float32 logits for every position.

RoPE uses the rotate-half convention with base 500,000 (Llama-3) and no long-context scaling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from gpu_backend.attention.base import Attention
from gpu_backend.layout.batch import StepBatch
from gpu_backend.layout.kv_cache import PagedKVCache
from gpu_backend.layout.shapes import RMS_EPS, ROPE_THETA
from sim.timing.roofline import ModelSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(Hq + 2 Hkv) * D, H]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [H, Hq * D]
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 I, H]
    down: torch.Tensor  # [H, I]


class LlamaModel:
    """Weights plus the two forward passes (no ``nn.Module``: nothing here is trained)."""

    def __init__(self, spec: ModelSpec, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 seed: int = 0, rope_theta: float = ROPE_THETA, rms_eps: float = RMS_EPS) -> None:
        self.spec = spec
        self.dtype = dtype
        self.device = torch.device(device)
        self.rms_eps = rms_eps
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
        self.scale = 1.0 / math.sqrt(self.head_dim)
        h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * d
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)

        def normal(shape: tuple[int, ...], std: float) -> torch.Tensor:
            w = torch.randn(shape, generator=gen, device=self.device, dtype=torch.float32)
            return w.mul_(std).to(dtype)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=self.device, dtype=dtype)

        self.embed = normal((spec.vocab_size, h), 1.0)
        self.layers: list[_Layer] = []
        for _ in range(spec.num_layers):
            self.layers.append(
                _Layer(
                    input_norm=ones(h),
                    qkv=normal((qkv_out, h), h ** -0.5),
                    qkv_bias=normal((qkv_out,), 0.02) if spec.qkv_bias else None,
                    o=normal((h, self.num_heads * d), (self.num_heads * d) ** -0.5),
                    post_norm=ones(h),
                    gate_up=normal((2 * inter, h), h ** -0.5),
                    down=normal((h, inter), inter ** -0.5),
                )
            )
        self.final_norm = ones(h)
        self.lm_head = self.embed if spec.tie_word_embeddings else normal((spec.vocab_size, h), h ** -0.5)
        self.inv_freq = 1.0 / (rope_theta ** (torch.arange(0, d, 2, device=self.device, dtype=torch.float32) / d))

    # -- pieces -------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    def num_parameters(self) -> int:
        n = self.embed.numel() + self.final_norm.numel() + (0 if self.lm_head is self.embed else self.lm_head.numel())
        for layer in self.layers:
            n += sum(t.numel() for t in vars(layer).values() if t is not None)
        return n

    def _rms_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.rms_eps)
        return xf.to(self.dtype) * w

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        return freqs.cos()[:, None, :], freqs.sin()[:, None, :]  # [T, 1, D/2]

    @staticmethod
    def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    def _qkv(self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = x.shape[0]
        h = self._rms_norm(x, layer.input_norm)
        qkv = F.linear(h, layer.qkv, layer.qkv_bias)
        nq, nkv, d = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.head_dim
        q = qkv[:, :nq].view(t, self.num_heads, d)
        k = qkv[:, nq : nq + nkv].view(t, self.num_kv_heads, d)
        v = qkv[:, nq + nkv :].view(t, self.num_kv_heads, d)
        return self._apply_rope(q, cos, sin), self._apply_rope(k, cos, sin), v.contiguous()

    def _finish_layer(self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + F.linear(attn.reshape(x.shape[0], -1), layer.o)
        h = self._rms_norm(x, layer.post_norm)
        gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, layer.down)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of already-normed hidden states."""
        return F.linear(hidden, self.lm_head).float()

    # -- paged forward ------------------------------------------------------------------------
    def forward(self, batch: StepBatch, cache: PagedKVCache, attention: Attention) -> torch.Tensor:
        """Final-normed hidden states ``[T, H]`` of a step batch; writes its K/V into ``cache``."""
        x = self.embed[batch.input_ids]
        cos, sin = self._rope(batch.positions)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            cache.write(i, k, v, batch.slot_mapping)
            attn = attention(q, cache.k[i], cache.v[i], batch, self.scale)
            x = self._finish_layer(layer, x, attn)
        return self._rms_norm(x, self.final_norm)

    # -- the oracle ---------------------------------------------------------------------------
    @torch.no_grad()
    def dense_logits(self, token_ids: Sequence[int] | np.ndarray | torch.Tensor,
                     positions: Sequence[int] | None = None) -> torch.Tensor:
        """Logits ``[L, V]`` (float32) of a plain causal forward over a whole sequence, no cache (only
        the rows at ``positions``, in that order, when given: long sequences)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long) % self.vocab_size
        ids = ids.to(self.device)
        x = self.embed[ids]
        cos, sin = self._rope(torch.arange(ids.shape[0], device=self.device))
        group = self.num_heads // self.num_kv_heads
        for layer in self.layers:
            q, k, v = self._qkv(layer, x, cos, sin)
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            # square attention: is_causal=True is exactly right here (query length == key length)
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                               v.transpose(0, 1)[None], is_causal=True, scale=self.scale)
            x = self._finish_layer(layer, x, o[0].transpose(0, 1))
        if positions is not None:
            x = x[torch.as_tensor(list(positions), dtype=torch.long, device=self.device)]
        return self.logits(self._rms_norm(x, self.final_norm))
