"""Calibrating the GPU<->CPU link: time the offload worker's block copies at several sizes in both
directions and fit ``seconds = latency_s + bytes / (bandwidth_gb_s * 1e9)``.

Mirrors nothing in vLLM (vLLM reports each transfer's size and time in its offloading metrics,
``OffloadingConnectorStats``; it fits nothing). The copies are the real backend's own
(:class:`~gpu_backend.executor.cpu_kv_store.CopyQueue`, the path a tiered torch replay takes) between a
paged cache of the calibrated model shape and a CPU store of the same layout:

* on CUDA: device -> pinned host (``d2h``, a store) and pinned host -> device (``h2d``, a load),
  each timed by the CUDA events around it on the queue's own stream;
* on a CPU-only machine there is no link: the same copies are host -> host memory copies
  (``h2h_store``, ``h2h_load``), timed by the wall clock or (``timing="thread_cpu"``, one torch
  thread) by the calling thread's CPU time, which leaves out the time the process is descheduled
  on a shared machine; the result says so (``measured``). They calibrate the code path, not a
  PCIe link; a CPU-only figure must not be read as one.

Each transfer moves ``n`` consecutive blocks (one copy per layer's K and V tensor: what vLLM's
batched DMA of a transfer's blocks reaches), ``n`` from :data:`SIZES_BLOCKS`; after warm-up
rounds, a size's time is the median of its repeats (rounds shuffled, seeded). The fit is least
squares in relative error (rows scaled by ``1 / measured``, so small and large transfers weigh alike),
non-negative (``scipy.optimize.nnls``), over both directions together -- the simulator's link is one
queue that loads and stores share (``sim.timing.transfer_link``) -- and per direction for the record.

Output: the calibration file's ``host_link`` section (``sim.timing.transfer_link.LinkFit`` reads
``bandwidth_gb_s``, ``latency_s``, ``measured``), with every sample and the fit's errors. Imports
torch, numpy and scipy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from gpu_backend.calibration.host import device_name
from gpu_backend.executor.cpu_kv_store import CopyQueue, CPUKVStore, device_tensors
from gpu_backend.layout.kv_cache import PagedKVCache
from gpu_backend.layout.shapes import resolve_model_shape

SIZES_BLOCKS: tuple[int, ...] = (1, 4, 16, 64, 256)
"""Blocks per timed transfer (consecutive ids)."""


@dataclass
class LinkSample:
    """One size in one direction: the median, min and max of its timed repeats."""

    direction: str
    num_blocks: int
    num_bytes: int
    median_s: float
    min_s: float
    max_s: float
    repeats: int


def fit_link(num_bytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """``(bandwidth_gb_s, latency_s)`` of ``seconds ~ latency_s + bytes / (bandwidth * 1e9)``: NNLS on
    the rows ``[1, bytes] / seconds`` against 1 (least squares in relative error). Raises ValueError
    when the data give no positive per-byte cost (every size took the same time)."""
    from scipy.optimize import nnls

    x = np.asarray(num_bytes, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if x.size < 2 or np.any(y <= 0):
        raise ValueError("a link fit needs >= 2 samples with positive times")
    a = np.column_stack([np.ones_like(x), x]) / y[:, None]
    norms = np.linalg.norm(a, axis=0)
    coef, _ = nnls(a / norms, np.ones_like(y))
    latency, per_byte = coef / norms
    if not per_byte * x.max() > 1e-6 * y.max():  # (NNLS leaves round-off where there is no slope)
        raise ValueError("the link fit gave no per-byte cost (all transfers took the same time)")
    return float(1.0 / (per_byte * 1e9)), float(latency)


def _copy_queues(device: torch.device, model_shape: str, dtype: torch.dtype, block_size: int,
                 max_blocks: int, clock: Callable[[], float]) -> tuple[dict[str, tuple[CopyQueue, bool]], int]:
    spec = resolve_model_shape(model_shape)
    cache = PagedKVCache(spec.num_layers, max_blocks + 1, block_size, spec.num_kv_heads, spec.head_dim,
                         dtype=dtype, device=device)
    store = CPUKVStore(cache, max_blocks)
    down = CopyQueue(device_tensors(cache), store.tensors, "dst", clock)
    up = CopyQueue(store.tensors, device_tensors(cache), "src", clock)
    names = ("d2h", "h2d") if device.type == "cuda" else ("h2h_store", "h2h_load")
    return {names[0]: (down, False), names[1]: (up, True)}, down.bytes_per_block


def _ids(store_is_src: bool, n: int) -> tuple[list[int], list[int]]:
    """Source and destination ids of ``n`` blocks: cache blocks 1..n (block 0 is the pool's null
    block), store rows 0..n-1."""
    cache_ids, store_ids = list(range(1, n + 1)), list(range(n))
    return (store_ids, cache_ids) if store_is_src else (cache_ids, store_ids)


def measure_link(device: torch.device | str, *, model_shape: str = "tiny", dtype: torch.dtype = torch.float32,
                 block_size: int = 16, sizes: Sequence[int] = SIZES_BLOCKS, repeats: int = 7, warmup: int = 2,
                 seed: int = 0, budget_s: float | None = None, timing: str = "wall",
                 log: Callable[[str], object] = print) -> dict[str, Any]:
    """Time the copies (see the module docstring) and fit them; returns the ``host_link`` section.
    ``timing`` (a CPU device only): ``wall`` or ``thread_cpu`` (needs one torch thread)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    thread_cpu = timing == "thread_cpu" and not cuda
    if thread_cpu and torch.get_num_threads() != 1:
        raise ValueError(f"link timing 'thread_cpu' needs one torch thread, not {torch.get_num_threads()}")
    t_start = time.perf_counter()
    queues, bytes_per_block = _copy_queues(device, model_shape, dtype, block_size, max(sizes),
                                           time.thread_time if thread_cpu else time.perf_counter)
    rng = np.random.default_rng(seed)
    times: dict[tuple[str, int], list[float]] = {(d, n): [] for d in queues for n in sizes}
    plan = [(d, n) for d in queues for n in sizes]
    job = 0
    rounds = 0
    for r in range(warmup + repeats):
        if budget_s is not None and r >= warmup + 2 and time.perf_counter() - t_start > budget_s:
            break
        for i in rng.permutation(len(plan)):
            d, n = plan[int(i)]
            q, store_is_src = queues[d]
            q.submit(job, *_ids(store_is_src, n))
            q.wait({job})
            (tr,) = q.done()
            job += 1
            if r >= warmup:
                times[(d, n)].append(tr.elapsed_s())
        rounds += r >= warmup
    samples = [LinkSample(d, n, n * bytes_per_block, float(np.median(t)), float(min(t)), float(max(t)), len(t))
               for (d, n), t in times.items()]
    bw, lat = fit_link([s.num_bytes for s in samples], [s.median_s for s in samples])
    per_dir = {}
    for d in queues:
        mine = [s for s in samples if s.direction == d]
        b, c = fit_link([s.num_bytes for s in mine], [s.median_s for s in mine])
        per_dir[d] = {"bandwidth_gb_s": b, "latency_s": c}
    pred = np.array([lat + s.num_bytes / (bw * 1e9) for s in samples])
    meas = np.array([s.median_s for s in samples])
    rel = (pred - meas) / meas
    measured = (f"pinned host <-> {device_name(device)} copies (CUDA events)" if cuda else
                "host <-> host memory copies on a CPU-only machine (no GPU link; "
                f"{'thread CPU time' if thread_cpu else 'wall clock'})")
    fit = {"method": "scipy.optimize.nnls on rows [1, bytes] / measured (least squares in relative error), "
                     "both directions together",
           "mape": float(np.abs(rel).mean()), "max_abs_rel_error": float(np.abs(rel).max()),
           "rounds": rounds, "warmup": warmup}
    section: dict[str, Any] = {
        "bandwidth_gb_s": bw, "latency_s": lat, "measured": measured,
        "device": device_name(device), "pinned_host_memory": cuda, "model_shape": model_shape,
        "timing": "cuda_events" if cuda else timing,
        "dtype": str(dtype).replace("torch.", ""), "block_size": block_size, "bytes_per_block": bytes_per_block,
        "layout": "consecutive blocks: one copy per layer's K and V tensor per transfer",
        "directions": per_dir, "samples": [asdict(s) for s in samples],
        "fit": fit,
        "seconds": round(time.perf_counter() - t_start, 2),
    }
    dirs = ", ".join(f"{d} {v['bandwidth_gb_s']:.2f} GB/s" for d, v in per_dir.items())
    log(f"   link: {measured}: {bw:.2f} GB/s + {lat * 1e6:.1f} us per transfer ({dirs}; "
        f"fit MAPE {fit['mape']:.1%}, {rounds} rounds)")
    return section
