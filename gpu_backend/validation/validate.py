"""``apcsim validate CONFIG``: simulated vs real per-request latency on one workload.

Mirrors nothing in vLLM (it checks the simulator against real forward passes). The same config
(scheduler, pool, workload) is replayed

* once **simulated**: the SimPy replay with the calibrated latency model (``latency: {kind: fitted,
  path: ...}`` in the config, or ``--model-file``);
* ``--real-runs`` times (default 2) **real** (:mod:`gpu_backend.executor.real_run`): the same SimPy replay
  with every step a real forward pass on the torch backend (config section ``backend:``), step
  durations measured.

Timing semantics: in both replays a step's duration advances the SimPy clock and requests arrive on
that clock, so the only difference between the simulated and the real run is where step durations
come from. When the simulated and measured durations differ, the scheduler may batch differently
(a request may arrive before or after a step starts); the comparison is per request anyway -- it
is what a user of the simulator reads -- and the report says how often the prefix-cache
``hit_tokens`` granted at admission agree between the runs. Scheduler (Python) time is in neither.

The figures (MAPE, signed percentile errors, Pearson r, quality band, noise floor between real
runs, and the latency model's error targets) are :mod:`gpu_backend.validation.latency_error`'s; plus the latency
model's in-situ per-step error on every step of real run 1, by step kind.

Output folder (default ``<output_dir>/<name>/validate``): ``report.md``
(:mod:`gpu_backend.validation.validation_report`), ``report.json``, ``pairs.csv`` (one row per request: sim,
real and real-2 TTFT/TPOT/E2E and hit tokens), ``steps_real1.csv`` (every step of real run 1:
shape, measured and predicted seconds), ``scatter.png``, ``cdf.png``
(:mod:`gpu_backend.validation.validation_plots`).

Invariants: the simulated replay needs a fitted latency model (else ConfigError); at least one real
run; with a time budget, fewer real runs (never none) and a warning saying so. Imports torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_backend.calibration.host import load_average
from gpu_backend.calibration.profiling_grid import PRESETS
from gpu_backend.executor.real_run import RealRun, per_step_error, real_run, steps_table
from gpu_backend.validation.latency_error import pairs_table, summarize_pairs, targets
from gpu_backend.validation.validation_plots import plot_cdf, plot_scatter
from gpu_backend.validation.validation_report import render_markdown, validation_table
from sim.cli.calibrate import add_validate_arguments
from sim.experiment.config import ConfigError, ExperimentConfig, config_from_dict, config_to_dict, load_config
from sim.experiment.results import git_commit, package_versions, write_json
from sim.experiment.run import build_latency, replay_experiment
from sim.timing.fitted_latency import FittedLatency


def with_fitted_latency(cfg: ExperimentConfig, model_file: str | Path | None) -> ExperimentConfig:
    """``cfg`` with ``latency: {kind: fitted, path: model_file}`` when a file is given; else ``cfg``
    must already use a fitted model."""
    if model_file is not None:
        data = config_to_dict(cfg)
        data["latency"] = {"kind": "fitted", "path": str(Path(model_file).resolve())}
        return config_from_dict(data, cfg.source, cfg.base_dir)
    if cfg.latency.kind != "fitted":
        raise ConfigError(f"{cfg.source}: latency.kind: validate needs a fitted model "
                          f"(latency: {{kind: fitted, path: ...}} or --model-file), got {cfg.latency.kind!r}")
    return cfg


def consistency_warnings(cfg: ExperimentConfig, model: FittedLatency) -> list[str]:
    """Where the model file was calibrated under other settings than this config's backend runs."""
    meta = model.metadata
    b = cfg.backend
    want: dict[str, Any] = {"model_shape": b.model_shape, "dtype": b.dtype, "device_type": b.device,
                            "block_size": cfg.engine.block_size, "attention_requested": b.attention,
                            "timing": b.timing if b.device == "cuda" or b.timing == "thread_cpu" else "wall",
                            "timing_repeats": b.timing_repeats}
    if b.device == "cpu":
        want["num_threads"] = b.num_threads or torch.get_num_threads()
    out = []
    for key, value in want.items():
        if key in meta and meta[key] != value:
            out.append(f"model file {key}={meta[key]!r} but this config runs {value!r}")
    return out


