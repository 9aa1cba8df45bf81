"""A real replay for ``apcsim validate``: the config's SimPy replay with every step a torch forward
pass, and the latency model's in-situ error on its steps.

Mirrors vLLM's engine loop with a real model runner: the same scheduler and pool as the simulated
replay (``sim.experiment.run.replay_experiment``), only step durations come from the
:class:`~gpu_backend.executor.executor.TorchExecutor`'s measurements instead of the latency model.

Invariants: before each real replay the executor runs a few discarded warm-up steps on random pool
blocks, harmless to the replay (a block is only read after the replay itself wrote it); every
step's exact shape is kept, so the model prices the very steps that ran; the executor (and its
device memory) is released after the run. Imports torch.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from gpu_backend.executor.executor import TorchExecutor
from gpu_backend.executor.factory import make_torch_executor
from gpu_backend.layout.batch import SeqInput
from sim.core.executor import StepShape
from sim.core.scheduler import Scheduler
from sim.experiment.config import ExperimentConfig
from sim.experiment.run import replay_experiment
from sim.timing.fitted_latency import FittedLatency


@dataclass
class RealRun:
    requests: pd.DataFrame
    summary: dict[str, Any]
    steps_measured: np.ndarray
    steps_predicted: np.ndarray
    step_kinds: list[str]
    step_shapes: list[StepShape]
    executor_info: dict[str, Any]
    wall_s: float
    steps_retimed: np.ndarray | None = None  # per step: median over re-timing passes (None: not re-timed)
    retime_passes: int = 0
    step_inputs: list[list[SeqInput]] | None = None  # kept for re-timing later (keep_inputs)


def _warm_up(ex: TorchExecutor, cfg: ExperimentConfig, steps: int = 3) -> None:
    """A few discarded steps (a long prefill, a decode batch, a mixed step) on random pool blocks.
    Harmless to the replay: a block is only read after the replay itself wrote it."""
    cache = ex.cache
    bs = cache.block_size
    rng = np.random.default_rng(12345)
    e = cfg.engine
    n_pre = max(2, min(e.max_num_batched_tokens // 2, 512))
    n_dec = max(1, min(e.max_num_seqs, 8))
    ctx = 64
    need_pre = -(-n_pre // bs)
    need_dec = -(-(ctx + 1) // bs)
    if need_pre + n_dec * need_dec > cache.num_blocks - 1:
        return
    ids = (rng.permutation(cache.num_blocks - 1) + 1).tolist()
    pre = SeqInput("w-pre", rng.integers(0, 1000, n_pre), 0, ids[:need_pre])
    dec = [SeqInput(f"w-d{i}", rng.integers(0, 1000, 1), ctx,
                    ids[need_pre + i * need_dec: need_pre + (i + 1) * need_dec])
           for i in range(n_dec)]
    for _ in range(steps):
        ex.run_timed([pre])
        ex.run_timed(dec)
        ex.run_timed([pre, *dec])


def real_run(cfg: ExperimentConfig, model: FittedLatency | None, warmup_steps: int = 3,
             retime_passes: int = 0, keep_inputs: bool = False) -> RealRun:
    """Replay ``cfg`` on the torch backend; keep the per-step shapes to price them with ``model``
    (none: the predictions are NaN, e.g. when the replay is a calibration input).

    With ``retime_passes`` > 0, every step of the replay is timed again that many times after it,
    in passes over the whole sequence in replay order (back to back, as the replay ran them; a
    pass apart in time, so a slow spell of a shared machine hits one pass, not all), and
    ``steps_retimed`` holds each step's median over the passes: its cost with the measurement
    noise averaged out, against which the model's per-step error is the model's own. The replay
    itself (its clock, schedule and per-request latencies) is the one measured the first time."""
    made: list[TorchExecutor] = []

    def factory(c: ExperimentConfig, scheduler: Scheduler) -> TorchExecutor:
        ex = make_torch_executor(c, scheduler)
        _warm_up(ex, c, warmup_steps)
        ex.keep_inputs = retime_passes > 0 or keep_inputs
        made.append(ex)
        return ex

    t0 = time.perf_counter()
    result, workload = replay_experiment(cfg, progress=False, executor_factory=factory)
    wall = time.perf_counter() - t0
    ex = made[0]
    measured = np.array([row[4] for row in ex.step_log])
    predicted = np.array([model.step_time(s) if model is not None else np.nan for s in ex.step_shapes])
    kinds = [row[1] for row in ex.step_log]
    ex_shapes = ex.step_shapes
    retimed = None
    if retime_passes > 0:
        passes = [[ex.time_step(seqs) for seqs in ex.step_inputs] for _ in range(retime_passes)]
        retimed = np.median(np.array(passes), axis=0) if ex.step_inputs else np.zeros(0)
    inputs = list(ex.step_inputs) if keep_inputs else None
    ex.step_inputs.clear()
    info = workload.executor_info or ex.describe()
    made.clear()
    del ex
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return RealRun(result.requests, result.summary, measured, predicted, kinds, list(ex_shapes), info, wall,
                   retimed, retime_passes, inputs)


def retime(cfg: ExperimentConfig, inputs: list[list[SeqInput]], passes: int, warmup_steps: int = 3) -> np.ndarray:
    """``passes`` x steps: the steps of an earlier real run of ``cfg`` (its kept inputs) timed again
    in replay order on a fresh executor of the same config (same pool, so the block ids are valid;
    the K/V they read are whatever the pool holds -- the time does not depend on the values)."""
    from sim.experiment.engine_description import resolve
    from sim.experiment.run import build_scheduler

    ex = make_torch_executor(cfg, build_scheduler(resolve(cfg)))
    _warm_up(ex, cfg, warmup_steps)
    out = np.array([[ex.time_step(seqs) for seqs in inputs] for _ in range(passes)])
    del ex
    gc.collect()
    return out


def _errors(p: np.ndarray, y: np.ndarray, kinds: np.ndarray) -> dict[str, Any]:
    rel = (p - y) / y
    out: dict[str, Any] = {"n": int(y.size), "mape": float(np.abs(rel).mean()), "mean_signed": float(rel.mean()),
                           "total_ratio": float(p.sum() / y.sum()), "measured_total_s": float(y.sum()),
                           "predicted_total_s": float(p.sum())}
    out["by_kind"] = {k: {"n": int((kinds == k).sum()), "mape": float(np.abs(rel[kinds == k]).mean()),
                          "mean_signed": float(rel[kinds == k].mean())}
                      for k in ("prefill", "mixed", "decode") if (kinds == k).any()}
    return out


def per_step_error(run: RealRun) -> dict[str, Any]:
    """The model's error on every step of the run (overall and per step kind) against the step's
    time as the replay measured it; with re-timing (``retime_passes``), also against each step's
    median over the passes (``retimed``: the model's own error) and the replay's single
    measurement against that median (``measurement_noise``)."""
    y, p = run.steps_measured, run.steps_predicted
    out: dict[str, Any] = {"n": int(y.size)}
    if y.size:
        kinds = np.array(run.step_kinds)
        out.update(_errors(p, y, kinds))
        r = run.steps_retimed
        if r is not None and r.size == y.size:
            out["retimed"] = {"passes": run.retime_passes, **_errors(p, r, kinds)}
            out["measurement_noise"] = _errors(y, r, kinds)
    return out


def steps_table(run: RealRun) -> pd.DataFrame:
    """Every step of a real run: its shape, measured and predicted seconds."""
    rows = []
    for i, (shape, kind) in enumerate(zip(run.step_shapes, run.step_kinds)):
        rows.append({"step": i, "kind": kind, "num_seqs": shape.num_seqs, "num_decode_seqs": shape.num_decode_seqs,
                     "num_new_tokens": shape.num_new_tokens, "num_prefill_tokens": shape.num_prefill_tokens,
                     "context_tokens": shape.context_tokens, "attention_pairs": shape.attention_pairs,
                     "measured_s": float(run.steps_measured[i]), "predicted_s": float(run.steps_predicted[i]),
                     "retimed_s": float(run.steps_retimed[i]) if run.steps_retimed is not None else np.nan})
    return pd.DataFrame(rows)
