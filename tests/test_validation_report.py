"""The validation report's wording: statistics named for what they compare, no project-internal
references, and a suggested next step computed from the report's own figures (no torch needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from gpu_backend.validation.validation_report import HEADER, next_step, render_markdown

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference" / "cpu_tiny" / "validate_chat" / "report.json"


def _report() -> dict:
    return json.loads(REFERENCE.read_text())


def test_labels_are_unambiguous_and_no_issue_numbers():
    md = render_markdown(_report())
    assert HEADER in md and "err of P50" in md and "P50 err" not in md
    assert "Percentiles of the per-request error" in md
    assert "issue" not in md.lower() and "H200" not in md
    assert md.rstrip().splitlines()[-1] == next_step(_report())


def test_next_step_recalibrates_a_mispriced_step_kind():
    rep = _report()
    for v in rep["per_step"]["by_kind"].values():
        v["mean_signed"] = 0.02
    rep["per_step"]["by_kind"]["mixed"].update(n=27, mean_signed=-0.188)  # the largest bias of >= 10 steps
    rep["per_step"]["by_kind"]["prefill"].update(n=5, mean_signed=0.4)  # larger, but too few steps to say
    rep["model"]["path"] = "results/reference/cpu_tiny/model.json"
    step = next_step(rep)
    assert step.startswith("The model misprices mixed steps by -18.8 %")
    assert "--grid cpu" in step and "--out results/reference/cpu_tiny/model.json" in step
    rep["model"]["grid"] = "quick"
    assert "fitted on the quick grid" in next_step(rep)


def test_next_step_accepts_the_noise_floor_or_the_model():
    rep = _report()
    for v in rep["per_step"]["by_kind"].values():
        v["mean_signed"] = 0.02
    noisy = copy.deepcopy(rep)
    noisy["stats"]["ttft"]["sim_vs_real"]["mape"] = 0.278
    noisy["stats"]["ttft"]["noise"]["mape"] = 0.263
    assert "within the backend's own run-to-run noise" in next_step(noisy)
    good = copy.deepcopy(rep)
    good["stats"]["ttft"]["noise"]["mape"] = 0.01
    good["targets"]["all_met"] = True
    assert "meets the accuracy targets" in next_step(good) and "kind: fitted" in next_step(good)
    neither = copy.deepcopy(good)
    neither["targets"]["all_met"] = False
    assert next_step(neither).startswith("Recalibrate on this machine")
