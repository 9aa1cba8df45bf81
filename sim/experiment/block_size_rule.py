"""Which KV-cache block sizes vLLM 0.25.1 starts with (mirrors its attention-backend selection).

vLLM validates ``--block-size`` when it picks an attention backend, not in ``CacheConfig`` (whose
``block_size`` only needs ``gt=0``): ``CudaPlatform.get_attn_backend_cls`` /
``get_valid_backends`` (``vllm/platforms/cuda.py``) call each candidate's
``AttentionBackend.validate_configuration``, which adds ``"block_size not supported"`` unless
``AttentionBackend.supports_block_size`` (``vllm/v1/attention/backend.py``) holds: the block size
is a multiple of one of the backend's ``get_supported_kernel_block_sizes()`` (a ``MultipleOf(n)``
counts as ``n``; "with hybrid_blocks the framework-level block size only needs to be a multiple of
the kernel's requirement"). When no candidate is left vLLM raises ``ValueError("No valid
attention backend found for cuda ...")`` and does not start.

For the models apcsim knows (Llama, Qwen, Mistral: standard multi-head / grouped-query
attention, not MLA) the CUDA candidates are FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION
and TURBOQUANT (``_get_backend_priorities``); their kernel block sizes are ``MultipleOf(16)``,
``[16, 32, 64]`` (``[16, ..., 1024]`` on Blackwell), ``MultipleOf(16)``, ``MultipleOf(16)`` and
``[16, 32, 64, 128]``. So a block size is accepted exactly when it is a multiple of
:data:`KERNEL_BLOCK_ALIGNMENT` (16): 16, 32, 48, ..., and 7, 8 or 24 are refused. The CPU backend
(``cpu_attn.py``) asks the same, ``MultipleOf(16)``. The rule applies to every attention group's
block size (``engine.block_size``, each ``engine.kv_cache_groups[i].block_size``); the hash block
size (``engine.hash_block_size``) is not a kernel block size and may be finer (vLLM's
``CacheConfig.hash_block_size`` docstring: "e.g. 8").

Where it applies: to config files (``sim.experiment.config.load_config``, sweep points), i.e. to
what ``vllm serve`` would start. vLLM's bare ``Scheduler`` takes any block size -- the oracle
harness ``tools/vllm_oracle`` drives it at sizes 1, 2, 3 and 17, and ``tests/test_vllm_agreement.py``
replays those through ``config_from_dict`` without the start-up checks.

Invariants: pure function of an int; raises ``ValueError`` (pydantic reports it as the key's
problem). Imports nothing.
"""

from __future__ import annotations

KERNEL_BLOCK_ALIGNMENT = 16
"""Every non-MLA CUDA attention backend of vLLM 0.25.1 needs block sizes that are multiples of 16."""


def check_block_size(block_size: int) -> int:
    """``block_size`` if vLLM 0.25.1 has an attention backend for it, else ``ValueError``."""
    if block_size % KERNEL_BLOCK_ALIGNMENT:
        raise ValueError(
            f"vLLM 0.25.1 has no attention backend for block size {block_size}: FLASH_ATTN, FLASHINFER, "
            f"TRITON_ATTN and FLEX_ATTENTION need a multiple of {KERNEL_BLOCK_ALIGNMENT} "
            f"(AttentionBackend.supports_block_size)"
        )
    return block_size
