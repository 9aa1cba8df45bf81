"""The calibration's profiling grid: step shapes to time on the torch backend.

Mirrors the shapes vLLM's scheduler produces (``vllm/v1/core/sched/scheduler.py``): a point is a
list of sequences ``(context_len, new_tokens)`` -- already-computed tokens (prefix-cache hits or
earlier chunks) and tokens computed in the step. Kinds (``KINDS``):

* ``prefill``: one prompt of ``n`` new tokens after ``c`` cached ones (``c = 0`` cold, ``c > 0`` a
  prefix hit), for prefill lengths x cached-context lengths;
* ``multi_prefill``: ``k`` such prefills in one step;
* ``decode``: ``b`` decodes at context ``L`` (decode batch sizes x context lengths);
* ``mixed``: one prefill chunk plus ``b`` decodes (chunked prefill piggy-backing on decodes);
* ``random``: scheduler-like steps with unequal contexts (0-2 prefill chunks, 0-``B`` decodes).

Invariants: every point fits its preset's limits (step tokens, KV tokens, sequence length); points
are unique; the random points and the held-out split are seeded (same seed, same grid); a point's
:class:`StepShape` is the one ``sim.core.executor.step_shape`` computes for the same sequences.

Imports numpy and sim.core only (no torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.core.executor import StepShape

KINDS = ("prefill", "multi_prefill", "decode", "mixed", "random")


@dataclass(frozen=True)
class GridPreset:
    """Axes of a profiling grid (tokens); points beyond ``max_step_tokens`` / ``max_kv_tokens`` are dropped."""

    prefill_lens: tuple[int, ...]
    cached_ctx: tuple[int, ...]
    multi_prefill: tuple[int, ...]  # number of prefills in a multi-prefill step
    decode_batches: tuple[int, ...]
    decode_ctx: tuple[int, ...]
    mixed_chunks: tuple[int, ...]
    mixed_batches: tuple[int, ...]
    mixed_ctx: tuple[int, ...]
    num_random: int
    max_step_tokens: int
    max_kv_tokens: int  # sum over a step's sequences of context + new (sizes the KV pool)
    max_seq_len: int
    warmup: int = 2
    repeats: int = 5
    knees: tuple[int, ...] = ()  # candidate roofline knees (tokens) tried by the feature-set choice


PRESETS: dict[str, GridPreset] = {
    # CI: a few seconds with the tiny model on one CPU thread
    "quick": GridPreset(
        prefill_lens=(16, 64, 160), cached_ctx=(0, 96, 384), multi_prefill=(3,),
        decode_batches=(1, 4, 12), decode_ctx=(48, 320), mixed_chunks=(32, 96), mixed_batches=(2, 8),
        mixed_ctx=(160,), num_random=14, max_step_tokens=256, max_kv_tokens=6144, max_seq_len=1024,
        warmup=1, repeats=3, knees=(64,)),
    # the tiny model on a CPU (the reference results): ~20-40 s on one thread
    "cpu": GridPreset(
        prefill_lens=(8, 24, 48, 96, 192, 256), cached_ctx=(0, 64, 192, 448, 768), multi_prefill=(2, 4),
        decode_batches=(1, 2, 4, 8, 16, 24), decode_ctx=(32, 128, 384, 768), mixed_chunks=(16, 64, 160),
        mixed_batches=(2, 6, 14), mixed_ctx=(96, 384), num_random=48, max_step_tokens=256,
        max_kv_tokens=16384, max_seq_len=1024, warmup=2, repeats=5, knees=(32, 64, 128)),
    # Llama-3-8B (bf16) on an H200: ~60-90 s
    "gpu": GridPreset(
        prefill_lens=(32, 128, 512, 1024, 2048, 4096, 8192), cached_ctx=(0, 512, 2048, 6144),
        multi_prefill=(2, 4, 8), decode_batches=(1, 4, 16, 32, 64, 128, 256), decode_ctx=(128, 512, 2048, 4096),
        mixed_chunks=(128, 512, 2048), mixed_batches=(8, 32, 96), mixed_ctx=(512, 2048), num_random=72,
        max_step_tokens=8192, max_kv_tokens=400_000, max_seq_len=16384, warmup=1, repeats=5,
        knees=(64, 128, 256, 512, 1024)),
}


@dataclass(frozen=True)
class GridPoint:
    kind: str
    seqs: tuple[tuple[int, int], ...]  # (context_len, new_tokens); new == 1 with context > 0 is a decode

    @property
    def shape(self) -> StepShape:
        return shape_of(self.seqs)

    @property
    def label(self) -> str:
        pre = [(c, n) for c, n in self.seqs if not _is_decode(c, n)]
        dec = [c for c, n in self.seqs if _is_decode(c, n)]
        parts = [f"P{n}@{c}" for c, n in pre]
        if dec:
            parts.append(f"D{len(dec)}x{round(sum(dec) / len(dec))}")
        return "+".join(parts)


def _is_decode(context: int, new: int) -> bool:
    return new == 1 and context > 0


def shape_of(seqs: Sequence[tuple[int, int]]) -> StepShape:
    """The :class:`StepShape` the simulator computes for these sequences (``sim.core.executor.step_shape``)."""
    num_dec = new_total = pre_tokens = ctx = pairs = 0
    for c, n in seqs:
        new_total += n
        ctx += c
        pairs += n * c + n * (n + 1) // 2
        if _is_decode(c, n):
            num_dec += 1
        else:
            pre_tokens += n
    return StepShape(len(seqs), num_dec, new_total, pre_tokens, ctx, pairs)


def build_grid(preset: GridPreset, seed: int = 0) -> list[GridPoint]:
    """Every point of ``preset`` that fits its limits, deduplicated, plus seeded random steps."""
    p = preset
    pts: list[GridPoint] = []

    def add(kind: str, seqs: list[tuple[int, int]]) -> None:
        if not seqs or any(c + n > p.max_seq_len or n < 1 or c < 0 for c, n in seqs):
            return
        if sum(n for _, n in seqs) > p.max_step_tokens or sum(c + n for c, n in seqs) > p.max_kv_tokens:
            return
        pts.append(GridPoint(kind, tuple(seqs)))

    for n in p.prefill_lens:
        for c in p.cached_ctx:
            add("prefill", [(c, n)])
    for k in p.multi_prefill:
        for n in p.prefill_lens:
            for c in p.cached_ctx[:3]:
                add("multi_prefill", [(c, n)] * k)
    for b in p.decode_batches:
        for ctx in p.decode_ctx:
            add("decode", [(ctx, 1)] * b)
    for n in p.mixed_chunks:
        for b in p.mixed_batches:
            for ctx in p.mixed_ctx:
                add("mixed", [(p.cached_ctx[1] if len(p.cached_ctx) > 1 else 0, n)] + [(ctx, 1)] * b)
    rng = np.random.default_rng(seed)
    tries = 0
    n_random = 0
    while n_random < p.num_random and tries < 50 * p.num_random:
        tries += 1
        seqs: list[tuple[int, int]] = []
        for _ in range(int(rng.integers(0, 3))):  # 0-2 prefill chunks
            n = int(rng.integers(2, max(3, p.max_step_tokens // 2)))
            c = int(rng.choice([0, int(rng.integers(0, p.max_seq_len // 2))]))
            seqs.append((c, n))
        for _ in range(int(rng.integers(0 if seqs else 1, max(p.decode_batches) + 1))):
            seqs.append((int(rng.integers(8, p.max_seq_len // 2)), 1))
        before = len(pts)
        add("random", seqs)
        n_random += len(pts) - before
    seen: set[tuple[tuple[int, int], ...]] = set()
    out = []
    for g in pts:
        if g.seqs not in seen:
            seen.add(g.seqs)
            out.append(g)
    return out


def split_holdout(points: Sequence[GridPoint], share: float, seed: int = 0) -> list[bool]:
    """A seeded, per-kind stratified choice of held-out points (at least one per kind with >= 3 points)."""
    rng = np.random.default_rng(seed + 7919)
    held = [False] * len(points)
    for kind in KINDS:
        idx = [i for i, g in enumerate(points) if g.kind == kind]
        if len(idx) < 3 or share <= 0:
            continue
        k = max(1, int(round(share * len(idx))))
        for i in rng.choice(idx, size=k, replace=False):
            held[int(i)] = True
    return held


def pool_blocks(points: Sequence[GridPoint], block_size: int) -> int:
    """Blocks of a pool that holds the largest point at once (plus the null block)."""
    return 1 + max(sum(-(-(c + n) // block_size) for c, n in g.seqs) for g in points)
