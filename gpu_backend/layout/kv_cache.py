"""The paged KV cache and the executor's per-request block tables.

:class:`PagedKVCache` holds, per layer, one K and one V tensor of shape
``[num_blocks, block_size, num_kv_heads, head_dim]`` indexed by the :class:`sim.core.block_pool.BlockPool`'s
block ids (block 0 is the pool's null block: never allocated, so never written or read). New K/V
rows are written through a *slot mapping* (``slot = block_id * block_size + offset``); attention
reads a request's history only through its block table. This is the layout of vLLM's flash-attention
backend and of PyTorch's ``varlen_attn(block_table=...)``.

:class:`BlockTables` is the model runner's mirror of the scheduler's allocation, rebuilt from the
``SchedulerOutput`` stream alone, exactly as vLLM's ``GPUModelRunner._update_states`` does:

* ids in ``finished_req_ids`` (requests finished in the *previous* step) are dropped;
* ``preempted`` requests are dropped (they come back later as admitted requests);
* an admitted request arrives with its *full* block list (prefix hits first), which replaces
  nothing -- a request id may not already be present;
* a running request's ``new_block_ids`` are appended.

:meth:`BlockTables.verify` asserts the mirror equals ``KVCacheManager.get_block_ids`` for every
request holding blocks, and the tracked computed-token counts match the scheduler's view.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.kv_cache_manager import KVCacheManager
    from sim.core.scheduler_output import SchedulerOutput


class PagedKVCache:
    """K and V block pools for every layer; ``fill`` initialises every slot (tests use NaN, so
    that reading a slot nothing wrote poisons the result)."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        fill: float = 0.0,
    ) -> None:
        if num_blocks < 2:
            raise ValueError("need at least 2 blocks (block 0 is the null block)")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k = [torch.full(shape, fill, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v = [torch.full(shape, fill, dtype=dtype, device=self.device) for _ in range(num_layers)]

    @property
    def nbytes(self) -> int:
        return 2 * self.num_layers * self.k[0].numel() * self.k[0].element_size()

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store ``k``/``v`` (``[tokens, kv_heads, head_dim]``) at their slots (vLLM's ``reshape_and_cache``)."""
        kf = self.k[layer].view(-1, self.num_kv_heads, self.head_dim)
        vf = self.v[layer].view(-1, self.num_kv_heads, self.head_dim)
        kf.index_copy_(0, slot_mapping, k.to(self.dtype))
        vf.index_copy_(0, slot_mapping, v.to(self.dtype))

    def corrupt_block(self, block_id: int, amount: float = 1.0) -> None:
        """Add ``amount`` to every K and V entry of one block in every layer (a negative control)."""
        for layer in range(self.num_layers):
            self.k[layer][block_id] += amount
            self.v[layer][block_id] += amount


class BlockTables:
    """Per-request block ids and computed-token counts, mirrored from the scheduler's outputs."""

    def __init__(self) -> None:
        self.tables: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}

    def apply(self, output: SchedulerOutput) -> None:
        """Update from one step's output (before its forward pass); raises on an inconsistent stream."""
        for rid in output.finished_req_ids:
            self.tables.pop(rid, None)
            self.computed.pop(rid, None)
        for r in output.preempted:
            self.tables.pop(r.request_id, None)
            self.computed.pop(r.request_id, None)
        for s in output.scheduled:
            rid = s.request.request_id
            if s.admitted:
                if rid in self.tables:
                    raise AssertionError(f"{rid}: admitted while the runner still holds its state")
                if s.num_computed_before != s.hit_tokens + s.external_hit_tokens:  # GPU hit + CPU-tier load
                    raise AssertionError(f"{rid}: admitted after {s.num_computed_before} tokens, hit {s.hit_tokens} "
                                         f"+ {s.external_hit_tokens} loaded")
                self.tables[rid] = list(s.new_block_ids)
            else:
                if rid not in self.tables:
                    raise AssertionError(f"{rid}: scheduled as running but unknown to the runner")
                if s.num_computed_before != self.computed[rid]:
                    raise AssertionError(
                        f"{rid}: scheduler says {s.num_computed_before} computed, runner has {self.computed[rid]}"
                    )
                self.tables[rid].extend(s.new_block_ids)
            self.computed[rid] = s.num_computed_before + s.num_new_tokens

    def verify(self, kv_manager: KVCacheManager, loading: Collection[str] = ()) -> None:
        """Assert the mirror equals the KV-cache manager's allocation, request by request; ``loading``:
        requests holding blocks for a CPU-tier load, not scheduled yet (the runner meets them at
        admission, as vLLM's model runner does)."""
        expected = {rid: kv_manager.get_block_ids(rid) for rid in kv_manager.request_ids() if rid not in loading}
        if expected != self.tables:
            bad = sorted(set(expected) ^ set(self.tables)) or sorted(
                rid for rid in expected if expected[rid] != self.tables[rid]
            )
            rid = bad[0]
            raise AssertionError(
                f"runner block table differs from the KV manager for {rid}: "
                f"runner {self.tables.get(rid)} vs manager {expected.get(rid)}"
            )
