"""Calibration samples from real replays: every step a workload's replay runs, timed as it runs.

Mirrors vLLM's engine loop with a real model runner (``EngineCore.step``): the calibration
workloads (configs of their own, never the validation ones) are replayed through the SimPy loop,
the scheduler and the pool on the torch backend (:func:`gpu_backend.executor.real_run.real_run`, the very
function ``apcsim validate`` times its real runs with), so each sample is a step of a real step
sequence -- back to back, warm cache and allocator, real block tables -- with its exact
:class:`~sim.core.executor.StepShape` and measured seconds. With re-timing (``retime_passes``)
a sample's seconds are the step's median over passes that time the replay's steps again in replay
order after it (:func:`gpu_backend.executor.real_run.real_run`): the very estimator the validation judges
its per-step error against, instead of one noisy measurement. Isolated shapes in shuffled order
(:mod:`gpu_backend.calibration.profiling_grid`) complement them where replays do not reach.

Invariants: a calibration replay runs with the calibration's backend settings (model shape, dtype,
device, attention, threads, timing and its repeats, weight seed: set on the config, whatever it
says) and its block size must equal the calibration's (else ValueError); a replay whose estimated
time would overrun the budget is skipped and reported, never cut in the middle; empty steps (no
forward pass) are not samples. Imports torch (through the real run).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_backend.executor.real_run import RealRun, real_run
from sim.core.executor import StepShape

if TYPE_CHECKING:  # pragma: no cover
    from gpu_backend.calibration.calibration_setup import CalibrationSetup


@dataclass(frozen=True)
class ReplaySample:
    source: str  # the calibration config's name
    step: int  # index among the replay's timed steps
    kind: str  # prefill | decode | mixed (gpu_backend.executor.executor.step_kind)
    shape: StepShape
    seconds: float


def samples_of(name: str, run: RealRun) -> list[ReplaySample]:
    """Every timed step of a real run as calibration samples: its median over the re-timing passes
    when the run was re-timed, else the replay's own measurement."""
    secs = run.steps_measured
    if run.steps_retimed is not None and run.steps_retimed.size == secs.size:
        secs = run.steps_retimed
    return [ReplaySample(name, i, kind, shape, float(t))
            for i, (shape, kind, t) in enumerate(zip(run.step_shapes, run.step_kinds, secs))]


def run_record(name: str, path: str | Path | None, run: RealRun) -> dict[str, object]:
    counts = {k: run.step_kinds.count(k) for k in ("prefill", "decode", "mixed")}
    return {"name": name, "config": str(path) if path is not None else None, "steps": len(run.step_shapes),
            "by_kind": counts, "requests": int(len(run.requests)), "wall_s": round(run.wall_s, 2),
            "measured_s": round(float(run.steps_measured.sum()), 3), "retime_passes": run.retime_passes}


def backend_overrides(setup: CalibrationSetup) -> list[str]:
    """``--set`` overrides that give a config the calibration's backend settings."""
    out = [f"backend.model_shape={setup.model_shape}", f"backend.dtype={setup.dtype}",
           f"backend.device={setup.device}", f"backend.attention={setup.attention}", f"backend.seed={setup.seed}",
           f"backend.timing={setup.timing}", f"backend.timing_repeats={setup.timing_repeats}"]
    if setup.num_threads:
        out.append(f"backend.num_threads={setup.num_threads}")
    return out


def replay_samples(configs: Sequence[str | Path], setup: CalibrationSetup, *, overrides: Sequence[str] = (),
                   budget_s: float | None = None, retime_passes: int = 0,
                   log: Callable[[str], object] = print) -> tuple[
                       list[ReplaySample], list[dict[str, object]]]:
    """Replay each config on the torch backend; returns every timed step and one record per replay
    (name, steps, wall seconds, or why it was skipped). ``retime_passes`` > 0: each step's sample is
    its median over that many re-timing passes after the replay."""
    from sim.experiment.config import load_config

    t0 = time.perf_counter()
    samples: list[ReplaySample] = []
    runs: list[dict[str, object]] = []
    last_wall = 0.0
    for path in configs:
        cfg = load_config(path, [*backend_overrides(setup), *overrides])
        if cfg.engine.block_size != setup.block_size:
            raise ValueError(f"{path}: engine.block_size {cfg.engine.block_size} differs from the calibration's "
                             f"block size {setup.block_size}")
        spent = time.perf_counter() - t0
        if budget_s is not None and samples and spent + last_wall > budget_s:
            runs.append({"name": cfg.name, "skipped": f"time budget {budget_s:.0f} s (spent {spent:.0f} s)"})
            log(f"   replay {cfg.name}: skipped, {runs[-1]['skipped']}")
            continue
        t_run = time.perf_counter()
        run = real_run(cfg, None, retime_passes=retime_passes)
        last_wall = time.perf_counter() - t_run
        samples += samples_of(cfg.name, run)
        runs.append(run_record(cfg.name, path, run))
        log(f"   replay {cfg.name}: {len(run.step_shapes)} timed steps {runs[-1]['by_kind']} "
            f"in {run.wall_s:.1f} s wall")
    return samples, runs
