"""``apcsim calibrate``: fit the simulator's step-latency model on real forward passes (issue #6).

A *profiling grid* of step shapes runs straight on the torch backend (no scheduler): each grid point
is a list of sequences ``(context_len, new_tokens)`` -- already-computed tokens (prefix-cache hits
or earlier chunks) and tokens computed in the step -- flattened into one batch exactly as the
replay's :class:`~gpu_backend.executor.TorchExecutor` does, and timed through the same method
(:meth:`TorchExecutor.run_timed`: batch preparation + forward + logits of the sampling rows). The
grid covers

* ``prefill``: one prompt of ``n`` new tokens after ``c`` cached ones (``c = 0`` cold, ``c > 0`` a
  prefix hit), for prefill lengths x cached-context lengths;
* ``multi_prefill``: ``k`` such prefills in one step;
* ``decode``: ``b`` decodes at context ``L`` (decode batch sizes x context lengths);
* ``mixed``: one prefill chunk plus ``b`` decodes (chunked prefill piggy-backing on decodes);
* ``random``: scheduler-like steps with unequal contexts (0-2 prefill chunks, 0-``B`` decodes).

Measurement: the whole grid is run in rounds (shuffled order every round, so slow drift -- clocks,
other processes -- spreads over every point instead of biasing some): ``warmup`` rounds that are
thrown away, then ``repeats`` timed rounds; a point's time is the median of its repeats. On a CPU
the torch thread count is pinned (``--threads``, default 1). The *noise floor* is the spread of
the repeats: per point the coefficient of variation, summarised by its median and P90 over points.

Fit: :class:`sim.timing.fitted_latency.FittedLatency` is linear in :data:`sim.timing.fitted_latency.FEATURES` of
each point's :class:`sim.timing.latency.StepShape` -- ``num_new_tokens`` (GEMMs), ``attention_pairs``
(attention FLOPs over cached + new tokens), ``kv_read_tokens`` (KV bytes read, per token),
``num_seqs`` / ``num_decode_seqs`` (per-sequence overheads) and an intercept (weights streamed,
launches) -- optionally with a roofline knee ``num_new_tokens_over_<K>`` (GEMMs memory-bound below
``K`` tokens, compute-bound above; candidate ``K`` per grid preset). Coefficients come from non-negative least squares (``scipy.optimize.nnls``) on rows
scaled by ``1 / measured`` (i.e. least squares in *relative* error, which is what TTFT and TPOT of
short steps care about). A share of the grid (``holdout``, stratified by kind) never enters the fit;
the feature set is chosen among a few candidates by K-fold cross-validation on the training points
only; the report gives per-step error on the held-out points (MAPE, P50/P90/max absolute relative
error, per kind).

Output: the model file (``FittedLatency`` JSON: ``kind``, ``features`` plus metadata -- device
name, torch version, git commit, date, model shape, dtype, attention, block size, threads, the grid,
the fit quality and the noise floor) and, beside it, ``<stem>.samples.csv`` (every grid point: shape,
median, spread, fitted prediction, train/held-out).

Command line (``apcsim calibrate`` or ``python -m gpu_backend.calibrate``)::

    apcsim calibrate --device cpu --model tiny --out results/calib/cpu_tiny.json
    apcsim calibrate --device cuda --model llama-3-8b --dtype bfloat16 --grid gpu --out model.json
    apcsim calibrate --config configs/validate_chat_cpu.yaml --out model.json   # backend/engine from a config

Imports torch (this package only); not simpy or pydantic unless ``--config`` is given.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_backend.attention import select_attention
from gpu_backend.batch import SeqInput
from gpu_backend.executor import TorchExecutor
from gpu_backend.kv_cache import PagedKVCache
from gpu_backend.model import DTYPES, LlamaModel
from gpu_backend.shapes import resolve_model_shape
from sim.cli.calibrate import GRID_PRESETS, add_calibrate_arguments
from sim.core.executor import StepShape
from sim.timing.fitted_latency import FittedLatency, knee_feature

KINDS = ("prefill", "multi_prefill", "decode", "mixed", "random")

#: Candidate feature sets, simplest first; the fit picks one by cross-validation on training points.
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "base": ("intercept", "num_seqs", "num_new_tokens", "attention_pairs", "kv_read_tokens"),
    "split_seqs": ("intercept", "num_decode_seqs", "num_prefill_seqs", "num_new_tokens", "attention_pairs",
                   "kv_read_tokens"),
    "split_tokens": ("intercept", "num_decode_seqs", "num_prefill_seqs", "num_prefill_tokens",
                     "num_decode_tokens", "attention_pairs", "context_tokens", "kv_read_tokens"),
}


# ----------------------------------------------------------------------------- the grid


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


# ----------------------------------------------------------------------------- measuring


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


assert set(PRESETS) == set(GRID_PRESETS)


def _pool_blocks(points: Sequence[GridPoint], block_size: int) -> int:
    return 1 + max(sum(-(-(c + n) // block_size) for c, n in g.seqs) for g in points)


def _inputs(point: GridPoint, num_blocks: int, block_size: int, vocab: int, rng: np.random.Generator) -> list[SeqInput]:
    need = [-(-(c + n) // block_size) for c, n in point.seqs]
    ids = (rng.permutation(num_blocks - 1)[: sum(need)] + 1).tolist()  # scattered pages, as after a long run
    seqs, used = [], 0
    for i, ((c, n), nb) in enumerate(zip(point.seqs, need)):
        seqs.append(SeqInput(f"g{i}", rng.integers(0, vocab, size=n), c, ids[used : used + nb], sample=True))
        used += nb
    return seqs


def measure_grid(executor: TorchExecutor, points: Sequence[GridPoint], *, warmup: int, repeats: int,
                 seed: int = 0, budget_s: float | None = None, log=print) -> tuple[list[Measurement], dict[str, Any]]:
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
    round_s = []
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


# ----------------------------------------------------------------------------- fitting


def design_matrix(shapes: Sequence[StepShape], features: Sequence[str]) -> np.ndarray:
    return np.array([[FittedLatency.feature_value(f, s) for f in features] for s in shapes], dtype=np.float64)


def candidate_feature_sets(knees: Sequence[int] = ()) -> dict[str, tuple[str, ...]]:
    """:data:`FEATURE_SETS` plus ``base`` with one roofline knee at each of ``knees`` tokens."""
    sets = dict(FEATURE_SETS)
    for k in knees:
        sets[f"base+knee{k}"] = (*FEATURE_SETS["base"], knee_feature(k))
    return sets


def fit_nnls(shapes: Sequence[StepShape], times: Sequence[float], features: Sequence[str]) -> dict[str, float]:
    """Non-negative least squares in relative error: ``min || (X c - y) / y ||``, ``c >= 0``.

    Columns are scaled to unit norm before solving (conditioning: ``attention_pairs`` is ~1e6 times
    ``num_seqs``) and the coefficients scaled back."""
    from scipy.optimize import nnls

    y = np.asarray(times, dtype=np.float64)
    a = design_matrix(shapes, features) / y[:, None]
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    coef, _ = nnls(a / norms, np.ones_like(y), maxiter=50 * a.shape[1])
    coef = coef / norms
    return {f: float(c) for f, c in zip(features, coef)}


def predict(coefs: dict[str, float], shapes: Sequence[StepShape]) -> np.ndarray:
    model = FittedLatency(coefs)
    return np.array([model.step_time(s) for s in shapes])


def rel_errors(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (pred - y) / y


def error_summary(err: np.ndarray) -> dict[str, float]:
    a = np.abs(err)
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "mape": float(a.mean()), "p50_abs": float(np.quantile(a, 0.5)),
            "p90_abs": float(np.quantile(a, 0.9)), "max_abs": float(a.max()), "mean_signed": float(err.mean())}


def _kfold_mape(shapes: list[StepShape], y: np.ndarray, features: Sequence[str], k: int, seed: int) -> float:
    n = len(shapes)
    k = max(2, min(k, n))
    idx = np.random.default_rng(seed).permutation(n)
    errs = []
    for f in range(k):
        test = idx[f::k]
        train = np.setdiff1d(idx, test)
        coefs = fit_nnls([shapes[i] for i in train], y[train], features)
        if not any(v > 0 for v in coefs.values()):
            return math.inf
        pred = predict(coefs, [shapes[i] for i in test])
        errs.append(np.abs(rel_errors(pred, y[test])))
    return float(np.concatenate(errs).mean())


def choose_and_fit(shapes: list[StepShape], y: np.ndarray, *, feature_sets: dict[str, tuple[str, ...]] | None = None,
                   folds: int = 5, seed: int = 0) -> tuple[str, dict[str, float], dict[str, float]]:
    """Pick the feature set with the lowest K-fold CV MAPE (an earlier, simpler set wins unless a
    later one is better by > 1 % relative and 0.01 percentage points), then fit it on all of
    ``shapes``. Returns (name, coefs, CV MAPE per set)."""
    sets = feature_sets or FEATURE_SETS
    cv = {name: _kfold_mape(shapes, y, feats, folds, seed) for name, feats in sets.items()}
    best = None
    for name in sets:  # simplest first
        if best is None or cv[name] < cv[best] * 0.99 - 1e-4:
            best = name
    assert best is not None
    return best, fit_nnls(shapes, y, sets[best]), cv


# ----------------------------------------------------------------------------- the command


def _git_commit() -> str | None:
    from sim.experiment.results import git_commit

    return git_commit(Path(__file__).resolve().parent)


@dataclass
class CalibrationSetup:
    model_shape: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "auto"
    block_size: int = 16
    num_threads: int | None = 1
    seed: int = 0
    timing: str = "wall"


def setup_from_config(path: str) -> tuple[CalibrationSetup, str]:
    """Backend and engine settings of an experiment config (so calibration matches the validation)."""
    from sim.experiment.config import load_config

    cfg = load_config(path)
    b = cfg.backend
    shape = b.model_shape
    if shape.endswith((".yaml", ".yml")) and not Path(shape).is_absolute():
        shape = str(cfg.resolve_path(shape))
    return CalibrationSetup(shape, b.device, b.dtype, b.attention, cfg.engine.block_size, b.num_threads,
                            b.seed if b.seed is not None else cfg.seed, b.timing), cfg.name


def build_executor(setup: CalibrationSetup, num_blocks: int) -> tuple[TorchExecutor, dict[str, Any]]:
    """Model with seeded random weights, a paged cache of ``num_blocks`` blocks, the attention path."""
    device = torch.device(setup.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"calibrate: cuda requested but torch {torch.__version__} sees no CUDA device")
    spec = resolve_model_shape(setup.model_shape)
    dtype = DTYPES[setup.dtype]
    model = LlamaModel(spec, dtype=dtype, device=device, seed=setup.seed)
    cache = PagedKVCache(spec.num_layers, num_blocks, setup.block_size, spec.num_kv_heads, spec.head_dim,
                         dtype=dtype, device=device)
    attention, report = select_attention(setup.attention, device=device, dtype=dtype, block_size=setup.block_size,
                                         num_heads=spec.num_attention_heads, num_kv_heads=spec.num_kv_heads,
                                         head_dim=spec.head_dim)
    ex = TorchExecutor(model, cache, attention, timing=setup.timing, attention_report=report)  # type: ignore[arg-type]
    return ex, report


def calibrate(setup: CalibrationSetup, preset: GridPreset, *, holdout: float = 0.25, grid_seed: int = 0,
              warmup: int | None = None, repeats: int | None = None, budget_s: float | None = None,
              log=print) -> tuple[FittedLatency, list[dict[str, Any]]]:
    """Measure the grid, fit, evaluate on held-out points; returns the model (metadata included) and
    one row per grid point."""
    t_start = time.perf_counter()
    if setup.device == "cpu" and setup.num_threads:
        torch.set_num_threads(setup.num_threads)
    points = build_grid(preset, grid_seed)
    held = split_holdout(points, holdout, grid_seed)
    num_blocks = _pool_blocks(points, setup.block_size)
    ex, att_report = build_executor(setup, num_blocks)
    spec = ex.model.spec
    log(f"calibrate: {spec.name} {setup.dtype} on {setup.device} ({_device_name(ex)}), attention={att_report['name']}, "
        f"block {setup.block_size}, threads {torch.get_num_threads() if setup.device == 'cpu' else '-'}; "
        f"{len(points)} grid points ({sum(held)} held out), pool {num_blocks} blocks")
    meas, noise = measure_grid(ex, points, warmup=preset.warmup if warmup is None else warmup,
                               repeats=preset.repeats if repeats is None else repeats, seed=grid_seed,
                               budget_s=budget_s, log=log)
    log(f"   measured: {noise['repeats']} timed rounds of {[round(s, 2) for s in noise['round_s']]} s; "
        f"noise floor (repeat CV) median {noise['median_cv']:.1%}, P90 {noise['p90_cv']:.1%}")
    shapes = [m.point.shape for m in meas]
    y = np.array([m.median for m in meas])
    train = [i for i, h in enumerate(held) if not h]
    test = [i for i, h in enumerate(held) if h]
    sets = candidate_feature_sets(preset.knees)
    name, coefs, cv = choose_and_fit([shapes[i] for i in train], y[train], feature_sets=sets, seed=grid_seed)
    if not any(v > 0 for v in coefs.values()):
        raise RuntimeError("calibration fit gave all-zero coefficients")
    pred = predict(coefs, shapes)
    err = rel_errors(pred, y)
    fit_q: dict[str, Any] = {
        "method": "scipy.optimize.nnls on rows scaled by 1/measured (least squares in relative error)",
        "feature_set": name, "cv_mape_by_feature_set": cv,
        "train": error_summary(err[train]), "holdout": error_summary(err[test]),
        "holdout_by_kind": {k: error_summary(err[[i for i in test if points[i].kind == k]])
                            for k in KINDS if any(points[i].kind == k for i in test)},
        "n_samples": len(points), "n_train": len(train), "n_holdout": len(test),
    }
    log(f"   feature set {name!r} (CV MAPE {', '.join(f'{k} {v:.1%}' for k, v in cv.items())})")
    log(f"   held-out per-step error: MAPE {fit_q['holdout'].get('mape', float('nan')):.1%}, "
        f"P90 {fit_q['holdout'].get('p90_abs', float('nan')):.1%}, max {fit_q['holdout'].get('max_abs', float('nan')):.1%} "
        f"(train MAPE {fit_q['train']['mape']:.1%})")
    kv_bytes = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * ex.cache.k[0].element_size()
    meta: dict[str, Any] = {
        "device": _device_name(ex),
        "device_type": setup.device,
        "torch_version": torch.__version__,
        "git_commit": _git_commit(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "model_shape": spec.name,
        "dtype": setup.dtype,
        "attention": att_report.get("name"),
        "attention_requested": setup.attention,
        "block_size": setup.block_size,
        "num_threads": torch.get_num_threads() if setup.device == "cpu" else None,
        "timing": ex.timing,
        "seed": setup.seed,
        "kv_bytes_per_token": kv_bytes,
        "units": "seconds per unit of each feature; kv_read_tokens x kv_bytes_per_token = KV bytes read",
        "grid": {"preset": {k: v for k, v in vars(preset).items()}, "seed": grid_seed, "holdout_share": holdout,
                 "counts": {k: sum(1 for g in points if g.kind == k) for k in KINDS}},
        "noise_floor": noise,
        "fit": fit_q,
        "calibration_wall_s": round(time.perf_counter() - t_start, 2),
        "host_load_average": _loadavg(),  # 1/5/15-minute: contention from other processes on a shared host
    }
    model = FittedLatency(coefs, meta)
    rows = []
    for i, m in enumerate(meas):
        s = shapes[i]
        rows.append({"kind": m.point.kind, "label": m.point.label, "heldout": held[i], "num_seqs": s.num_seqs,
                     "num_decode_seqs": s.num_decode_seqs, "num_new_tokens": s.num_new_tokens,
                     "num_prefill_tokens": s.num_prefill_tokens, "context_tokens": s.context_tokens,
                     "attention_pairs": s.attention_pairs, "median_s": m.median, "cv": m.cv,
                     "min_s": min(m.times), "max_s": max(m.times), "predicted_s": float(pred[i]),
                     "rel_error": float(err[i])})
    return model, rows


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # pragma: no cover
        return None


def _device_name(ex: TorchExecutor) -> str:
    dev = ex.cache.device
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:  # pragma: no cover - not Linux
        pass
    return f"cpu ({name}, {os.cpu_count()} logical cores)"


def write_outputs(model: FittedLatency, rows: list[dict[str, Any]], out: str | Path) -> tuple[Path, Path]:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.to_file(out)
    samples = out.with_name(out.stem + ".samples.csv")
    with open(samples, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return out, samples


add_arguments = add_calibrate_arguments


def run_from_args(args: argparse.Namespace) -> int:
    setup = CalibrationSetup()
    if args.config:
        setup, _ = setup_from_config(args.config)
    for attr, key in (("model_shape", "model"), ("device", "device"), ("dtype", "dtype"), ("attention", "attention"),
                      ("block_size", "block_size"), ("num_threads", "threads"), ("seed", "seed")):
        v = getattr(args, key)
        if v is not None:
            setattr(setup, attr, v)
    if setup.device == "cpu" and not setup.num_threads:
        setup.num_threads = 1
    grid = args.grid if args.grid != "auto" else ("gpu" if setup.device == "cuda" else "cpu")
    model, rows = calibrate(setup, PRESETS[grid], holdout=args.holdout, grid_seed=args.grid_seed, warmup=args.warmup,
                            repeats=args.repeats, budget_s=args.budget_s)
    path, samples = write_outputs(model, rows, args.out)
    print(f"coefficients: {json.dumps(model.coefs)}")
    print(f"wrote {path} and {samples}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="apcsim calibrate", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run_from_args(ap.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
