"""The CPU side of the offload tier on the real backend: a host KV store with the paged cache's block
layout, and block copies between it and the device cache (mirrors vLLM 0.33.0's
``CPUOffloadingWorker`` and ``SingleDirectionOffloadingHandler`` in
``vllm/v1/kv_offload/cpu/gpu_worker.py``, re-expressed over this package's per-layer K/V tensors).

Layout: per layer one K and one V tensor of shape ``[num_chunks * blocks_per_chunk, block_size,
num_kv_heads, head_dim]`` -- a CPU chunk ``c`` holds the GPU-sized sub-blocks ``c * blocks_per_chunk
.. (c + 1) * blocks_per_chunk - 1``, as vLLM's CPU page of ``gpu_page_size * blocks_per_chunk``
bytes does. The host tensors are pinned when the device cache is on CUDA (vLLM's ``PIN_MEMORY``), so
copies are true DMA and can run asynchronously; on a CPU device they are plain tensors and a
"transfer" is a host-to-host copy.

A :class:`CopyQueue` is one direction (device -> host stores, or host -> device loads), FIFO like
vLLM's handler: on CUDA every transfer goes on the queue's own stream, which first waits for the
compute stream (a store must not read KV the forward has not written; a load must not race the
compute stream's earlier writes of its destination blocks), and records a start and an end event --
the end event says when it is done (``done``), the pair how long it took. On a CPU device the copy
runs at submission and is done at once; its time is ``clock`` around it (the wall clock, or the
thread's CPU time, which leaves out the time the process is descheduled on a shared machine: with
one torch thread the copy runs on the calling thread). Copies are coalesced
on the host side: a stretch of consecutive host rows is one copy per tensor, its device blocks taken
as a slice when consecutive too, else gathered (a store: ``index_select`` on the device, then one
copy to the host rows) or scattered (a load: one copy of the host rows to the device, then
``index_copy_``) -- a fragmented block table costs two calls per tensor and host run, not one per
block (vLLM batches one DMA descriptor per block in one call, ``swap_blocks_batch``).

Invariants: a queue reports its transfers in submission order, each once; ``bytes_per_block`` is
the KV bytes of one GPU block over all layers (K and V). Imports torch (this package only).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from gpu_backend.layout.kv_cache import PagedKVCache


class CPUKVStore:
    """Host K/V tensors for ``num_chunks`` chunks of ``blocks_per_chunk`` blocks of ``cache``'s shape."""

    def __init__(self, cache: PagedKVCache, num_chunks: int, blocks_per_chunk: int = 1, *,
                 pin: bool | None = None) -> None:
        if num_chunks < 1 or blocks_per_chunk < 1:
            raise ValueError(f"a CPU store needs >= 1 chunk of >= 1 block, got {num_chunks} x {blocks_per_chunk}")
        self.num_chunks = num_chunks
        self.blocks_per_chunk = blocks_per_chunk
        self.pinned = cache.device.type == "cuda" if pin is None else pin
        shape = (num_chunks * blocks_per_chunk, cache.block_size, cache.num_kv_heads, cache.head_dim)
        self.k = [torch.zeros(shape, dtype=cache.dtype, pin_memory=self.pinned) for _ in range(cache.num_layers)]
        self.v = [torch.zeros(shape, dtype=cache.dtype, pin_memory=self.pinned) for _ in range(cache.num_layers)]

    @property
    def tensors(self) -> list[torch.Tensor]:
        """K and V of every layer, in the order of :func:`device_tensors`."""
        return [t for pair in zip(self.k, self.v) for t in pair]

    def sub_blocks(self, chunk_ids: Sequence[int], skip: int = 0, count: int | None = None) -> list[int]:
        """Query: the GPU-sized sub-block rows of ``chunk_ids``, in order, the first ``skip`` left out,
        at most ``count`` of them (vLLM ``compute_sub_block_ptrs``' expansion and skip_count)."""
        bpc = self.blocks_per_chunk
        rows = [c * bpc + j for c in chunk_ids for j in range(bpc)][skip:]
        return rows if count is None else rows[:count]

    def corrupt_chunk(self, chunk_id: int, amount: float = 1.0) -> None:
        """Add ``amount`` to every K and V entry of one chunk (a negative control)."""
        bpc = self.blocks_per_chunk
        for t in self.tensors:
            t[chunk_id * bpc : (chunk_id + 1) * bpc] += amount


def device_tensors(cache: PagedKVCache) -> list[torch.Tensor]:
    """K and V of every layer of the device cache, in the order of :attr:`CPUKVStore.tensors`."""
    return [t for pair in zip(cache.k, cache.v) for t in pair]


