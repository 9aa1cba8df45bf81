"""``apcsim calibrate``: fit the simulator's step-latency model on real forward passes.

Mirrors nothing in vLLM (vLLM measures; apcsim predicts, and this is where the prediction is fitted
to measurements). The command, in steps over modules of their own:

1. isolated shapes: a profiling grid (:mod:`gpu_backend.calibration.profiling_grid`), timed straight on the
   torch backend in shuffled rounds with a noise floor (:mod:`gpu_backend.calibration.grid_timing`);
2. the steps a replay runs: real replays of calibration workloads (``--replay CONFIG``, never the
   validation configs) through the SimPy loop and the scheduler on the torch backend, every step
   timed as the replay runs it -- back to back, warm cache and allocator, real block tables
   (:mod:`gpu_backend.calibration.replay_samples`) -- or, with ``--replay-retime-passes N``, by its median over
   N passes that time the replay's steps again in replay order;
3. a share of both (``holdout``, stratified by source and step kind) kept out of the fit; the NNLS
   fit in relative error, its terms chosen by K-fold CV on the training samples
   (:mod:`gpu_backend.calibration.latency_fit`); the report (:mod:`gpu_backend.calibration.fit_report`) gives every
   term's coefficient and share of the step time, and the residuals by step kind and source on
   training and held-out samples;
4. the GPU<->CPU link of the CPU offload tier (:mod:`gpu_backend.calibration.link_timing`, unless ``--no-link``):
   the offload worker's block copies timed at several sizes in both directions (pinned host <->
   device on CUDA; host <-> host on a CPU-only machine, labelled so), bandwidth and per-transfer
   latency fitted by least squares -> the model file's ``host_link`` section, which a tiered
   experiment whose ``latency:`` is this file uses for its link (``sim.timing.transfer_link``).

On a CPU the torch thread count is pinned (``--threads``, default 1) and ``--timing thread_cpu``
times a step by the thread's CPU time, ``--timing-repeats N`` by the median of N runs: the noise
reductions for a shared machine (the README of ``results/reference/cpu_tiny/`` measures them).

Output: the model file (``FittedLatency`` JSON: ``kind``, ``features`` plus metadata -- device
name, torch version, git commit, date, model shape, dtype, attention, block size, threads, timing,
the grid, the replays, the fit quality, the terms and the noise floor) and, beside it,
``<stem>.samples.csv`` (every sample: source, kind, shape, measured, spread for grid points,
fitted prediction, train/held-out).

Command line (``apcsim calibrate`` or ``python -m gpu_backend.calibration.calibrate``)::

    apcsim calibrate --device cpu --model tiny --out results/calib/cpu_tiny.json
    apcsim calibrate --config configs/validate_chat_cpu.yaml --replay configs/calibrate_chat_cpu.yaml \
        --replay configs/calibrate_rag_cpu.yaml --out model.json   # backend/engine from a config
    apcsim calibrate --device cuda --model llama-3-8b --dtype bfloat16 --grid gpu --out model.json

Invariants: the grid, the held-out split and the CV folds are seeded (``--grid-seed``); the fit
never sees a held-out sample; a fit with all-zero coefficients is an error. Imports torch (this
package only); not simpy or pydantic unless ``--config`` or ``--replay`` is given.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_backend.attention import select_attention
from gpu_backend.calibration.calibration_setup import CalibrationSetup, setup_from_config
from gpu_backend.calibration.fit_report import residuals, step_kind_of, term_table
from gpu_backend.calibration.grid_timing import measure_grid
from gpu_backend.calibration.host import device_name, load_average
from gpu_backend.calibration.latency_fit import candidate_feature_sets, choose_and_fit, predict, rel_errors
from gpu_backend.calibration.link_timing import measure_link
from gpu_backend.calibration.profiling_grid import KINDS, PRESETS, GridPoint, GridPreset, build_grid, pool_blocks
from gpu_backend.calibration.replay_samples import replay_samples, run_record, samples_of
from gpu_backend.executor.executor import TorchExecutor
from gpu_backend.executor.model import DTYPES, LlamaModel
from gpu_backend.executor.real_run import RealRun
from gpu_backend.layout.kv_cache import PagedKVCache
from gpu_backend.layout.shapes import resolve_model_shape
from sim.cli.calibrate import add_calibrate_arguments
from sim.core.executor import StepShape
from sim.timing.fitted_latency import FittedLatency
from sim.timing.transfer_link import LINK_KEY


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
    ex = TorchExecutor(model, cache, attention, timing=setup.timing, attention_report=report,
                       repeats=setup.timing_repeats)
    return ex, report


@dataclass
class Sample:
    """One calibration sample: a grid point (median of its timed rounds) or a replay step."""

    source: str  # "grid" or "replay"
    label: str  # grid point label, or "<replay name>#<step>"
    kind: str  # prefill | decode | mixed
    shape: StepShape
    seconds: float
    cv: float | None = None  # grid points: spread of the repeats
    min_s: float | None = None
    max_s: float | None = None


def _holdout(samples: list[Sample], share: float, seed: int) -> list[bool]:
    """Seeded held-out choice, stratified by source and step kind (>= 1 per stratum of >= 3)."""
    rng = np.random.default_rng(seed + 7919)
    held = [False] * len(samples)
    for key in sorted({(x.source, x.kind) for x in samples}):
        idx = [i for i, x in enumerate(samples) if (x.source, x.kind) == key]
        if len(idx) < 3 or share <= 0:
            continue
        for i in rng.choice(idx, size=max(1, int(round(share * len(idx)))), replace=False):
            held[int(i)] = True
    return held


def calibrate(setup: CalibrationSetup, preset: GridPreset, *, replays: Sequence[str | Path] = (),
              replay_overrides: Sequence[str] = (), holdout: float = 0.25, grid_seed: int = 0,
              warmup: int | None = None, repeats: int | None = None, budget_s: float | None = None,
              replay_budget_s: float | None = None, replay_retime_passes: int = 0,
              premeasured: Sequence[tuple[str, RealRun]] = (), link: bool = True, link_repeats: int = 7,
              log: Callable[[str], object] = print) -> tuple[FittedLatency, list[dict[str, Any]]]:
    """Measure the grid and the calibration replays, fit, evaluate on held-out samples; returns the
    model (metadata included) and one row per sample. ``premeasured``: calibration replays
    already run (name, real run), joined to those of ``replays``; a re-timed run (``steps_retimed``)
    gives its steps' medians over the passes, as ``replay_retime_passes`` does for ``replays``."""
    t_start = time.perf_counter()
    if setup.device == "cpu" and setup.num_threads:
        torch.set_num_threads(setup.num_threads)
    points = build_grid(preset, grid_seed)
    num_blocks = pool_blocks(points, setup.block_size)
    ex, att_report = build_executor(setup, num_blocks)
    spec = ex.model.spec
    log(f"calibrate: {spec.name} {setup.dtype} on {setup.device} ({device_name(ex.cache.device)}), "
        f"attention={att_report['name']}, block {setup.block_size}, timing {ex.timing} x{ex.repeats}, "
        f"threads {torch.get_num_threads() if setup.device == 'cpu' else '-'}; "
        f"{len(points)} grid points, pool {num_blocks} blocks; {len(replays)} calibration replay(s)")
    meas, noise = measure_grid(ex, points, warmup=preset.warmup if warmup is None else warmup,
                               repeats=preset.repeats if repeats is None else repeats, seed=grid_seed,
                               budget_s=budget_s, log=log)
    log(f"   grid: {noise['repeats']} timed rounds of {[round(s, 2) for s in noise['round_s']]} s; "
        f"noise floor (repeat CV) median {noise['median_cv']:.1%}, P90 {noise['p90_cv']:.1%}")
    ex_timing = ex.timing
    del ex
    gc.collect()
    samples = [Sample("grid", m.point.label, step_kind_of(m.point.shape), m.point.shape, m.median, m.cv,
                      min(m.times), max(m.times)) for m in meas]
    runs: list[dict[str, Any]] = []
    rs: list[Any] = []
    if replays:
        rs, runs = replay_samples(replays, setup, overrides=replay_overrides, budget_s=replay_budget_s,
                                  retime_passes=replay_retime_passes, log=log)
    for name, run in premeasured:
        rs += samples_of(name, run)
        runs.append(run_record(name, None, run))
    samples += [Sample("replay", f"{r.source}#{r.step}", r.kind, r.shape, r.seconds) for r in rs]
    held = _holdout(samples, holdout, grid_seed)
    shapes = [x.shape for x in samples]
    y = np.array([x.seconds for x in samples])
    train = [i for i, h in enumerate(held) if not h]
    sets = candidate_feature_sets(preset.knees, mixed=True)
    name, coefs, cv = choose_and_fit([shapes[i] for i in train], y[train], feature_sets=sets, seed=grid_seed)
    if not any(v > 0 for v in coefs.values()):
        raise RuntimeError("calibration fit gave all-zero coefficients")
    pred = predict(coefs, shapes)
    err = rel_errors(pred, y)
    kinds = [x.kind for x in samples]
    sources = [x.source for x in samples]
    mask_held = np.array(held)
    fit_q: dict[str, Any] = {
        "method": "scipy.optimize.nnls on rows scaled by 1/measured (least squares in relative error)",
        "feature_set": name, "cv_mape_by_feature_set": cv,
        "train": residuals(err, kinds, sources, ~mask_held), "holdout": residuals(err, kinds, sources, mask_held),
        "n_samples": len(samples), "n_train": len(train), "n_holdout": int(mask_held.sum()),
        "n_by_source": {s: sources.count(s) for s in sorted(set(sources))},
    }
    log(f"   feature set {name!r} (CV MAPE {', '.join(f'{k} {v:.1%}' for k, v in cv.items())})")
    ho = fit_q["holdout"]["all"]
    by_kind = ", ".join(f"{k} {v['mape']:.1%}" for k, v in fit_q["holdout"]["by_kind"].items())
    log(f"   held-out per-step error: MAPE {ho.get('mape', float('nan')):.1%}, "
        f"P90 {ho.get('p90_abs', float('nan')):.1%}; by kind {by_kind}")
    meta = _metadata(setup, preset, spec, ex_timing=ex_timing, att_report=att_report, points=points,
                     grid_seed=grid_seed, holdout=holdout, noise=noise, fit_q=fit_q)
    replay_shapes = [x.shape for x in samples if x.source == "replay"] or shapes
    replay_kinds = [x.kind for x in samples if x.source == "replay"] or kinds
    meta["terms"] = term_table(coefs, replay_shapes, replay_kinds, meta["kv_bytes_per_token"])
    meta["replays"] = runs
    if link:
        meta[LINK_KEY] = measure_link(setup.device, model_shape=setup.model_shape, dtype=DTYPES[setup.dtype],
                                      block_size=setup.block_size, repeats=link_repeats, seed=grid_seed,
                                      timing="thread_cpu" if ex_timing == "thread_cpu" else "wall", log=log)
    meta["calibration_wall_s"] = round(time.perf_counter() - t_start, 2)
    meta["host_load_average"] = load_average()  # 1/5/15-minute: contention from other processes on a shared host
    return FittedLatency(coefs, meta), _sample_rows(samples, held, pred, err)


