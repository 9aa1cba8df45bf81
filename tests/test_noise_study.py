"""The noise study's instruments: seeded per-step noise on a simulated replay and how
much per-request error it makes, and the report rendered from raw times."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from gpu_backend.validation import noise_report, noise_study
from sim.core.executor import StepShape
from sim.timing.latency import FixedLatency


def test_noisy_latency_is_seeded_lognormal_around_its_base():
    a, b = (noise_study.NoisyLatency(FixedLatency(0.01), 0.1, seed=3) for _ in range(2))
    shape = StepShape.decode_only(2, 100)
    xa = np.array([a.step_time(shape) for _ in range(2000)])
    assert np.array_equal(xa, [b.step_time(shape) for _ in range(2000)])  # same seed, same draws
    assert np.std(np.log(xa / 0.01)) == pytest.approx(0.1, rel=0.1)
    assert noise_study.NoisyLatency(FixedLatency(0.01), 0.0, seed=1).step_time(shape) == 0.01


def test_amplification_grows_with_the_per_step_noise():
    rows = noise_study.amplification(["configs/validate_chat_cpu.yaml"], (0.0, 0.02, 0.2), 1, log=lambda *_: None)
    mape = [r["ttft_mape"] for r in rows]
    assert mape[0] == 0.0 and 0 < mape[1] < mape[2]  # no noise, no error; more noise, more error


def test_report_renders_the_measured_rows(tmp_path):
    spread = {"n": 3, "median_ms": 2.0, "cv": 0.1, "p90_over_median": 1.2}
    row = {"setting": "thread_cpu, 1 thread", "shape": "decode 4 x 128", "median_of_1": spread,
           "median_of_3": dict(spread, cv=0.05), "median_of_5": dict(spread, cv=0.04), "first_run_penalty": 1.01,
           "steal_share": 0.002, "raw_s": [[0.002] * 5] * 3}
    noise_report.write_report(tmp_path, {"step_noise": [row], "amplification": [], "real_vs_real": [], "host": {},
                                         "git_commit": "abc"})
    md = (tmp_path / "noise.md").read_text()
    assert "| thread_cpu, 1 thread | decode 4 x 128 | 2.00 ms | 10.0 % | 5.0 % | 4.0 % |" in md
    data = json.loads((tmp_path / "noise.json").read_text())
    assert data["git_commit"] == "abc" and data["versions"]["torch"]