def host_runs(host: Sequence[int], device: Sequence[int]) -> list[tuple[int, list[int]]]:
    """``(first host row, device ids)`` of the maximal stretches of consecutive host rows."""
    if len(host) != len(device):
        raise ValueError(f"a copy needs as many host rows as device blocks ({len(host)} != {len(device)})")
    out: list[tuple[int, list[int]]] = []
    for h, d in zip(host, device):
        if out and h == out[-1][0] + len(out[-1][1]):
            out[-1][1].append(d)
        else:
            out.append((h, [d]))
    return out


@dataclass
class Transfer:
    """One submitted copy; ``seconds`` is known at once on a CPU, from the events on CUDA."""

    job_id: int
    num_bytes: int
    start: torch.cuda.Event | None = None
    end: torch.cuda.Event | None = None
    seconds: float | None = None

    def is_done(self) -> bool:
        return self.end is None or bool(self.end.query())

    def elapsed_s(self) -> float:
        if self.seconds is None:
            assert self.start is not None and self.end is not None
            self.seconds = self.start.elapsed_time(self.end) / 1e3  # ms -> s
        return self.seconds


class CopyQueue:
    """One direction's FIFO of block copies from ``src`` to ``dst`` tensors (pairwise); ``host_side``
    says which of the two is the CPU store (``dst`` for stores, ``src`` for loads)."""

    def __init__(self, src: list[torch.Tensor], dst: list[torch.Tensor], host_side: Literal["src", "dst"],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if len(src) != len(dst) or not src:
            raise ValueError("a copy queue needs one destination tensor per source tensor")
        self.src = src
        self.dst = dst
        self.host_is_src = host_side == "src"
        self.clock = clock
        self.bytes_per_block = sum(t[0].numel() * t.element_size() for t in src)
        cuda = [t.device for t in (*src, *dst) if t.device.type == "cuda"]
        self.device = cuda[0] if cuda else None
        self.stream = torch.cuda.Stream(self.device) if self.device is not None else None
        self.pending: deque[Transfer] = deque()
        self.events: dict[int, Transfer] = {}

    def submit(self, job_id: int, src_ids: Sequence[int], dst_ids: Sequence[int]) -> Transfer:
        """Changes state: queue the copy of blocks ``src_ids`` onto ``dst_ids`` (one transfer)."""
        spans = host_runs(src_ids, dst_ids) if self.host_is_src else host_runs(dst_ids, src_ids)
        tr = Transfer(job_id, len(src_ids) * self.bytes_per_block)
        if self.stream is None:
            t0 = self.clock()
            self._copy(spans)
            tr.seconds = self.clock() - t0
        else:
            tr.start = torch.cuda.Event(enable_timing=True)
            tr.end = torch.cuda.Event(enable_timing=True)
            # after the compute stream's work so far (the forward that wrote what a store reads)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                tr.start.record(self.stream)
                self._copy(spans)
                tr.end.record(self.stream)
        self.pending.append(tr)
        self.events[job_id] = tr
        return tr

    def _copy(self, spans: list[tuple[int, list[int]]]) -> None:
        dev = (self.dst if self.host_is_src else self.src)[0].device
        plan = []
        for h, ids in spans:
            n = len(ids)
            whole = ids[-1] - ids[0] == n - 1 and all(b - a == 1 for a, b in zip(ids, ids[1:]))
            plan.append((h, n, ids[0], None if whole else torch.tensor(ids, dtype=torch.long, device=dev)))
        for src, dst in zip(self.src, self.dst):
            for h, n, d, idx in plan:
                if self.host_is_src:  # a load: host rows -> device blocks
                    if idx is None:
                        dst[d : d + n].copy_(src[h : h + n], non_blocking=True)
                    else:
                        dst.index_copy_(0, idx, src[h : h + n].to(dst.device, non_blocking=True))
                elif idx is None:  # a store: device blocks -> host rows
                    dst[h : h + n].copy_(src[d : d + n], non_blocking=True)
                else:
                    dst[h : h + n].copy_(src.index_select(0, idx), non_blocking=True)

    def done(self) -> list[Transfer]:
        """Changes state: the transfers done so far, in submission order, each reported once."""
        out = []
        while self.pending and self.pending[0].is_done():
            tr = self.pending.popleft()
            del self.events[tr.job_id]
            out.append(tr)
        return out

    def wait(self, job_ids: set[int] | frozenset[int]) -> None:
        """Block the host until the named transfers of this queue are done (vLLM ``wait``)."""
        for job_id in job_ids:
            tr = self.events.get(job_id)
            if tr is not None and tr.end is not None:
                tr.end.synchronize()

    def order_compute_after(self, job_id: int) -> None:
        """Make the compute stream wait for one transfer without blocking the host (no-op on a CPU)."""
        tr = self.events.get(job_id)
        if tr is not None and tr.end is not None:
            torch.cuda.current_stream(self.device).wait_event(tr.end)
