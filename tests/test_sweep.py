"""Running sweeps: the tidy table, resume, kill -9 then resume, failing points, local vs Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.experiment.sweep import run_sweep
from sim.experiment.sweep_config import load_sweep
from sim.experiment.sweep_point import WALL_COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def _sweep(tmp_path: Path, *, name: str = "t", requests: int = 40, grid: dict | None = None, **extra) -> Path:
    data = {
        "name": name,
        "output_dir": str(tmp_path / "out"),
        "base": {
            "latency": {"kind": "fixed", "step_time_s": 0.01},
            "engine": {"max_model_len": 512, "max_num_batched_tokens": 512},
            "workload": {"kind": "synthetic_shared_prefix", "num_requests": requests, "num_prefixes": 3,
                         "prefix_tokens": 256, "suffix_tokens": 64, "output_tokens": 16, "rate": 20.0,
                         "tenants": {"num_tenants": 2}},
        },
        "grid": grid or {"engine.block_size": [16, 64], "engine.num_gpu_blocks": [40, 400]},
        **extra,
    }
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _stable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in WALL_COLUMNS if c in df]).reset_index(drop=True)


def test_table_has_axes_metrics_bounds(tmp_path):
    rep = run_sweep(_sweep(tmp_path), workers=1, progress=False)
    df = pd.read_parquet(rep.folder / "table.parquet")
    csv = pd.read_csv(rep.folder / "table.csv")
    assert len(df) == len(csv) == 4 and rep.ran == 4 and not rep.errors
    assert list(df.columns[:3]) == ["point", "engine.block_size", "engine.num_gpu_blocks"]
    for col in ("token_hit_rate", "request_hit_rate", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p99_s",
                "throughput_output_tokens_per_s", "prefix_cache.hits", "infinite_cache_hit_rate", "belady_hit_rate",
                "lru_sequential_hit_rate", "num_gpu_blocks", "capacity_tokens", "status", "key", "wall_time_s"):
        assert col in df, col
    assert (df["status"] == "ok").all()
    assert (df["belady_hit_rate"] <= df["infinite_cache_hit_rate"] + 1e-12).all()
    assert (df["lru_sequential_hit_rate"] <= df["belady_hit_rate"] + 1e-12).all()
    # the big pool never evicts here: the engine reaches the request-level bound
    big = df[df["engine.num_gpu_blocks"] == 400]
    assert (big["request_hit_rate"] - big["infinite_cache_hit_rate"]).abs().max() < 0.05
    # every point folder holds the run's files
    for key in df["key"]:
        names = {p.name for p in (rep.folder / "points" / key).iterdir()}
        assert {"row.json", "summary.json", "requests.parquet", "config.resolved.yaml", "meta.json"} <= names
        assert "steps.parquet" not in names  # only with keep_steps: true
    assert json.loads((rep.folder / "sweep.json").read_text())["axes"][0]["key"] == "engine.block_size"


def test_manifest_records_the_set_overrides(tmp_path):
    sweep = load_sweep(_sweep(tmp_path, grid={"engine.block_size": [16, 64]}), overrides=["workload.num_requests=5"])
    rep = run_sweep(sweep, workers=1, progress=False)
    manifest = json.loads((rep.folder / "sweep.json").read_text())
    assert manifest["overrides"] == ["workload.num_requests=5"] and manifest["complete"] is True
    assert (pd.read_parquet(rep.folder / "table.parquet")["num_requests"] == 5).all()


def test_resume_skips_finished_points(tmp_path):
    p = _sweep(tmp_path)
    first = run_sweep(p, workers=1, progress=False)
    rows = {k: (first.folder / "points" / k / "row.json").stat().st_mtime_ns for k in first.table["key"]}
    again = run_sweep(p, workers=1, progress=False)
    assert (again.ran, again.skipped) == (0, 4)
    assert rows == {k: (first.folder / "points" / k / "row.json").stat().st_mtime_ns for k in first.table["key"]}
    pd.testing.assert_frame_equal(_stable(first.table), _stable(again.table))
    # a grown sweep runs only the new points
    grown = _sweep(tmp_path, grid={"engine.block_size": [16, 64, 128], "engine.num_gpu_blocks": [40, 400]})
    third = run_sweep(grown, workers=1, progress=False)
    assert (third.ran, third.skipped) == (2, 4)
    before = (first.folder / "points" / first.table["key"][0] / "row.json").stat().st_mtime_ns
    forced = run_sweep(grown, workers=1, progress=False, resume=False)
    assert forced.ran == 6
    assert (first.folder / "points" / first.table["key"][0] / "row.json").stat().st_mtime_ns != before  # rewritten


def _bad_trace_grid(tmp_path: Path) -> dict:
    """A ``workload`` axis whose middle value fails only when it runs: its trace's line 2 is bad
    (a problem no validation before the run can see, unlike a pool too small for max_model_len)."""
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "arrival": 0, "tokens": [1, 2, 3], "output_tokens": 2}\n'
                                        '{"id": "b", "arrival": 1, "tokens": [1, 2], "output_tokens": -3}\n')
    ok = {"kind": "synthetic_shared_prefix", "num_requests": 20, "num_prefixes": 3, "prefix_tokens": 256,
          "suffix_tokens": 64, "output_tokens": 16, "rate": 20.0}
    return {"workload": {"ok": ok, "bad": {"kind": "trace", "path": "bad.jsonl"}, "ok2": {**ok, "num_requests": 30}}}


def test_failing_point_is_recorded_and_others_run(tmp_path):
    p = _sweep(tmp_path, grid=_bad_trace_grid(tmp_path))
    rep = run_sweep(p, workers=2, progress=False)
    df = rep.table
    assert df["status"].tolist() == ["ok", "error", "ok"]
    assert "bad.jsonl:2: field 'output_tokens'" in df.loc[1, "error"]
    assert [pt for pt, _ in rep.errors] == [1]
    err_dir = rep.folder / "points" / df.loc[1, "key"]
    assert "TraceFormatError" in (err_dir / "error.txt").read_text()
    assert json.loads((err_dir / "row.json").read_text())["status"] == "error"
    # a re-run retries the failed point only
    again = run_sweep(p, workers=1, progress=False)
    assert (again.ran, again.skipped, len(again.errors)) == (1, 2, 1)


def test_cli_exit_codes(tmp_path, capsys):
    from sim.cli.main import main

    p = _sweep(tmp_path, grid=_bad_trace_grid(tmp_path))
    assert main(["sweep", str(p), "--workers", "1", "--no-plots", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "1 failed" in out and "point 1: TraceFormatError" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "b", "base": {"workload": {"kind": "nope"}}}))
    assert main(["sweep", str(bad)]) == 2
    assert f"{bad}: " in capsys.readouterr().err
    # 4 blocks of 16 tokens cannot hold one max_model_len=512 sequence: refused before anything runs
    small = _sweep(tmp_path, name="small", grid={"engine.num_gpu_blocks": [400, 4]})
    assert main(["sweep", str(small), "--workers", "1", "--no-plots", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "grid.engine.num_gpu_blocks: a pool of 4 blocks" in err and "(point engine.num_gpu_blocks=4)" in err
    assert not (tmp_path / "out" / "small").exists()


def test_kill_9_mid_sweep_then_resume(tmp_path):
    """kill -9 the whole sweep (driver and workers) mid-way: finished points stay, none is half
    written, the resumed sweep runs only the missing ones and gives the same table as a clean run."""
    grid = {"engine.block_size": [16, 32], "seed": [0, 1, 2, 3, 4, 5]}
    p = _sweep(tmp_path, name="k", requests=300, grid=grid)
    sweep = load_sweep(p)
    points = sweep.folder() / "points"
    cmd = [sys.executable, "-m", "sim.cli.main", "sweep", str(p), "--workers", "2", "--no-plots", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            done = [d for d in points.glob("*") if not d.name.startswith(".")] if points.is_dir() else []
            if len(done) >= 3:
                break
            assert proc.poll() is None, "the sweep finished before it could be killed; make points slower"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    finished = {d.name for d in points.iterdir() if not d.name.startswith(".")}
    assert 3 <= len(finished) < len(sweep.points)
    for name in finished:  # complete folders only
        row = json.loads((points / name / "row.json").read_text())
        assert row["status"] == "ok" and (points / name / "requests.parquet").is_file()
    stamps = {n: (points / n / "row.json").stat().st_mtime_ns for n in finished}
    resumed = run_sweep(p, workers=2, progress=False)
    assert resumed.skipped == len(finished)
    assert resumed.ran == len(sweep.points) - len(finished)
    assert stamps == {n: (points / n / "row.json").stat().st_mtime_ns for n in finished}  # not recomputed
    assert not [d for d in points.iterdir() if d.name.startswith(".")]  # leftovers cleaned
    assert sorted(d.name for d in points.iterdir()) == sorted(pt.key for pt in sweep.points)  # no duplicates
    clean = run_sweep(p, workers=1, progress=False, output_dir=str(tmp_path / "clean"))
    pd.testing.assert_frame_equal(_stable(resumed.table), _stable(clean.table))


def test_local_and_ray_give_the_same_table(tmp_path):
    pytest.importorskip("ray")
    p = _sweep(tmp_path, name="r", requests=20,
               grid={"engine.block_size": [16, 64], "workload.tenants.salt": ["none", "per_tenant"]})
    local = run_sweep(p, workers=2, progress=False, output_dir=str(tmp_path / "local"))
    ray_rep = run_sweep(p, workers=2, ray=True, progress=False, output_dir=str(tmp_path / "ray"))
    assert ray_rep.ran == 4 and not ray_rep.errors
    pd.testing.assert_frame_equal(_stable(local.table), _stable(ray_rep.table))
    for key in local.table["key"]:  # the per-request tables too
        a = pd.read_parquet(local.folder / "points" / key / "requests.parquet")
        b = pd.read_parquet(ray_rep.folder / "points" / key / "requests.parquet")
        pd.testing.assert_frame_equal(a, b)


def test_keep_steps(tmp_path):
    rep = run_sweep(_sweep(tmp_path, grid={"seed": [0]}, keep_steps=True), workers=1, progress=False)
    steps = pd.read_parquet(rep.folder / "points" / rep.table["key"][0] / "steps.parquet")
    assert len(steps) == rep.table["num_steps"][0]
