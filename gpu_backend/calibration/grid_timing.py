"""Timing a profiling grid on the torch backend, with its noise floor.

Mirrors nothing in vLLM (vLLM's ``benchmarks/`` time whole requests; this times single steps).
Each grid point is flattened into one batch exactly as the replay's
:class:`~gpu_backend.executor.executor.TorchExecutor` does and timed through the same method
(:meth:`TorchExecutor.run_timed`: batch preparation + forward + logits of the sampling rows).

Invariants: the grid runs in rounds, in a fresh seeded random order every round (so slow drift --
clocks, other processes -- spreads over every point instead of biasing some); ``warmup`` rounds are
thrown away; a point's time is the median of its timed repeats, never fewer than 2 when a time
budget cuts the rounds short; block tables are scattered random pages (as after a long run), never
the null block. The noise floor is the spread of the repeats: per point the coefficient of
variation, summarised by median, P90 and max.

Imports torch (through the executor) and numpy.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu_backend.calibration.profiling_grid import GridPoint
from gpu_backend.executor.executor import TorchExecutor
from gpu_backend.layout.batch import SeqInput


@dataclass
class Measurement:
    point: GridPoint
    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def cv(self) -> float:
        """Coefficient of variation of the repeats (0 with fewer than 2)."""
        if len(self.times) < 2:
            return 0.0
        return statistics.stdev(self.times) / statistics.fmean(self.times)


def _inputs(point: GridPoint, num_blocks: int, block_size: int, vocab: int, rng: np.random.Generator) -> list[SeqInput]:
    need = [-(-(c + n) // block_size) for c, n in point.seqs]
    ids = (rng.permutation(num_blocks - 1)[: sum(need)] + 1).tolist()  # scattered pages, as after a long run
    seqs, used = [], 0
    for i, ((c, n), nb) in enumerate(zip(point.seqs, need)):
        seqs.append(SeqInput(f"g{i}", rng.integers(0, vocab, size=n), c, ids[used : used + nb], sample=True))
        used += nb
    return seqs


def measure_grid(executor: TorchExecutor, points: Sequence[GridPoint], *, warmup: int, repeats: int,
                 seed: int = 0, budget_s: float | None = None,
                 log: Callable[[str], object] = print) -> tuple[list[Measurement], dict[str, Any]]:
    """Time every point: ``warmup`` discarded rounds, then up to ``repeats`` timed rounds (fewer if the
    time budget would be exceeded, never fewer than 2), each round in a fresh random order."""
    cache = executor.cache
    rng = np.random.default_rng(seed)
    inputs = [_inputs(g, cache.num_blocks, cache.block_size, executor.model.vocab_size, rng) for g in points]
    meas = [Measurement(g) for g in points]
    t0 = time.perf_counter()
    order = np.arange(len(points))
    for _ in range(warmup):
        rng.shuffle(order)
        for i in order:
            executor.run_timed(inputs[i])
    t_warm = time.perf_counter() - t0
    rounds = 0
    round_s: list[float] = []
    for r in range(repeats):
        if budget_s is not None and r >= 2 and round_s:
            if time.perf_counter() - t0 + max(round_s) > budget_s:
                log(f"   time budget: stopping after {r} timed rounds")
                break
        t_r = time.perf_counter()
        rng.shuffle(order)
        for i in order:
            meas[i].times.append(executor.run_timed(inputs[i])[0])
        round_s.append(time.perf_counter() - t_r)
        rounds += 1
    cvs = sorted(m.cv for m in meas)
    noise = {
        "repeats": rounds, "warmup_rounds": warmup, "warmup_s": round(t_warm, 3),
        "median_cv": float(np.median(cvs)) if cvs else 0.0,
        "p90_cv": float(np.quantile(cvs, 0.9)) if cvs else 0.0,
        "max_cv": float(cvs[-1]) if cvs else 0.0,
        "round_s": [round(x, 3) for x in round_s],
    }
    return meas, noise