def _metadata(setup: CalibrationSetup, preset: GridPreset, spec: Any, *, ex_timing: str, att_report: dict[str, Any],
              points: list[GridPoint], grid_seed: int, holdout: float, noise: dict[str, Any],
              fit_q: dict[str, Any]) -> dict[str, Any]:
    """The model file's metadata: where and how it was calibrated, and how well it fits."""
    elt = torch.tensor([], dtype=DTYPES[setup.dtype]).element_size()
    kv_bytes = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * elt
    return {
        "device": device_name(torch.device(setup.device)),
        "device_type": setup.device,
        "torch_version": torch.__version__,
        "git_commit": _git_commit(),
        "versions": _versions(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "model_shape": spec.name,
        "dtype": setup.dtype,
        "attention": att_report.get("name"),
        "attention_requested": setup.attention,
        "block_size": setup.block_size,
        "num_threads": torch.get_num_threads() if setup.device == "cpu" else None,
        "timing": ex_timing,
        "timing_repeats": setup.timing_repeats,
        "seed": setup.seed,
        "kv_bytes_per_token": kv_bytes,
        "units": "seconds per unit of each feature; kv_read_tokens x kv_bytes_per_token = KV bytes read",
        "grid": {"preset": dict(vars(preset)), "seed": grid_seed, "holdout_share": holdout,
                 "counts": {k: sum(1 for g in points if g.kind == k) for k in KINDS}},
        "noise_floor": noise,
        "fit": fit_q,
    }


def _sample_rows(samples: list[Sample], held: list[bool], pred: np.ndarray, err: np.ndarray) -> list[dict[str, Any]]:
    rows = []
    for i, x in enumerate(samples):
        s = x.shape
        rows.append({"source": x.source, "kind": x.kind, "label": x.label, "heldout": held[i],
                     "num_seqs": s.num_seqs, "num_decode_seqs": s.num_decode_seqs, "num_new_tokens": s.num_new_tokens,
                     "num_prefill_tokens": s.num_prefill_tokens, "context_tokens": s.context_tokens,
                     "attention_pairs": s.attention_pairs, "median_s": x.seconds,
                     "cv": x.cv if x.cv is not None else "", "min_s": x.min_s if x.min_s is not None else "",
                     "max_s": x.max_s if x.max_s is not None else "", "predicted_s": float(pred[i]),
                     "rel_error": float(err[i])})
    return rows


def _versions() -> dict[str, str | None]:
    from sim.experiment.results import package_versions

    return package_versions()


def _git_commit() -> str | None:
    from sim.experiment.results import git_commit

    return git_commit(Path(__file__).resolve().parent)


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


def run_from_args(args: argparse.Namespace) -> int:
    setup = CalibrationSetup()
    if args.config:
        setup, _ = setup_from_config(args.config)
    for attr, key in (("model_shape", "model"), ("device", "device"), ("dtype", "dtype"), ("attention", "attention"),
                      ("block_size", "block_size"), ("num_threads", "threads"), ("seed", "seed"),
                      ("timing", "timing"), ("timing_repeats", "timing_repeats")):
        v = getattr(args, key)
        if v is not None:
            setattr(setup, attr, v)
    if setup.device == "cpu" and not setup.num_threads:
        setup.num_threads = 1
    grid = args.grid if args.grid != "auto" else ("gpu" if setup.device == "cuda" else "cpu")
    model, rows = calibrate(setup, PRESETS[grid], replays=args.replay, replay_overrides=args.set,
                            holdout=args.holdout, grid_seed=args.grid_seed, warmup=args.warmup, repeats=args.repeats,
                            budget_s=args.budget_s, replay_budget_s=args.replay_budget_s,
                            replay_retime_passes=args.replay_retime_passes, link=not args.no_link,
                            link_repeats=args.link_repeats)
    path, samples = write_outputs(model, rows, args.out)
    print(f"coefficients: {json.dumps(model.coefs)}")
    print(f"wrote {path} and {samples}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="apcsim calibrate", description=(__doc__ or "").split("\n\n")[0])
    add_calibrate_arguments(ap)
    return run_from_args(ap.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
