"""``apcsim calibrate`` and ``apcsim validate`` (mirror nothing in vLLM, whose start-up profiles
memory, not step time): their arguments and registration in the ``apcsim``
parser, and the registry :data:`COMMANDS` of the ``gpu_backend`` functions that run them.

Invariants: torch-free and ``gpu_backend``-free, so that building the parser (and every simulated
run) never imports either; a command imports its ``module:function`` entry
(``sim.experiment.backend.load_entry``) when it runs, and a missing torch or scipy is one
``ConfigError`` line. Imports neither torch nor gpu_backend."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from sim.cli.arguments import float_in, int_at_least

GRID_PRESETS = ("quick", "cpu", "gpu")  # gpu_backend.calibration.calibrate.PRESETS (checked there)
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # gpu_backend.executor.model.DTYPES
ATTENTIONS = ("auto", "reference", "triton", "flash_paged", "flash_gather")

COMMANDS: dict[str, str] = {
    "calibrate": "gpu_backend.calibration.calibrate:run_from_args",
    "validate": "gpu_backend.validation.validate:run_from_args",
}
"""The function behind each command, ``(args: argparse.Namespace) -> int``, by ``module:function``."""


def add_calibrate_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config", default=None,
                    help="take model shape, dtype, device, attention, threads, seed and block size from this "
                         "experiment config's backend:/engine: sections (the flags below override)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None)
    ap.add_argument("--model", default=None, help="model shape: tiny (default), llama-3-8b, ... or a YAML path")
    ap.add_argument("--dtype", choices=DTYPE_NAMES, default=None)
    ap.add_argument("--attention", choices=ATTENTIONS, default=None)
    ap.add_argument("--block-size", type=int_at_least(1), default=None)
    ap.add_argument("--threads", type=int_at_least(1), default=None, help="torch CPU threads (default 1 on a CPU)")
    ap.add_argument("--seed", type=int, default=None, help="weight seed")
    ap.add_argument("--timing", choices=("wall", "cuda_events", "thread_cpu"), default=None,
                    help="step timing (thread_cpu: the thread's CPU time, CPU with one thread)")
    ap.add_argument("--timing-repeats", type=int_at_least(1), default=None,
                    help="a step's time is the median of N runs of it")
    ap.add_argument("--replay", action="append", default=[], metavar="CONFIG",
                    help="a calibration workload: its real replay's steps are timed as it runs them and join the "
                         "fit (repeatable; use workloads other than the validation ones)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of every --replay config (repeatable)")
    ap.add_argument("--replay-budget-s", type=float_in(0.0), default=None, help="skip further replays beyond this")
    ap.add_argument("--replay-retime-passes", type=int_at_least(0), default=0,
                    help="time every step of each --replay again in N passes after it and fit on each step's "
                         "median over them (the estimator the validation's per-step error uses)")
    ap.add_argument("--grid", choices=(*GRID_PRESETS, "auto"), default="auto",
                    help="profiling grid: quick (CI), cpu, gpu; auto = gpu on cuda, cpu otherwise")
    ap.add_argument("--warmup", type=int_at_least(0), default=None,
                    help="discarded rounds over the grid (preset default)")
    ap.add_argument("--repeats", type=int_at_least(1), default=None,
                    help="timed rounds; a point's time is their median")
    ap.add_argument("--holdout", type=float_in(0.0, 1.0, low_open=False), default=0.25,
                    help="share of grid points kept out of the fit")
    ap.add_argument("--grid-seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float_in(0.0), default=None, help="stop timing rounds beyond this (>= 2 rounds)")
    ap.add_argument("--no-link", action="store_true",
                    help="skip timing the CPU offload tier's block copies (the model file's host_link section)")
    ap.add_argument("--link-repeats", type=int_at_least(1), default=7, help="timed rounds of the link's block copies")
    ap.add_argument("--out", required=True, help="model file to write (.json or .yaml); samples go beside it")


def add_validate_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("config", help="experiment YAML (engine, workload, backend:; latency: fitted or --model-file)")
    ap.add_argument("--model-file", default=None, help="fitted latency model file (overrides the config's latency:)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key (repeatable)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None, help="backend.device override")
    ap.add_argument("--real-runs", type=int_at_least(1), default=2, help="real replays (>= 2 gives the noise floor)")
    ap.add_argument("--warmup-steps", type=int_at_least(0), default=3,
                    help="discarded warm-up steps before each real replay")
    ap.add_argument("--retime-passes", type=int_at_least(0), default=0,
                    help="time every step of real run 1 again in N passes after it; the per-step error is also "
                         "reported against each step's median over them (measurement noise averaged out)")
    ap.add_argument("--out", default=None, help="report folder (default <output_dir>/<name>/validate)")


def add_calibration_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``calibrate`` and ``validate`` under ``apcsim``."""
    _add(sub, "calibrate", add_calibrate_arguments,
         "fit the latency model on real forward passes (profiling grid, NNLS, held-out error)")
    _add(sub, "validate", add_validate_arguments,
         "replay one config simulated (fitted model) and real (torch backend); report per-request error")


def _add(sub: argparse._SubParsersAction, name: str,
         add_arguments: Callable[[argparse.ArgumentParser], None], help_: str) -> None:
    cmd = sub.add_parser(name, help=help_)
    add_arguments(cmd)

    def run(args: argparse.Namespace) -> int:
        from sim.experiment.backend import load_entry
        from sim.experiment.config import ConfigError

        try:
            command = load_entry(COMMANDS[name])
        except ImportError as exc:
            raise ConfigError(f"apcsim {name} needs PyTorch and scipy ({exc}); "
                              f"install them with pip install -e '.[torch]'") from None
        return int(command(args))

    cmd.set_defaults(func=run)
