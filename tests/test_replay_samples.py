"""Calibration samples from real replays: a re-timed replay gives each step's median over the
passes (the validation's estimator), an untimed one the replay's own measurement."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")

from gpu_backend.calibration.calibration_setup import CalibrationSetup
from gpu_backend.calibration.replay_samples import replay_samples, samples_of
from gpu_backend.executor.real_run import RealRun
from sim.core.executor import StepShape

ROOT = Path(__file__).resolve().parents[1]


def _run(retimed: np.ndarray | None) -> RealRun:
    shapes = [StepShape.prefill_only(32), StepShape.decode_only(1, 33), StepShape.decode_only(2, 70)]
    return RealRun(pd.DataFrame(), {}, np.array([3e-3, 2e-3, 2.5e-3]), np.full(3, np.nan),
                   ["prefill", "decode", "decode"], shapes, {}, 0.1, retimed, 0 if retimed is None else 4)


def test_samples_are_the_medians_of_a_retimed_run_else_its_measurements() -> None:
    plain = samples_of("cal", _run(None))
    assert [s.seconds for s in plain] == [3e-3, 2e-3, 2.5e-3] and [s.step for s in plain] == [0, 1, 2]
    again = samples_of("cal", _run(np.array([2.8e-3, 2.1e-3, 2.4e-3])))
    assert [s.seconds for s in again] == [2.8e-3, 2.1e-3, 2.4e-3]
    assert [s.kind for s in again] == ["prefill", "decode", "decode"] and again[2].shape.num_seqs == 2


def test_replay_samples_retime_every_step() -> None:
    setup = CalibrationSetup(timing="thread_cpu", num_threads=1)
    import torch

    torch.set_num_threads(1)
    samples, runs = replay_samples([ROOT / "configs/calibrate_chat_cpu.yaml"], setup,
                                   overrides=["workload.limit=3"], retime_passes=2, log=lambda *_: None)
    assert runs[0]["retime_passes"] == 2 and runs[0]["steps"] == len(samples) > 0
    assert all(s.seconds > 0 for s in samples)
