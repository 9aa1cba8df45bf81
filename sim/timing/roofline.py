"""Model and GPU specs, vLLM's KV-cache budget, and a roofline step-latency model.

Specs ship as package data (``sim/timing/specs/models.yaml``, ``sim/timing/specs/gpus.yaml``; their headers
document the schema and where the numbers come from). Loaders also accept a path to a user YAML
file with the same fields. Imports neither simpy nor torch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from sim.core.executor import StepShape
from sim.core.step_price import RooflinePrice
from sim.timing.latency import LatencyModel

GIB = 1 << 30


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a dense decoder-only transformer (GQA attention, SwiGLU MLP, RMSNorm)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    dtype_bytes: int = 2
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    hf_ids: tuple[str, ...] = field(default=(), compare=False)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters the lm_head multiplies by (the embedding matrix itself when tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def params_per_layer(self) -> int:
        q, kv, h = self.num_attention_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.hidden_size
        attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate_size  # gate, up, down
        return attention + mlp + 2 * h  # + input and post-attention RMSNorm

    @property
    def non_embedding_params(self) -> int:
        """Transformer layers plus the final norm (neither embedding nor lm_head)."""
        return self.num_layers * self.params_per_layer + self.hidden_size

    @property
    def num_params(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.non_embedding_params + self.embedding_params + lm_head

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights occupy on the GPU."""
        return self.num_params * self.dtype_bytes

    @property
    def streamed_weight_bytes(self) -> int:
        """Bytes of weights one forward pass reads: all but the embedding table, which is only
        gathered row by row (unless tied, when the lm_head reads it whole)."""
        return (self.non_embedding_params + self.lm_head_params) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_block(self, block_size: int) -> int:
        return self.kv_bytes_per_token * block_size

    @property
    def dense_flops_per_token(self) -> int:
        """Matmul FLOPs per computed token in the layers (2 per non-embedding parameter)."""
        return 2 * self.non_embedding_params

    @property
    def lm_head_flops_per_token(self) -> int:
        """FLOPs of the lm_head, paid only for positions whose logits are computed."""
        return 2 * self.lm_head_params

    @property
    def flops_per_token(self) -> int:
        return self.dense_flops_per_token + self.lm_head_flops_per_token

    @property
    def attention_flops_per_pair(self) -> int:
        """QK^T plus PV for one query-key pair over all layers and query heads."""
        return 4 * self.num_layers * self.num_attention_heads * self.head_dim


@dataclass(frozen=True)
class GPUSpec:
    """Peak rates of one accelerator and the efficiencies the roofline applies to them."""

    name: str
    memory_gib: float
    hbm_bandwidth_tbps: float
    bf16_tflops: float
    usable_memory_gib: float | None = None
    mfu_prefill: float = 0.6
    mbu_decode: float = 0.8
    step_overhead_s: float = 0.004
    host_link_gb_s: float = 55.0  # GPU<->CPU copy bandwidth per direction, GB/s (gpus.yaml says where from)

    def __post_init__(self) -> None:
        for f in ("memory_gib", "hbm_bandwidth_tbps", "bf16_tflops", "host_link_gb_s"):
            if not getattr(self, f) > 0:
                raise ValueError(f"GPU spec {self.name!r}: {f} must be > 0")
        for f in ("mfu_prefill", "mbu_decode"):
            if not 0 < getattr(self, f) <= 1:
                raise ValueError(f"GPU spec {self.name!r}: {f} must be in (0, 1]")
        if not self.step_overhead_s >= 0:
            raise ValueError(f"GPU spec {self.name!r}: step_overhead_s must be >= 0")

    @property
    def memory_bytes(self) -> int:
        """Total memory as CUDA reports it (what vLLM's gpu_memory_utilization multiplies)."""
        return int((self.usable_memory_gib or self.memory_gib) * GIB)

    @property
    def peak_flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_tbps * 1e12


# ----------------------------------------------------------------------------- loading


