"""A benchmark's ``--out`` folder (``benchmarks/bench_results.py``) is written like a run's: complete
with its marker or not at all, replaced whole by a rerun, and never over files it does not write."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_mooncake import target_verdicts, tier_verdicts
from bench_results import open_bench_folder

from sim.experiment.results_folder import ResultsError, require_complete

OURS = ("runs.json", "table.md").__contains__


def _write(out: Path, runs: list[dict]) -> Path:
    folder = open_bench_folder(str(out), OURS)
    assert folder is not None
    try:
        return folder.write({"runs.json": runs, "table.md": "| a |\n"}, {"benchmark": "test"})
    finally:
        folder.close()


def test_the_folder_is_complete_and_carries_its_provenance(tmp_path):
    out = _write(tmp_path / "bench", [{"cpu_s": 1.5}])
    meta = require_complete(out)
    assert meta["benchmark"] == "test" and meta["complete"] is True and meta["run_id"]
    assert {"git_commit", "versions", "cpu_count", "load_average_before", "load_average_after"} <= set(meta)
    assert json.loads((out / "runs.json").read_text()) == [{"cpu_s": 1.5}]
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "runs.json", "table.md"]


def test_a_rerun_replaces_it_whole_and_foreign_files_refuse(tmp_path):
    out = _write(tmp_path / "bench", [{"cpu_s": 1.5}])
    _write(out, [{"cpu_s": 2.5}])
    assert json.loads((out / "runs.json").read_text()) == [{"cpu_s": 2.5}]
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ResultsError, match=r"notes.txt"):
        open_bench_folder(str(out), OURS)
    assert (out / "notes.txt").read_text() == "keep me"


def test_without_out_nothing_is_opened():
    assert open_bench_folder(None, OURS) is None


def test_an_abandoned_run_leaves_no_folder(tmp_path):
    folder = open_bench_folder(str(tmp_path / "bench"), OURS)
    assert folder is not None
    folder.close()  # the benchmark failed before writing
    assert not (tmp_path / "bench").exists()


def test_the_mooncake_benchmark_says_whether_the_full_trace_targets_are_met():
    rows = [{"block_size": 16, "attribution": "off", "cpu_s": 5.9, "wall_s": 6.2},
            {"block_size": 512, "attribution": "off", "cpu_s": 2.9, "wall_s": 2.95},
            {"block_size": 512, "attribution": "full", "cpu_s": 9.0, "wall_s": 9.0},
            {"block_size": 64, "attribution": "off", "cpu_s": 1.0, "wall_s": 1.0}]
    assert target_verdicts(rows, full_trace=True) == [
        "block 16: 5.9 s CPU, 6.2 s wall (target: under 6 s: missed)",
        "block 512: 2.9 s CPU, 2.95 s wall (target: under 3 s: met)",
    ]
    assert target_verdicts(rows, full_trace=False) == []  # a --limit run, another GPU, no fast-forward


def test_the_blis_benchmark_says_whether_loading_is_under_a_quarter_of_blis_load_phase():
    from bench_vs_blis import _table

    row = {"blocks": 52001, "blis_cpu_s": 5.0, "apcsim_cpu_s": 1.8, "cpu_ratio": 0.36, "blis_wall_s": 4.9,
           "apcsim_wall_s": 1.8, "blis_rss_mib": 545.0, "apcsim_rss_mib": 157.0, "hits_equal": 4000, "common": 4000,
           "blis_load_wall_s": 1.5, "apcsim_load_wall_s": 0.32, "apcsim_load_cpu_s": 0.31, "load_ratio": 0.32 / 1.5}
    assert "| 52,001 | 1.50 | 0.32 | 0.21 (< 0.25: met) | 0.31 |" in _table([row], 3)
    slow = {**row, "apcsim_load_wall_s": 0.4, "load_ratio": 0.4 / 1.5}
    assert "| 52,001 | 1.50 | 0.40 | 0.27 (NOT < 0.25: missed) | 0.31 |" in _table([slow], 3)
    no_load = {k: v for k, v in row.items() if "load" not in k}  # a harness without a load phase: no loading table
    assert "loading the same input" not in _table([no_load], 3)


def test_load_time_reads_the_configs_whole_request_stream(tmp_path):
    import subprocess

    import numpy as np

    from workloads.trace_format import TraceRequest, write_trace

    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRequest(f"r{i}", float(i), np.arange(10 + i, dtype=np.int64), 4) for i in range(5)])
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"name": "lt", "engine": {"block_size": 16, "num_gpu_blocks": 64, "max_model_len": 512},
                               "latency": {"kind": "fixed", "step_time_s": 0.02},
                               "workload": {"kind": "trace", "path": str(trace)}}))
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "load_time.py"), str(cfg)],
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    got = json.loads(out.stdout)
    assert (got["requests"], got["prompt_tokens"]) == (5, sum(10 + i for i in range(5)))
    assert got["load_cpu_s"] >= 0 and got["load_wall_s"] >= 0 and got["import_cpu_s"] > 0


def test_the_sweep_benchmark_says_whether_the_48_points_ran_under_45_s():
    from bench_sweep import DEFAULT_SWEEP, target_verdict

    assert target_verdict(DEFAULT_SWEEP, 48, 48, 2000, 2, True, 15.5) == "target: under 45 s on 2 workers: met (15.5 s)"
    assert target_verdict(DEFAULT_SWEEP, 48, 48, 2000, 2, True, 45.2).endswith("missed (45.2 s)")
    assert target_verdict(DEFAULT_SWEEP, 48, 47, 2000, 2, True, 15.5).endswith("missed (1 of 48 points failed)")
    for other in [(DEFAULT_SWEEP, 48, 48, 0, 2, True), (DEFAULT_SWEEP, 48, 48, 2000, 4, True),
                  (DEFAULT_SWEEP, 48, 48, 2000, 2, False), (Path("other.yaml"), 48, 48, 2000, 2, True)]:
        assert target_verdict(*other, 15.5).endswith("not this run's setting")


def test_the_tier_verdict_compares_each_tiered_run_with_the_untiered_one():
    rows = [{"block_size": 16, "cpu_tier_gib": 0.0, "cpu_ratio": 1.0},
            {"block_size": 16, "cpu_tier_gib": 200.0, "cpu_ratio": 1.4},
            {"block_size": 16, "cpu_tier_gib": 400.0, "cpu_ratio": 2.25}]
    assert tier_verdicts(rows) == [
        "block 16, CPU tier 200 GiB: 1.4x the untiered CPU time (target: at most 1.5x: met)",
        "block 16, CPU tier 400 GiB: 2.25x the untiered CPU time (target: at most 1.5x: missed)",
    ]