def grid_preset_name(grid: Any) -> str | None:
    """The name of the profiling-grid preset (``gpu_backend.calibration.profiling_grid.PRESETS``) a model was
    calibrated on, from its metadata, or None when it matches none of them."""
    preset = grid.get("preset") if isinstance(grid, dict) else None
    for name, p in PRESETS.items():
        if isinstance(preset, dict) and json.loads(json.dumps(dataclasses.asdict(p))) == preset:
            return name
    return None


def _holdout_mape(fit_q: dict[str, Any]) -> float | None:
    """The model file's held-out per-step MAPE (``fit.holdout.all`` now, ``fit.holdout`` in older files)."""
    ho = fit_q.get("holdout", {})
    return ho.get("all", ho).get("mape") if isinstance(ho, dict) else None


def _display_path(p: Path) -> str:
    """``p`` resolved, relative to the working directory when it lies below it."""
    p = Path(p).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def validate(cfg: ExperimentConfig, out_dir: str | Path, *, real_runs: int = 2, warmup_steps: int = 3,
             budget_s: float | None = None, step_overhead_s: float = 0.002, retime_passes: int = 0,
             reals: list[RealRun] | None = None, log: Callable[[str], object] = print) -> dict[str, Any]:
    """Run the simulated and ``real_runs`` real replays of ``cfg`` and write the report folder.

    With ``budget_s``, the real replays' wall time is estimated from the simulated one (its summed
    step time plus ``step_overhead_s`` per step for the scheduler) and fewer real runs are made (at
    least one) when they would not fit; the report says so. ``reals`` are real runs of ``cfg``
    measured beforehand (e.g. interleaved with the calibration's replays, so that a shared
    machine's slow drift affects both alike); then none is run here. ``retime_passes``: see
    :func:`gpu_backend.executor.real_run.real_run` (the first real run only)."""
    if real_runs < 1:
        raise ValueError("need at least one real run")
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.backend.device == "cpu" and cfg.backend.num_threads:
        torch.set_num_threads(cfg.backend.num_threads)
    model = build_latency(cfg)
    if not isinstance(model, FittedLatency):
        raise ConfigError(f"{cfg.source}: latency.kind: validate needs a fitted model, got {cfg.latency.kind!r}")
    sim_result, workload = replay_experiment(cfg, progress=False)
    log(f"validate {cfg.name}: simulated replay: {len(sim_result.requests)} requests, "
        f"{sim_result.summary['num_steps']} steps, TTFT p50 {sim_result.summary['ttft_p50_s'] * 1e3:.2f} ms")
    warnings: list[str] = []
    if budget_s is not None:
        setup_s = 10.0 if cfg.backend.device == "cuda" else 0.5  # model build + warm-up
        est = float(sim_result.steps["duration"].sum()) + step_overhead_s * len(sim_result.steps) + setup_s
        fit = max(1, int((budget_s - (time.perf_counter() - t0)) // max(est, 1e-9)))
        if fit < real_runs:
            warnings.append(f"time budget {budget_s:.0f} s: {fit} real run(s) instead of {real_runs} "
                            f"(each estimated at {est:.1f} s from the simulated replay)")
            log("   " + warnings[-1])
            real_runs = fit
    if reals is not None:
        for run in reals:
            run.steps_predicted = np.array([model.step_time(s) for s in run.step_shapes])
        real_runs = len(reals)
    todo, reals = (0 if reals else real_runs), list(reals or [])
    for k in range(todo):
        run = real_run(cfg, model, warmup_steps, retime_passes if k == 0 else 0)
        reals.append(run)
        log(f"   real run {k + 1}: {run.summary['num_steps']} steps in {run.wall_s:.1f} s wall, "
            f"TTFT p50 {run.summary['ttft_p50_s'] * 1e3:.2f} ms")
    pairs = pairs_table(sim_result.requests, [r.requests for r in reals])
    stats = summarize_pairs(pairs, real_runs)
    per_step = per_step_error(reals[0])
    meta = model.metadata
    fit_q = meta.get("fit", {}) if isinstance(meta.get("fit"), dict) else {}
    noise = meta.get("noise_floor", {}) if isinstance(meta.get("noise_floor"), dict) else {}
    info = reals[0].executor_info
    report: dict[str, Any] = {
        "name": cfg.name,
        "workload": workload.description,
        "num_requests": int(len(pairs)),
        "num_real_runs": real_runs,
        "stats": stats,
        "per_step": per_step,
        "targets": targets(stats, per_step),
        "sim_summary": sim_result.summary,
        "real_summaries": [r.summary for r in reals],
        "real_wall_s": [r.wall_s for r in reals],
        "backend": {k: info.get(k) for k in ("device", "device_name", "model_shape", "dtype", "attention", "timing",
                                              "num_threads", "num_blocks", "block_size")},
        "model": {"path": _display_path(cfg.resolve_path(cfg.latency.path)) if cfg.latency.kind == "fitted" else None,
                  "features": dict(model.coefs), "device": meta.get("device"), "created": meta.get("created"),
                  "git_commit": meta.get("git_commit"), "torch_version": meta.get("torch_version"),
                  "feature_set": fit_q.get("feature_set"), "holdout_mape": _holdout_mape(fit_q),
                  "noise_median_cv": noise.get("median_cv"), "grid": grid_preset_name(meta.get("grid"))},
        "warnings": warnings + consistency_warnings(cfg, model),
        "load_average": load_average(),
        "config": config_to_dict(cfg),
        "config_path": _display_path(Path(cfg.source)),
        "git_commit": git_commit(Path(__file__).resolve().parent),
        "versions": package_versions(),
        "wall_s": 0.0,
    }
    pairs.to_csv(out / "pairs.csv", index=False, float_format="%.9g")
    steps_table(reals[0]).to_csv(out / "steps_real1.csv", index=False, float_format="%.6g")
    title = f"{cfg.name}: simulated vs real ({report['backend']['device_name']}, {report['backend']['model_shape']})"
    plot_scatter(pairs, out / "scatter.png", title, real_runs)
    plot_cdf(pairs, out / "cdf.png", title, real_runs)
    report["wall_s"] = time.perf_counter() - t0
    write_json(out / "report.json", report)
    (out / "report.md").write_text(render_markdown(report), encoding="utf-8")
    for line in validation_table(stats):
        log("   " + line)
    log(f"wrote {out}/report.md, report.json, pairs.csv, steps_real1.csv, scatter.png, cdf.png")
    return report


def run_from_args(args: argparse.Namespace) -> int:
    overrides = list(args.set)
    if args.device is not None:
        overrides.append(f"backend.device={args.device}")
    cfg = with_fitted_latency(load_config(args.config, overrides), args.model_file)
    if cfg.backend.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{cfg.source}: backend.device: cuda requested but torch sees no CUDA device")
    out = Path(args.out) if args.out else cfg.results_dir() / "validate"
    validate(cfg, out, real_runs=args.real_runs, warmup_steps=args.warmup_steps, retime_passes=args.retime_passes)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="apcsim validate", description=(__doc__ or "").split("\n\n")[0])
    add_validate_arguments(ap)
    try:
        return run_from_args(ap.parse_args(argv))
    except ConfigError as exc:
        print(f"apcsim validate: error: {exc}")
        return 2


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main())
