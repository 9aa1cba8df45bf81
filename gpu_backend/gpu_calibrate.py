"""One prepared command for a GPU session: calibrate the latency model on the device, then
validate simulated against real per-request latency on held-out chat and RAG workloads.

Run from the repository root (``gpu_backend/gpu_calibrate.sh`` sets ``PYTHONPATH``, installs carried
simpy/pydantic wheels when the image lacks them, and calls this)::

    bash gpu_backend/gpu_calibrate.sh                        # CUDA: Llama-3-8B bf16, < 8 minutes on an H200
    bash gpu_backend/gpu_calibrate.sh --device cpu --quick   # CPU smoke test of this script (tiny model)

Steps, in one process (CUDA context and Triton kernels compiled once):

1. ``calibrate`` with the backend settings of the first validation config (model shape, dtype,
   attention, block size) on the ``gpu`` grid (``cpu`` / ``quick`` on a CPU), timing rounds capped
   by ``--calib-budget-s``;
2. ``validate`` each config (default ``configs/validate_chat_h200.yaml`` and
   ``configs/validate_rag_h200.yaml``; the ``_cpu`` ones on a CPU) with the fresh model file, two
   real runs each when the remaining time allows (estimated from the simulated replay).

Output under ``--out`` (default ``$OUT``), at most 8 files, two levels deep at most (the device
tool's limits): ``model.json`` (the fitted model), ``summary.md`` (calibration + every validation
table), ``log.txt``, ``<name>_scatter.png`` and ``<name>_cdf.png`` for the first two configs, and
``gpu_calibrate.tar.gz`` holding everything (model samples, every report folder with
``report.{md,json}``, ``pairs.csv``, ``steps_real1.csv`` and the plots). Exit status 0 when the
calibration and every validation finished (the accuracy targets are reported, not enforced).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import torch

from gpu_backend.calibrate import calibrate, setup_from_config, write_outputs
from gpu_backend.profiling_grid import PRESETS
from gpu_backend.validate import validate, with_fitted_latency
from gpu_backend.validation_report import render_markdown, validation_table
from sim.experiment.config import load_config

ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIGS = ("configs/validate_chat_h200.yaml", "configs/validate_rag_h200.yaml")
CPU_CONFIGS = ("configs/validate_chat_cpu.yaml", "configs/validate_rag_cpu.yaml")


class _Log:
    """Prints and keeps every line (written to log.txt)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(str(line))


def _fmt_fit(meta: dict[str, Any], coefs: dict[str, float]) -> list[str]:
    fit = meta.get("fit", {})
    noise = meta.get("noise_floor", {})
    ho = fit.get("holdout", {})
    lines = [f"- device {meta.get('device')}, torch {meta.get('torch_version')}, {meta.get('model_shape')} "
             f"{meta.get('dtype')}, attention {meta.get('attention')}, block {meta.get('block_size')}, "
             f"commit {str(meta.get('git_commit'))[:12]}, {meta.get('created')}",
             f"- grid: {fit.get('n_samples')} shapes ({fit.get('n_holdout')} held out), {noise.get('repeats')} timed "
             f"rounds after {noise.get('warmup_rounds')} warm-up; noise floor (repeat CV) median "
             f"{100 * noise.get('median_cv', float('nan')):.1f} %, P90 {100 * noise.get('p90_cv', float('nan')):.1f} %",
             f"- feature set `{fit.get('feature_set')}`; "
             f"held-out per-step MAPE {100 * ho.get('mape', float('nan')):.1f} %, "
             f"P90 {100 * ho.get('p90_abs', float('nan')):.1f} %, max {100 * ho.get('max_abs', float('nan')):.1f} %",
             "", "| feature | seconds per unit |", "|---|---|"]
    lines += [f"| {k} | {v:.4g} |" for k, v in coefs.items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: quick grid, small workloads")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_calibrate_out")
    ap.add_argument("--configs", nargs="+", default=None, help="validation configs (default: by device)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of every validation config (repeatable)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="whole run; validation runs are cut to fit")
    ap.add_argument("--calib-budget-s", type=float, default=None, help="timing rounds of the calibration")
    ap.add_argument("--real-runs", type=int, default=2)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    log = _Log()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_calibrate: CUDA requested but not available", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "gpu_calibrate"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    configs = [ROOT / c for c in (args.configs or (GPU_CONFIGS if args.device == "cuda" else CPU_CONFIGS))]
    overrides = [f"backend.device={args.device}", *args.set]
    if args.quick:
        overrides += ["workload.limit=12"]

    # -- 1. calibration, with the backend settings of the first validation config ---------------
    setup, _ = setup_from_config(str(configs[0]))
    setup.device = args.device
    grid = "gpu" if args.device == "cuda" else ("quick" if args.quick else "cpu")
    default_budget = 150.0 if args.device == "cuda" else 60.0
    calib_budget = args.calib_budget_s if args.calib_budget_s is not None else default_budget
    log(f"== calibrate ({grid} grid, timing budget {calib_budget:.0f} s)")
    model, rows = calibrate(setup, PRESETS[grid], budget_s=calib_budget, log=log)
    model_path, samples_path = write_outputs(model, rows, work / "model.json")
    shutil.copy(model_path, out / "model.json")
    log(f"   coefficients: {json.dumps(model.coefs)}")
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()

    # -- 2. validation on held-out workloads -----------------------------------------------------
    summary = [f"# Calibration and validation on {model.metadata.get('device')}", "",
               "## Calibration", "", *_fmt_fit(model.metadata, model.coefs), ""]
    ok = True
    reports = []
    for i, path in enumerate(configs):
        left = args.budget_s - (time.perf_counter() - t0)
        per = left / (len(configs) - i)
        cfg = with_fitted_latency(load_config(path, overrides), model_path)
        log(f"== validate {cfg.name} (budget {per:.0f} s)")
        try:
            rep = validate(cfg, work / cfg.name, real_runs=args.real_runs, budget_s=per, log=log)
        except Exception as exc:  # report and go on with the next workload
            ok = False
            log(f"   FAILED: {type(exc).__name__}: {exc}")
            summary += [f"## {cfg.name}", "", f"FAILED: {type(exc).__name__}: {exc}", ""]
            continue
        reports.append(rep)
        md = render_markdown(rep).splitlines()
        summary += [f"## {cfg.name}", "", *md[2:]]
        if i < 2:
            for png in ("scatter", "cdf"):
                shutil.copy(work / cfg.name / f"{png}.png", out / f"{cfg.name}_{png}.png")
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    summary.append(f"Total wall time {time.perf_counter() - t0:.0f} s.")
    (work / "summary.md").write_text("\n".join(summary) + "\n")
    shutil.copy(work / "summary.md", out / "summary.md")
    log(f"== done in {time.perf_counter() - t0:.0f} s; {'all finished' if ok else 'SOME VALIDATION FAILED'}")
    for rep in reports:
        log(f"   {rep['name']}:")
        for line in validation_table(rep["stats"]):
            log("   " + line)
    (work / "log.txt").write_text("\n".join(log.lines) + "\n")
    shutil.copy(work / "log.txt", out / "log.txt")
    with tarfile.open(out / "gpu_calibrate.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="gpu_calibrate")
    shutil.rmtree(work)
    print(f"wrote {out}/: model.json, summary.md, log.txt, plots, gpu_calibrate.tar.gz ({samples_path.name} and "
          f"every report folder inside)")
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