@functools.cache
def _builtin(kind: str) -> dict[str, dict[str, Any]]:
    text = resources.files("sim.timing").joinpath("specs", f"{kind}.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _looks_like_path(name: str) -> bool:
    base = name.split("#", 1)[0]
    return base.endswith((".yaml", ".yml")) or Path(base).is_file()


def _from_file(ref: str, kind: str) -> tuple[str, dict[str, Any]]:
    """``path`` or ``path#name``: a single spec at top level, or a mapping of name -> spec."""
    path_s, _, pick = ref.partition("#")
    path = Path(path_s)
    if not path.is_file():
        raise ValueError(f"{kind} spec file not found: {path}")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of {kind} spec fields")
    if "num_layers" in data or "bf16_tflops" in data:  # one spec at top level
        fields_ = dict(data)
        return str(fields_.pop("name", path.stem)), fields_
    if pick:
        if pick not in data:
            raise ValueError(f"{path}: no {kind} spec {pick!r}; file has: {', '.join(sorted(data))}")
        return pick, data[pick]
    if len(data) != 1:
        raise ValueError(f"{path} holds several {kind} specs ({', '.join(sorted(data))}); use '{path}#NAME'")
    ((name, fields_),) = data.items()
    return str(name), fields_


def _build(cls: type, name: str, fields_: Any, where: str) -> Any:
    if not isinstance(fields_, dict):
        raise ValueError(f"{where}: spec {name!r} must be a mapping of fields")
    known = {f.name for f in dataclasses.fields(cls)} - {"name"}
    unknown = sorted(set(fields_) - known)
    if unknown:
        raise ValueError(f"{where}: spec {name!r} has unknown field(s) {unknown}; allowed: {sorted(known)}")
    required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING} - {"name"}
    missing = sorted(required - set(fields_))
    if missing:
        raise ValueError(f"{where}: spec {name!r} lacks field(s) {missing}")
    kwargs = dict(fields_)
    if "hf_ids" in kwargs:
        kwargs["hf_ids"] = tuple(kwargs["hf_ids"] or ())
    return cls(name=name, **kwargs)


def _load(name: str, kind: str, cls: type) -> Any:
    if _looks_like_path(name):
        spec_name, fields_ = _from_file(name, kind)
        return _build(cls, spec_name, fields_, name)
    table = _builtin(kind)
    key = name.lower()
    for spec_name, fields_ in table.items():
        ids = [spec_name] + list(fields_.get("hf_ids") or [])
        if key in (i.lower() for i in ids):
            return _build(cls, spec_name, fields_, f"sim/timing/specs/{kind}.yaml")
    raise ValueError(
        f"unknown {kind[:-1]} spec {name!r}; available: {', '.join(table)} "
        f"(or give the path of a YAML file with the same fields)"
    )


def load_model_spec(name: str) -> ModelSpec:
    """A built-in model by name (case-insensitive; Hugging Face ids listed in hf_ids work too),
    or ``path.yaml`` / ``path.yaml#name`` for a user file."""
    return _load(name, "models", ModelSpec)


def load_gpu_spec(name: str) -> GPUSpec:
    """A built-in GPU by name (case-insensitive), or ``path.yaml`` / ``path.yaml#name``."""
    return _load(name, "gpus", GPUSpec)


def list_model_specs() -> list[str]:
    return list(_builtin("models"))


def list_gpu_specs() -> list[str]:
    return list(_builtin("gpus"))


def _as_model(model: ModelSpec | str) -> ModelSpec:
    return load_model_spec(model) if isinstance(model, str) else model


def _as_gpu(gpu: GPUSpec | str) -> GPUSpec:
    return load_gpu_spec(gpu) if isinstance(gpu, str) else gpu


# ----------------------------------------------------------------------------- KV-cache budget

