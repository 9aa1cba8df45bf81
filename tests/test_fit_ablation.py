"""The calibration ablation refits a reference folder's samples four ways: on synthetic steps whose
true cost has a multi-token step cost and whose single measurements carry skewed noise, the fit on
re-timed medians with ``multi_token_step`` recovers the cost, and each of the other fits shows the
error it is there to show."""

import json

import numpy as np
import pandas as pd
import pytest

from gpu_backend.calibration.fit_ablation import main
from sim.core.executor import StepShape
from sim.timing.fitted_latency import FittedLatency

TRUE = {"intercept": 2e-3, "num_seqs": 3e-4, "num_new_tokens": 8e-5, "attention_pairs": 8e-8,
        "kv_read_tokens": 1e-6, "multi_token_step": 4e-4}
FIELDS = ("num_seqs", "num_decode_seqs", "num_new_tokens", "num_prefill_tokens", "context_tokens", "attention_pairs")


def _shapes(rng: np.random.Generator, n: int) -> list[tuple[str, StepShape]]:
    out = []
    for _ in range(n):
        u = rng.random()
        if u < 0.6:  # decodes, many of one sequence (a GEMV step)
            b = int(rng.choice([1, 1, 1, 2, 3, 4, 6]))
            out.append(("decode", StepShape.decode_only(b, int(rng.integers(100, 600)) * b)))
        elif u < 0.8:
            out.append(("prefill", StepShape.prefill_only(int(rng.integers(8, 256)), int(rng.integers(0, 400)))))
        else:  # a prefill chunk plus decodes
            d, c, n_new = int(rng.integers(1, 5)), int(rng.integers(0, 300)), int(rng.integers(16, 160))
            pairs = d * 300 + n_new * c + n_new * (n_new + 1) // 2
            out.append(("mixed", StepShape(d + 1, d, n_new + d, n_new, c + 300 * d, pairs)))
    return out


def _rows(steps: list[tuple[str, StepShape]], model: FittedLatency) -> list[dict]:
    return [{"kind": k, **{f: getattr(s, f) for f in FIELDS}, "true_s": model.step_time(s)} for k, s in steps]


def _folder(tmp_path, rng):
    model = FittedLatency(TRUE)
    cal = pd.DataFrame(_rows(_shapes(rng, 400), model))
    cal["source"], cal["step"] = "calibrate_x", np.arange(len(cal))
    cal["retimed_s"] = cal["true_s"]
    cal["measured_s"] = cal["true_s"] * (1 + rng.exponential(0.15, len(cal)))  # a slow spell, never a fast one
    grid = pd.DataFrame(_rows(_shapes(rng, 60), model))
    samples = pd.concat([
        grid.assign(source="grid", label=[f"g{i}" for i in range(len(grid))], median_s=grid["true_s"]),
        cal.assign(label=cal["source"] + "#" + cal["step"].astype(str), median_s=cal["retimed_s"]),
    ], ignore_index=True)
    samples["heldout"] = rng.random(len(samples)) < 0.25
    samples[["source", "kind", "label", "heldout", *FIELDS, "median_s"]].to_csv(tmp_path / "model.samples.csv",
                                                                                index=False)
    cal[["step", "kind", *FIELDS, "measured_s", "retimed_s", "source"]].to_csv(
        tmp_path / "calibration_steps.csv", index=False)
    val = pd.DataFrame(_rows(_shapes(rng, 150), model))
    val["retimed_s"] = val["true_s"]
    (tmp_path / "validate_x").mkdir()
    val.to_csv(tmp_path / "validate_x" / "steps_real1.csv", index=False)
    return tmp_path


def test_ablation_separates_the_two_changes(tmp_path) -> None:
    folder = _folder(tmp_path, np.random.default_rng(3))
    assert main([str(folder)]) == 0
    full = json.loads((folder / "ablation.json").read_text())
    assert full["git_commit"] and full["versions"] and full["same_shape"]["by_workload"]
    rep = full["variants"]
    best = rep["re-timed median, base+multi_token"]
    for f, c in TRUE.items():
        assert best["coefficients"][f] == pytest.approx(c, rel=1e-6)
    assert best["validate_x"]["all"]["mape"] < 1e-6 and best["holdout"]["all"]["mape"] < 1e-6
    # without the term the one-sequence decodes are over-priced, the two-sequence ones under-priced
    base = rep["re-timed median, base"]["validate_x"]["decode"]
    assert base["mape"] > 0.02
    # fitted on single measurements with skewed noise, every kind is over-priced against the medians
    single = rep["single measurement, base+multi_token"]["validate_x"]
    assert all(single[k]["mean_signed"] > 0.03 for k in ("prefill", "decode", "mixed"))
    text = (folder / "ablation.md").read_text()
    assert "re-timed median, base+multi_token" in text and "`multi_token_step`" in text


def test_ablation_refuses_replay_samples_without_their_measurements(tmp_path) -> None:
    folder = _folder(tmp_path, np.random.default_rng(4))
    steps = pd.read_csv(folder / "calibration_steps.csv")
    steps.iloc[:-5].to_csv(folder / "calibration_steps.csv", index=False)
    with pytest.raises(ValueError, match="calibration_steps.csv"):
        main([str(folder)])
