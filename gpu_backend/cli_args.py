"""Command-line arguments of ``apcsim calibrate`` and ``apcsim validate`` -- torch-free, so that
building the ``apcsim`` parser never imports torch (the commands import it when they run)."""

from __future__ import annotations

import argparse

GRID_PRESETS = ("quick", "cpu", "gpu")  # gpu_backend.calibrate.PRESETS (checked there)
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # gpu_backend.model.DTYPES
ATTENTIONS = ("auto", "reference", "triton", "flash_paged", "flash_gather")


def add_calibrate_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config", default=None,
                    help="take model shape, dtype, device, attention, threads, seed and block size from this "
                         "experiment config's backend:/engine: sections (the flags below override)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None)
    ap.add_argument("--model", default=None, help="model shape: tiny (default), llama-3-8b, ... or a YAML path")
    ap.add_argument("--dtype", choices=DTYPE_NAMES, default=None)
    ap.add_argument("--attention", choices=ATTENTIONS, default=None)
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on a CPU)")
    ap.add_argument("--seed", type=int, default=None, help="weight seed")
    ap.add_argument("--grid", choices=(*GRID_PRESETS, "auto"), default="auto",
                    help="profiling grid: quick (CI), cpu, gpu; auto = gpu on cuda, cpu otherwise")
    ap.add_argument("--warmup", type=int, default=None, help="discarded rounds over the grid (preset default)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds; a point's time is their median")
    ap.add_argument("--holdout", type=float, default=0.25, help="share of grid points kept out of the fit")
    ap.add_argument("--grid-seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=None, help="stop timing rounds beyond this (>= 2 rounds)")
    ap.add_argument("--out", required=True, help="model file to write (.json or .yaml); samples go beside it")


def add_validate_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("config", help="experiment YAML (engine, workload, backend:; latency: fitted or --model-file)")
    ap.add_argument("--model-file", default=None, help="fitted latency model file (overrides the config's latency:)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (repeatable)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None, help="backend.device override")
    ap.add_argument("--real-runs", type=int, default=2, help="real replays (>= 2 gives the noise floor)")
    ap.add_argument("--warmup-steps", type=int, default=3, help="discarded warm-up steps before each real replay")
    ap.add_argument("--out", default=None, help="report folder (default <output_dir>/<name>/validate)")