#: Memory outside the weights that is neither proportional to the batch nor KV cache: CUDA/NCCL/cuBLAS
#: workspaces ("non_torch_memory", ~0.2 GiB in vLLM's logs) plus the sampler's dummy run and allocator
#: slack. vLLM's profile of Llama-3-8B on H100 reports 1.26 GiB activation peak at 8192 batched tokens
#: (vllm-project/vllm#10511); FIXED + 8192 * per-token below gives ~1.5 GiB for that model.
ACTIVATION_FIXED_GIB = 0.5


def estimate_activation_bytes(model: ModelSpec, max_num_batched_tokens: int = 8192) -> int:
    """Peak non-KV, non-weight memory of vLLM's profiling run, estimated as
    ``ACTIVATION_FIXED_GIB + max_num_batched_tokens * dtype_bytes * (3*intermediate + 4*hidden + qkv)``:
    per token, the MLP's gate/up output and its activation, residual and normed hidden states and the
    fused q/k/v projection live at once at the peak. CUDA-graph memory is not counted (as in vLLM)."""
    qkv = (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim
    per_token = model.dtype_bytes * (3 * model.intermediate_size + 4 * model.hidden_size + qkv)
    return int(ACTIVATION_FIXED_GIB * GIB) + max_num_batched_tokens * per_token


def kv_cache_blocks(
    model: ModelSpec | str,
    gpu: GPUSpec | str,
    block_size: int,
    gpu_memory_utilization: float = 0.92,
    kv_cache_gib: float | None = None,
    *,
    max_num_batched_tokens: int = 8192,
    activation_gib: float | None = None,
) -> int:
    """Number of KV-cache blocks vLLM would allocate, the null block 0 included.

    ``available = usable_memory * gpu_memory_utilization - weight_bytes - activation`` (activation from
    :func:`estimate_activation_bytes` unless ``activation_gib`` is given), or ``kv_cache_gib`` GiB
    outright; ``num_blocks = floor(available / (kv_bytes_per_token * block_size))``. Raises
    ValueError when fewer than two blocks fit (vLLM could not serve a single token).
    """
    model, gpu = _as_model(model), _as_gpu(gpu)
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    if kv_cache_gib is not None:
        available = kv_cache_gib * GIB
        how = f"kv_cache_gib={kv_cache_gib}"
    else:
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        budget = gpu.memory_bytes * gpu_memory_utilization
        if activation_gib is not None:
            act = activation_gib * GIB
        else:
            act = estimate_activation_bytes(model, max_num_batched_tokens)
        available = budget - model.weight_bytes - act
        how = (
            f"{gpu.name}: {gpu.memory_bytes / GIB:.2f} GiB x {gpu_memory_utilization} = {budget / GIB:.2f} GiB"
            f" - weights {model.weight_bytes / GIB:.2f} GiB - activations {act / GIB:.2f} GiB"
            f" = {available / GIB:.2f} GiB"
        )
    block_bytes = model.kv_bytes_per_block(block_size)
    num_blocks = math.floor(available / block_bytes) if available > 0 else 0
    if num_blocks <= 1:
        raise ValueError(
            f"no room for a KV cache for {model.name}: {how}, block of {block_size} tokens = "
            f"{block_bytes / 2**20:.2f} MiB -> {num_blocks} blocks (need >= 2)"
        )
    return num_blocks


# ----------------------------------------------------------------------------- roofline


class RooflineLatency(LatencyModel):
    """Step time = max(compute time, memory time) + a fixed per-step overhead.

    * compute: ``FLOPs / (bf16_tflops * mfu_prefill)`` with
      ``FLOPs = dense_flops_per_token * num_new_tokens + lm_head_flops_per_token * num_seqs
      + attention_flops_per_pair * attention_pairs`` (lm_head once per sequence: every scheduled
      sequence is taken to sample, which over-counts only partial prefill chunks);
    * memory: ``(streamed_weight_bytes + kv_bytes_per_token * (kv_read_tokens + num_new_tokens))
      / (bandwidth * mbu_decode)``: weights once, K/V read for context and new tokens, K/V written
      for new tokens; activations neglected;
    * overhead: ``overhead_s`` or the GPU's ``step_overhead_s``.

    Sanity checks (llama-3-8b, H100-SXM, 4 ms overhead):

    * decode, batch 1, 1k context: memory-bound, 15.0e9 B / (3.35e12 B/s * 0.8) = 5.6 ms, plus KV
      0.05 ms -> 5.7 ms + 4 ms = 9.7 ms (the hand estimate with 16 GB of weights is ~6 ms);
    * prefill of 8192 tokens: compute-bound, 2 * 7.0e9 * 8192 / (989e12 * 0.6) = 0.19 s, plus causal
      attention 4*32*32*128 * 33.6e6 pairs / 593e12 = 0.03 s -> ~0.23 s (hand estimate ~0.2 s).
    * on H200 the decode drops to 3.9 ms + overhead (4.8 TB/s), the prefill is unchanged (same FLOP/s).
    """

    name = "roofline"

    def __init__(self, model: ModelSpec, gpu: GPUSpec, overhead_s: float | None = None) -> None:
        self.model = _as_model(model)
        self.gpu = _as_gpu(gpu)
        self.overhead_s = float(self.gpu.step_overhead_s if overhead_s is None else overhead_s)
        if not self.overhead_s >= 0:
            raise ValueError(f"overhead_s must be >= 0, got {overhead_s}")
        m, g = self.model, self.gpu
        self._flops_per_s = g.peak_flops * g.mfu_prefill
        self._bytes_per_s = g.bandwidth_bytes_per_s * g.mbu_decode
        self._dense = float(m.dense_flops_per_token)
        self._lm_head = float(m.lm_head_flops_per_token)
        self._attn = float(m.attention_flops_per_pair)
        self._weights = float(m.streamed_weight_bytes)
        self._kv = float(m.kv_bytes_per_token)

    @classmethod
    def from_names(cls, model: str, gpu: str, overhead_s: float | None = None) -> RooflineLatency:
        return cls(load_model_spec(model), load_gpu_spec(gpu), overhead_s)

    def compute_time(self, s: StepShape) -> float:
        flops = self._dense * s.num_new_tokens + self._lm_head * s.num_seqs + self._attn * s.attention_pairs
        return flops / self._flops_per_s

    def memory_time(self, s: StepShape) -> float:
        return (self._weights + self._kv * (s.context_tokens + 2 * s.num_new_tokens)) / self._bytes_per_s

    def step_time(self, shape: StepShape) -> float:
        s = shape
        flops = self._dense * s.num_new_tokens + self._lm_head * s.num_seqs + self._attn * s.attention_pairs
        compute = flops / self._flops_per_s
        memory = (self._weights + self._kv * (s.context_tokens + 2 * s.num_new_tokens)) / self._bytes_per_s
        return (compute if compute > memory else memory) + self.overhead_s

    def step_price(self) -> RooflinePrice:
        """The same step time as compiled arithmetic over a step's sums (``sim.core.step_price``:
        the decode fast-forward's pricing, equal to :meth:`step_time` bit for bit)."""
        return RooflinePrice(self._dense, self._lm_head, self._attn, self._flops_per_s, self._weights, self._kv,
                             self._bytes_per_s, self.overhead_s)

    def describe(self) -> dict[str, object]:
        m, g = self.model, self.gpu
        return {
            "name": self.name,
            "model": {**dataclasses.asdict(m), "hf_ids": list(m.hf_ids)},
            "gpu": dataclasses.asdict(g),
            "overhead_s": self.overhead_s,
            "mfu_prefill": g.mfu_prefill,
            "mbu_decode": g.mbu_decode,
            "num_params": m.num_params,
            "streamed_weight_bytes": m.streamed_weight_bytes,
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "effective_flops_per_s": self._flops_per_s,
            "effective_bytes_per_s": self._bytes_per_s,
        }
