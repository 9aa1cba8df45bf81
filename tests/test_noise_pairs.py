"""The noise floor of a validation is taken over every pair of real runs, not one.

One pair of real runs is one draw of the backend's run-to-run spread: in the committed CPU
reference, real run 2 landed within 0.3 % of run 1 on the chat TTFT P50 while run 3 landed 6.4 %
away, so bounds built on run 2 alone were the 5 % floor. These tests pin the statistic (the median
over the pairs, of magnitudes for the signed errors), the targets built on it, and the re-scoring of
a report folder from its own ``pairs.csv``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_backend.validation import latency_error as lerr
from gpu_backend.validation.rescore import rescore

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference" / "cpu_tiny"


def _pairs(n: int = 60, seed: int = 0) -> pd.DataFrame:
    """Simulated and three real runs: run 2 is run 1 within 1 %, run 3 is 30 % slower."""
    rng = np.random.default_rng(seed)
    real1 = rng.uniform(0.01, 0.05, n)
    runs = {"sim": real1 * rng.uniform(0.9, 1.2, n), "real1": real1, "real2": real1 * rng.uniform(0.99, 1.01, n),
            "real3": real1 * 1.3}
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival": np.arange(n, dtype=float)})
    for k, v in runs.items():
        for m in lerr.METRICS:
            df[f"{m}_{k}"] = v
        df[f"hit_tokens_{k}"] = 0
    return df


def test_noise_is_the_median_over_every_pair_of_real_runs() -> None:
    stats = lerr.summarize_pairs(_pairs(), 3)
    for m in lerr.METRICS:
        e = stats[m]
        assert set(e["noise_pairs"]) == {"real2_vs_real1", "real3_vs_real1", "real3_vs_real2"}
        assert e["noise_real2_vs_real1"] == e["noise_pairs"]["real2_vs_real1"]
        pairs = list(e["noise_pairs"].values())
        assert e["noise"]["num_pairs"] == 3
        assert e["noise"]["mape"] == pytest.approx(np.median([p["mape"] for p in pairs]))
        assert e["noise"]["p50_err"] == pytest.approx(np.median([abs(p["p50_err"]) for p in pairs]))
        assert e["noise"]["p99_err"] >= 0  # a magnitude: run 2 vs run 3 is negative, the median is not
        # the lucky pair is small, the median is not
        assert e["noise_pairs"]["real2_vs_real1"]["mape"] < 0.01 < 0.2 < e["noise"]["mape"]
        assert set(e["sim_vs_reals"]) == {"real1", "real2", "real3"}
        assert e["sim_vs_reals"]["real1"] == e["sim_vs_real"]


def test_targets_are_bounded_by_the_noise_over_pairs() -> None:
    stats = lerr.summarize_pairs(_pairs(), 3)
    per_step = {"by_kind": {"decode": {"mape": 0.05}}}
    t = lerr.targets(stats, per_step)
    nz = stats["ttft"]["noise"]
    assert t["ttft_mape"]["bound"] == pytest.approx(1.2 * nz["mape"])
    assert t["ttft_p50"]["bound"] == pytest.approx(max(0.05, nz["p50_err"]))
    # with run 2 alone the bound would have been the 5 % floor
    assert abs(stats["ttft"]["noise_real2_vs_real1"]["p50_err"]) < 0.05 < t["ttft_p50"]["bound"]


def test_two_runs_keep_the_single_pair() -> None:
    stats = lerr.summarize_pairs(_pairs().drop(columns=[c for c in _pairs().columns if c.endswith("real3")]), 2)
    one = stats["e2e"]["noise_real2_vs_real1"]
    assert stats["e2e"]["noise"]["num_pairs"] == 1
    assert stats["e2e"]["noise"]["mape"] == one["mape"]
    assert stats["e2e"]["noise"]["p99_err"] == abs(one["p99_err"])
    assert lerr.noise_over_pairs([]) == {"num_pairs": 0}


@pytest.mark.parametrize("workload", ["validate_chat", "validate_rag"])
def test_rescore_recomputes_statistics_only(tmp_path: Path, workload: str) -> None:
    src = REFERENCE / workload
    for f in ("report.json", "pairs.csv"):
        shutil.copy(src / f, tmp_path / f)
    old = json.loads((tmp_path / "report.json").read_text())
    new = rescore(tmp_path)
    for key in ("per_step", "real_summaries", "sim_summary", "real_wall_s", "git_commit", "versions", "config"):
        assert new[key] == old[key]  # every measurement is kept as it was
    pairs = pd.read_csv(tmp_path / "pairs.csv")
    assert new["stats"] == json.loads(json.dumps(lerr.summarize_pairs(pairs, old["num_real_runs"])))
    assert new["stats"]["ttft"]["noise"]["num_pairs"] == 3
    assert new["rescored"]["targets_met_after"].endswith("of 9")
    md = (tmp_path / "report.md").read_text()
    assert "the median over the 3 pairs of real runs" in md and "| real 3 vs real 1 |" in md
    again = rescore(tmp_path)
    assert again["stats"] == new["stats"] and again["targets"] == new["targets"]
