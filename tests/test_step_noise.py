"""Step-time jitter (``latency.noise``): its default comes from the real backend's measured noise,
a step's factor depends on its index only, zero noise changes nothing, and the fast-forward stays
exact under noise."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.experiment.config import ConfigError, config_from_dict, config_to_dict
from sim.experiment.engine_description import resolve
from sim.experiment.run import build_scheduler, replay_experiment, simulated_executor
from sim.experiment.sweep_config import point_key
from sim.experiment.workload import build_workload
from sim.replay.engine import Replay
from sim.timing.step_noise import CHUNK, DEFAULT_SIGMA, REFERENCE_MEDIAN_CV, StepNoise

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference" / "cpu_tiny"


def test_default_sigma_tracks_the_cpu_reference_noise_floor():
    floor = json.loads((REFERENCE / "model.json").read_text())["noise_floor"]
    assert DEFAULT_SIGMA == round(math.sqrt(math.log1p(REFERENCE_MEDIAN_CV ** 2)), 4) == 0.124
    # the committed reference's noise floor moves from run to run (10.9 %, 12.4 %, 14.6 %, 13.7 % on this
    # project's host): the default stays within 15 % of it; beyond that it needs a new default (and re-recorded
    # results), whichever the direction
    assert abs(REFERENCE_MEDIAN_CV - floor["median_cv"]) <= 0.15 * floor["median_cv"]
    with open(REFERENCE / "model.samples.csv") as f:
        cvs = [float(row["cv"]) for row in csv.DictReader(f) if row["source"] == "grid"]  # replay steps: timed once
    assert len(cvs) == 140 and float(np.median(cvs)) == pytest.approx(floor["median_cv"], rel=1e-5)


def test_factor_is_a_pure_function_of_seed_and_step():
    a, b = StepNoise(0.3, 7), StepNoise(0.3, 7)
    steps = [5, CHUNK + 3, 2, 3 * CHUNK, 5, CHUNK + 3]
    forward = [a.factor(i) for i in steps]
    backward = [b.factor(i) for i in reversed(steps)][::-1]
    assert forward == backward and forward[0] == forward[4]
    assert StepNoise(0.3, 8).factor(5) != forward[0]


def test_factor_has_mean_one_and_the_configured_spread():
    n = StepNoise(DEFAULT_SIGMA, 1)
    x = np.array([n.factor(i) for i in range(40_000)])
    assert x.mean() == pytest.approx(1.0, abs=0.004)
    assert x.std() / x.mean() == pytest.approx(REFERENCE_MEDIAN_CV, rel=0.03)
    assert StepNoise(0.0, 1).factor(12) == 1.0
    with pytest.raises(ValueError):
        StepNoise(-0.1, 0)


CHAT = {
    "name": "noise_test", "seed": 2, "engine": {"block_size": 16, "num_gpu_blocks": 3000, "max_model_len": 32768},
    "latency": {"kind": "roofline"},
    "workload": {"kind": "chat", "sessions": 10, "output_tokens": 80, "arrival": {"kind": "poisson", "rate": 2.0}},
}


def _cfg(noise=None):
    data = json.loads(json.dumps(CHAT))
    if noise is not None:
        data["latency"]["noise"] = noise
    return config_from_dict(data, "chat.yaml")


def _replay(noise=None, fast_forward=True):
    """The normal replay; returns the result and the number of fast-forwarded steps."""
    cfg = _cfg(noise)
    engine = resolve(cfg)
    sched = build_scheduler(engine)
    replay = Replay(sched, simulated_executor(cfg, sched), build_workload(cfg, engine).requests,
                    fast_forward=fast_forward)
    return replay.run(), replay.num_window_steps


def test_zero_noise_leaves_results_identical():
    (plain, _), (zero, _) = _replay(), _replay({"kind": "lognormal", "sigma": 0.0})
    pd.testing.assert_frame_equal(plain.requests, zero.requests)
    pd.testing.assert_frame_equal(plain.steps, zero.steps)
    assert plain.summary == zero.summary
    via_run, _ = replay_experiment(_cfg({"kind": "lognormal", "sigma": 0.0}), progress=False)
    pd.testing.assert_frame_equal(plain.requests, via_run.requests)


def test_unset_noise_keeps_the_resolved_config_and_point_key():
    cfg = _cfg()
    assert "noise" not in config_to_dict(cfg)["latency"] and "sidechannel" not in config_to_dict(cfg)
    with_noise = _cfg({"kind": "lognormal"})
    assert config_to_dict(with_noise)["latency"]["noise"] == {"kind": "lognormal", "sigma": DEFAULT_SIGMA, "seed": None}
    assert point_key(cfg, True) != point_key(with_noise, True)


def test_noise_jitters_step_durations_and_fast_forward_stays_exact():
    (plain, _), (noisy, windows) = _replay(), _replay({"kind": "lognormal", "sigma": 0.2})
    ratio = noisy.steps["duration"].to_numpy()[:50] / plain.steps["duration"].to_numpy()[:50]
    assert not np.allclose(ratio, 1.0)  # jittered (the schedule itself may diverge later)
    assert windows > len(noisy.steps) // 2  # most steps were priced ahead by the fast-forward
    stepwise, none = _replay({"kind": "lognormal", "sigma": 0.2}, fast_forward=False)
    assert none == 0
    pd.testing.assert_frame_equal(noisy.requests, stepwise.requests)
    pd.testing.assert_frame_equal(noisy.steps, stepwise.steps)
    seeded, _ = _replay({"kind": "lognormal", "sigma": 0.2, "seed": 99})
    assert not seeded.steps["duration"].equals(noisy.steps["duration"])


def test_noise_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"chat\.yaml: latency\.noise\.sigma: Input should be greater than or equal"):
        _replay({"kind": "lognormal", "sigma": -1})
    with pytest.raises(ConfigError, match=r"latency\.noise\.sigmaa: unknown key"):
        _replay({"kind": "lognormal", "sigmaa": 1})
